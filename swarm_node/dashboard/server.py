"""Serving the page: a WSGI app (the page, its JS, its JSON) on the standard library's threading server.

The same server type prometheus_client uses for /metrics, so a node serves both from one port: `/` the page
and `/metrics` Prometheus' text (`serve(..., metrics_app=prometheus_client.make_wsgi_app(registry))`).
Nothing on the page comes from the network: the charts are uPlot's, a 51 KB file copied from its npm package
into vendor/ (scripts/vendor-uplot.sh, checksums in vendor/VENDOR.txt).

The app answers only a fixed set of paths and reads only the files of the dirs it was started with; a
request takes no path or file name from the client. A failure while building the data answers 500 with
one line (and logs it once per distinct message); it never takes the serving process down.
"""

from __future__ import annotations

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


class DashboardApp:
    """WSGI app: `/` (the page), its scripts and styles, `/api/data` (JSON), `/metrics` when given one."""

    def __init__(self, watcher: RunWatcher, metrics_app: WSGIApp | None = None):
        self.watcher = watcher
        self.metrics_app = metrics_app
        here = resources.files(__package__)
        self._static = {path: (here.joinpath(name).read_bytes(), ctype) for path, (name, ctype) in STATIC.items()}
        self._logged: set[str] = set()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
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
    """One thread per request (a slow browser never blocks /metrics); threads die with the process."""

    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    """No access log line per request on the node's stderr (the page polls every few seconds)."""

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
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else ("127.0.0.1" if host in ("", "0.0.0.0") else host)
    return server, f"http://{shown}:{bound}/"


def serve_dirs(dirs: list[Path], port: int, *, host: str = "127.0.0.1", what: str = "dashboard",
               swarm=None, metrics_app: WSGIApp | None = None, title: str | None = None,
               warm_up: bool = False) -> tuple[_Server, str]:
    """The page over these run dirs (and `/metrics` when given Prometheus' WSGI app), served from a thread.

    warm_up: read the files at once rather than at the first page load (a viewer of long runs; a node does
    not, so nobody watching costs it nothing).
    """
    watcher = RunWatcher(dirs, swarm=swarm, title=title)
    served = serve(DashboardApp(watcher, metrics_app), host, port, what,
                   "/metrics" if metrics_app is not None else "the dashboard")
    if warm_up:
        watcher.warm_up()
    return served


def stop(server: _Server) -> None:
    server.shutdown()
    server.server_close()
