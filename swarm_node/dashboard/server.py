"""Serving the page: a WSGI app (the page, its JS, its JSON) on the standard library's threading server.

The same server type prometheus_client uses for /metrics, so a node serves both from one port: `/` the page
and `/metrics` Prometheus' text (`serve(..., metrics_app=prometheus_client.make_wsgi_app(registry))`).
Nothing on the page comes from the network: the charts are uPlot's, a 51 KB file copied from its npm package
into vendor/ (scripts/vendor-uplot.sh, checksums in vendor/VENDOR.txt).

The app answers only a fixed set of paths and reads only the files of the dirs it was started with; a
request takes no path or file name from the client. A failure while building the data answers 500 with
one line (and logs it once per distinct message); it never takes the serving process down.

What a web page in the operator's browser cannot do: read `/api/data` or `/metrics` by DNS rebinding (a
name the attacker controls, re-pointed at 127.0.0.1 or this machine). Such a request names the attacker's
host in its Host header, and only hosts this server answers to are served (`HostCheck`; others get 421).
What a client on the network cannot do: hold threads. A connection that sends nothing for
`REQUEST_TIMEOUT_S` is closed, and beyond `MAX_CONNECTIONS` open at once a new one is closed at once.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from importlib import resources
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from swarm_node.dashboard.data import RunWatcher
from swarm_node.errors import UserFacingError

log = logging.getLogger(__name__)

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]
STATIC = {  # path -> (file in this package, content type)
    "/": ("page.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
}
VENDORED = ("/uPlot.iife.min.js", "/uPlot.min.css")  # never change between releases: cacheable
REQUEST_TIMEOUT_S = 30.0  # a connection silent this long is closed (a half-open one would hold its thread)
MAX_CONNECTIONS = 64  # connections served at once (one thread each); more are closed at once
WILDCARDS = ("", "0.0.0.0", "::")


class HostCheck:
    """Which Host headers a server bound to `bound` answers: the DNS-rebinding guard.

    Allowed: any IP address literal (a rebinding page can only name its own domain, never an address:
    a request naming an address reached us at that address, e.g. a scraper through a port forward),
    `localhost`, the name the server was bound to, this machine's host names when bound to every interface,
    and the names in `extra` (e.g. a DNS name a Prometheus scrapes the node by). A request without a Host
    header (HTTP/1.0 tools) is allowed: browsers always send one.
    """

    def __init__(self, bound: str, extra: list[str] | tuple[str, ...] = ()) -> None:
        names = {"localhost", *(_norm(n) for n in extra)}
        if bound not in WILDCARDS and not _is_address(bound):
            names.add(_norm(bound))
        if bound in WILDCARDS:
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    names.add(_norm(name))
        self.names = frozenset(names)

    def allows(self, host_header: str | None) -> bool:
        if host_header is None:
            return True
        host = _host_part(host_header)
        return host is not None and (_is_address(host) or _norm(host) in self.names)


def _norm(name: str) -> str:
    return name.strip().rstrip(".").lower()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_part(header: str) -> str | None:
    """The host of a Host header (`name`, `name:port`, `1.2.3.4:port`, `[v6]:port`); None if malformed."""
    header = header.strip()
    if header.startswith("["):
        end = header.find("]")
        rest = header[end + 1:] if end > 0 else "x"
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return header[1:end]
    host, _, port = header.partition(":")
    if port and not port.isdigit() or not host:
        return None
    return host


class DashboardApp:
    """WSGI app: `/` (the page), its scripts and styles, `/api/data` (JSON), `/metrics` when given one."""

    def __init__(self, watcher: RunWatcher, metrics_app: WSGIApp | None = None, hosts: HostCheck | None = None):
        self.watcher = watcher
        self.metrics_app = metrics_app
        self.hosts = hosts or HostCheck("127.0.0.1")
        self.refused_hosts = 0
        here = resources.files(__package__)
        self._static = {path: (here.joinpath(name).read_bytes(), ctype) for path, (name, ctype) in STATIC.items()}
        self._logged: set[str] = set()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if not self.hosts.allows(environ.get("HTTP_HOST")):
            self.refused_hosts += 1
            host = str(environ.get("HTTP_HOST"))[:100]
            if len(self._logged) < 100 and f"host:{host}" not in self._logged:
                self._logged.add(f"host:{host}")
                log.warning("refused a request for host %r (not one this server answers to: a web page trying "
                            "DNS rebinding, or a name to add to metrics.allowed_hosts)", host)
            return self._send(start_response, "421 Misdirected Request",
                              b"this server does not answer to that host name\n", "text/plain")
        if path == "/metrics" and self.metrics_app is not None:
            return self.metrics_app(environ, start_response)
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return self._send(start_response, "405 Method Not Allowed", b"GET only\n", "text/plain")
        if path in self._static:
            body, ctype = self._static[path]
            return self._send(start_response, "200 OK", body, ctype,
                              cache="max-age=86400" if path in VENDORED else "no-cache")
        if path == "/api/data":
            try:
                body = self.watcher.document()
            except Exception as exc:  # one line to the page and the log; the server keeps serving
                msg = f"building the page's data failed: {type(exc).__name__}: {exc}".splitlines()[0]
                if msg not in self._logged and len(self._logged) < 100:
                    self._logged.add(msg)
                    log.exception(msg)
                return self._send(start_response, "500 Internal Server Error",
                                  json.dumps({"error": msg}).encode(), "application/json")
            return self._send(start_response, "200 OK", body, "application/json", cache="no-store")
        return self._send(start_response, "404 Not Found", b"not found\n", "text/plain")

    @staticmethod
    def _send(start_response: Callable, status: str, body: bytes, ctype: str, cache: str = "no-cache"):
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body))),
                                ("Cache-Control", cache), ("X-Content-Type-Options", "nosniff")])
        return [body]


class _Server(ThreadingMixIn, WSGIServer):
    """One thread per connection (a slow browser never blocks /metrics), at most MAX_CONNECTIONS at once;
    threads die with the process."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 makes a burst of clients wait 1 s to connect)

    def server_activate(self) -> None:
        super().server_activate()
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.turned_away = 0  # connections closed at once: MAX_CONNECTIONS were open

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            self.turned_away += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address) -> None:
        """A client that timed out or hung up is no error of ours: no traceback on the node's stderr."""
        import sys

        if isinstance(sys.exc_info()[1], OSError):
            log.debug("connection from %s ended: %s", client_address, sys.exc_info()[1])
            return
        super().handle_error(request, client_address)


class _QuietHandler(WSGIRequestHandler):
    """No access log line per request on the node's stderr (the page polls every few seconds); a connection
    silent for REQUEST_TIMEOUT_S is closed."""

    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        pass


def serve(app: WSGIApp, host: str, port: int, what: str, serving: str = "the dashboard") -> tuple[_Server, str]:
    """Start serving in a daemon thread; (server, page URL). A port in use is one clear UserFacingError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(_Server):
        address_family = family

    try:
        server = make_server(host, port, app, server_class=Server, handler_class=_QuietHandler)
    except OSError as exc:
        reason = "already in use by another process" if exc.errno in (98, 48, 10048) else (exc.strerror or str(exc))
        raise UserFacingError(f"{what}: cannot serve {serving} on {host}:{port} ({reason}); pick a free port") \
            from None
    threading.Thread(target=server.serve_forever, name=f"serve-{port}", daemon=True).start()
    address, bound = server.server_address[:2]
    shown = host if host not in WILDCARDS else address  # what it listens on: 0.0.0.0 is every interface
    shown = f"[{shown}]" if ":" in shown else shown
    return server, f"http://{shown}:{bound}/"


def serve_dirs(dirs: list[Path], port: int, *, host: str = "127.0.0.1", what: str = "dashboard",
               swarm=None, metrics_app: WSGIApp | None = None, title: str | None = None,
               warm_up: bool = False, allowed_hosts: list[str] | tuple[str, ...] = ()) -> tuple[_Server, str]:
    """The page over these run dirs (and `/metrics` when given Prometheus' WSGI app), served from a thread.

    warm_up: read the files at once rather than at the first page load (a viewer of long runs; a node does
    not, so nobody watching costs it nothing). allowed_hosts: host names to answer besides HostCheck's own.
    """
    watcher = RunWatcher(dirs, swarm=swarm, title=title)
    served = serve(DashboardApp(watcher, metrics_app, HostCheck(host, allowed_hosts)), host, port, what,
                   "/metrics" if metrics_app is not None else "the dashboard")
    if warm_up:
        watcher.warm_up()
    return served


def stop(server: _Server) -> None:
    server.shutdown()
    server.server_close()
