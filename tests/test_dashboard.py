"""The dashboard without a browser: reading metrics files as they grow, the page's JSON, the server, the command.

The numbers on the page are the report's (one function); bad input (missing or empty dirs, a line being
written, a line that is not JSON, a file rewritten by a resumed node, a port in use) is one line on the page
or one error line, never a traceback; a node's --metrics-port serves the page beside /metrics.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from swarm_node.cli import main
from swarm_node.dashboard.data import RunWatcher
from swarm_node.dashboard.server import DashboardApp, serve, serve_dirs, stop
from swarm_node.dashboard.summary import part_accuracies, peer_series, peer_summary, rolling, thin, time_keys
from swarm_node.dashboard.tail import MetricsTail
from swarm_node.node.metrics import MetricsWriter, read_metrics

ROOT = Path(__file__).resolve().parents[1]


def grpo_rows(n: int, peer: str = "tiny-s") -> list[dict]:
    rows = [{"round": 0, "reward_mean": None, "eval_accuracy": 0.2, "local_groups": 0, "external_groups": 0,
             "filtered": 0, "model": {"name": peer}, "time": time.time()}]
    for r in range(1, n + 1):
        rows.append({"round": r, "reward_mean": 0.1 * (r % 4), "local_groups": 4, "external_groups": 2,
                     "filtered": r % 3, "kept": 10, "mean_ratio_external": 1.0 + 0.01 * r, "mean_ratio_local": 1.0,
                     "gen_s": 0.5, "train_s": 0.25, "collect_s": 0.01, "bytes_out": 1000, "bytes_in": 2000,
                     "external_groups_by_peer": {"12D3KooWpeer": 2}, "rejected": {"stale": 1} if r == 3 else {},
                     "eval_accuracy": 0.2 + 0.01 * r if r % 2 == 0 else None, "time": time.time()})
    return rows


def write(path: Path, rows: list[dict], tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as res:
            return res.status, res.read(), res.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


# ---- reading files as they grow ---------------------------------------------------------------------------


def test_tail_reads_only_complete_lines_and_survives_rewrites(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.poll() is False and tail.rows == []  # no file yet: no rows, no error
    rows = grpo_rows(3)
    half = json.dumps(rows[3])
    write(path, rows[:3], tail=half[:20])  # the node is writing round 3's line
    assert tail.poll() is True
    assert [r["round"] for r in tail.rows] == [0, 1, 2] and tail.pending_bytes == 20 and not tail.bad_lines
    with open(path, "a") as fh:
        fh.write(half[20:] + "\n")
    tail.poll()
    assert [r["round"] for r in tail.rows] == [0, 1, 2, 3] and tail.pending_bytes == 0
    with open(path, "a") as fh:  # a crash cut a line short, the restarted node appended after it
        fh.write('{"round": 4, "rew\n' + json.dumps({"round": 4}) + "\n")
    tail.poll()
    assert [r["round"] for r in tail.rows] == [0, 1, 2, 3, 4] and tail.bad_lines == [5]
    version = tail.version
    assert tail.poll() is False and tail.version == version  # nothing new: nothing recomputed
    # a resume from an older checkpoint rewrites the file with fewer rows (MetricsWriter.truncate_after)
    MetricsWriter(tmp_path).truncate_after(1)
    assert tail.poll() is True and [r["round"] for r in tail.rows] == [0, 1] and tail.bad_lines == []
    path.unlink()
    assert tail.poll() is True and tail.rows == []


def test_tail_skips_json_that_is_no_row(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write(path, grpo_rows(1), tail='[1, 2]\n"text"\n{"round": "seven"}\n' + "x" * 100 + "\n")
    tail = MetricsTail(path)
    tail.poll()
    assert [r["round"] for r in tail.rows] == [0, 1] and tail.bad_lines == [3, 4, 5, 6]


def test_tail_matches_read_metrics_on_a_whole_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write(path, grpo_rows(20), tail='{"round": 21, "cut')
    tail = MetricsTail(path)
    tail.poll()
    assert tail.rows == read_metrics(path, warn=False)


def test_tail_decodes_chunks_of_lines_as_it_would_line_by_line(tmp_path):
    """Lines are decoded a chunk per call; a chunk holding a bad line is decoded again line by line, so the
    rows and the numbered bad lines are exactly those of a plain line-by-line read, whatever the chunk."""
    import gc

    from swarm_node.dashboard.tail import DECODE_CHUNK_LINES

    two = 2 * DECODE_CHUNK_LINES + 4  # the last line, alone with good lines in its chunk: the count check finds it
    odd = {3: b'{"round": 3, "eval_hits": [1, 0', two: b'{"round": 5}, {"round": 6}', 9: b"",
           10: b'{"round": 10, "x": NaN}', 12: b'{"round": 12, "name": "\xff"}', 13: b"[1, 2]",
           DECODE_CHUNK_LINES + 2: b'{"round": 99, "cut": "a', DECODE_CHUNK_LINES + 3: b"   "}
    lines = [odd.get(i, json.dumps({"round": i, "v": i / 7}).encode()) for i in range(1, 2 * DECODE_CHUNK_LINES + 5)]
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    want_rows, want_bad = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode(), parse_constant=lambda _: None)
        except (json.JSONDecodeError, UnicodeDecodeError):
            row = None
        if isinstance(row, dict):
            want_rows.append(row)
        else:
            want_bad.append(n)
    tail = MetricsTail(path)
    assert gc.isenabled()
    tail.poll()
    assert gc.isenabled()  # the collector paused for the read only
    assert tail.bad_lines == want_bad == [3, 12, 13, DECODE_CHUNK_LINES + 2, two]
    assert tail.rows == want_rows and tail.rows[7] == {"round": 10, "x": None}
    assert len(tail.rows) == len(lines) - 7


# ---- the numbers --------------------------------------------------------------------------------------------


def test_series_are_the_reports_numbers_plus_what_the_page_plots():
    rows = grpo_rows(10)
    s = peer_series(rows)
    assert s["round"] == 10 and s["series"]["accuracy"] == peer_summary(rows)["accuracy_curve"]
    mean, _ = rolling([r["reward_mean"] for r in rows[1:]])
    assert s["reward_rolling"] == pytest.approx(mean[-1])
    filtered = sum(r % 3 for r in range(1, 11))
    assert s["filtered_share"] == pytest.approx(filtered / (filtered + 100))
    assert s["series"]["filtered_share"][0] == (1, pytest.approx(1 / 11))
    assert s["mean_ratio_external"] == pytest.approx(1.055)
    assert s["time_split_mean"] == pytest.approx({"gen_s": 0.5, "train_s": 0.25, "collect_s": 0.01})
    rows[2]["tokens_per_s"] = 900.0
    assert time_keys(rows) == ["gen_s", "train_s", "collect_s"]  # no timestamp ("time"), no rate (tokens_per_s)


def test_rolling_matches_the_plain_trailing_window():
    values = [0.3, 0.9, 0.0, 0.5, 1.0, 0.2, 0.7, 0.1]
    mean, std = rolling(values, k=3)
    for i in range(len(values)):
        window = values[max(0, i - 2): i + 1]
        assert mean[i] == pytest.approx(sum(window) / len(window))
        assert std[i] == pytest.approx(float(__import__("numpy").std(window)))
    assert rolling([])[0].size == 0


def test_per_part_accuracy_keys_are_found_whatever_their_shape():
    rows = [{"round": 0, "eval_accuracy": 0.5, "eval_n": 40, "eval_accuracy/add": 0.6, "eval_acc_part/mul": 0.4},
            {"round": 5, "eval_accuracy": 0.7, "eval_accuracy_by_part": {"add": 0.8, "mul": 0.6, "bad": "x"},
             "eval_accuracy_by_part_n": 20}]
    assert part_accuracies(rows) == {"add": [(0, 0.6), (5, 0.8)], "mul": [(0, 0.4), (5, 0.6)]}
    assert peer_series(rows)["parts_last"] == {"add": 0.8, "mul": 0.6}
    # the shape the task-parts work (issue 21) writes: eval_acc_parts: {part: accuracy}
    rows = [{"round": 0, "eval_accuracy": 0.5, "eval_acc_parts": {"add": 0.7, "signed": 0.1}},
            {"round": 3, "eval_accuracy": None}, {"round": 5, "eval_acc_parts": {"add": 0.9, "signed": 0.2}}]
    assert peer_series(rows)["series"]["parts"] == {"add": [(0, 0.7), (5, 0.9)], "signed": [(0, 0.1), (5, 0.2)]}
    assert part_accuracies(grpo_rows(4)) == {}


def test_thin_keeps_the_last_point():
    pts = [(i, i) for i in range(10_001)]
    out = thin(pts, 2000)
    assert len(out) <= 2001 and out[0] == (0, 0) and out[-1] == (10_000, 10_000)
    assert thin(pts[:5], 2000) == pts[:5]


# ---- the page's JSON ----------------------------------------------------------------------------------------


def test_document_of_a_demo_dir_and_its_problems(tmp_path):
    demo = tmp_path / "demo"
    for arm in ("swarm", "alone"):
        write(demo / arm / "tiny-s" / "metrics.jsonl", grpo_rows(6))
        write(demo / arm / "tiny-m" / "metrics.jsonl", grpo_rows(4, "tiny-m"), tail="not json\n{\"round\"")
    missing, empty = tmp_path / "later", tmp_path / "empty"
    empty.mkdir()
    watcher = RunWatcher([demo, missing, empty], min_poll_s=0)
    doc = json.loads(watcher.document())
    peers = {(p["arm"], p["name"]): p for p in doc["peers"]}
    assert set(peers) == {(a, n) for a in ("swarm", "alone") for n in ("tiny-s", "tiny-m")}
    assert peers[("swarm", "tiny-s")]["summary"] == json.loads(json.dumps(peer_summary(grpo_rows(6))))
    assert peers[("swarm", "tiny-m")]["writing"] is True and peers[("swarm", "tiny-m")]["round"] == 4
    assert peers[("swarm", "tiny-s")]["model"] == "tiny-s"
    problems = doc["problems"]
    assert any(str(missing) in p and "no such directory" in p for p in problems)
    assert any(str(empty) in p and "no metrics.jsonl yet" in p for p in problems)
    assert any("tiny-m" in p and "line 6 not valid JSON; skipped" in p for p in problems)
    assert len(problems) == 4 and all("\n" not in p for p in problems)
    # the missing dir appears, a new round lands: the next document shows both
    write(missing / "metrics.jsonl", grpo_rows(2, "later"))
    with open(demo / "swarm" / "tiny-s" / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"round": 7, "reward_mean": 1.0, "eval_accuracy": 0.9}) + "\n")
    doc = json.loads(watcher.document())
    peers = {(p["dir"], p["arm"], p["name"]): p for p in doc["peers"]}
    assert peers[("demo", "swarm", "tiny-s")]["summary"]["end_accuracy"] == 0.9
    assert peers[("later", "node", "later")]["round"] == 2
    assert not any("no such directory" in p for p in doc["problems"])


def test_document_is_strict_json_with_nan_and_odd_rows(tmp_path):
    rows = grpo_rows(3) + [{"round": 4, "mean_ratio_external": float("nan"), "reward_mean": float("inf")}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # Python writes NaN/Infinity tokens
    doc = RunWatcher([tmp_path], min_poll_s=0).document().decode()
    assert "NaN" not in doc and "Infinity" not in doc
    json.loads(doc, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


# ---- the server -----------------------------------------------------------------------------------------


def test_server_serves_page_assets_and_data_offline(tmp_path):
    write(tmp_path / "swarm" / "tiny-s" / "metrics.jsonl", grpo_rows(4))
    server, url = serve_dirs([tmp_path], 0, what="test")
    try:
        status, page, ctype = get(url)
        assert status == 200 and ctype.startswith("text/html")
        html = page.decode()
        assert "http://" not in html and "https://" not in html and "//cdn" not in html  # nothing from the network
        for asset in ("dashboard.js", "dashboard.css", "uPlot.iife.min.js", "uPlot.min.css"):
            assert f'"{asset}"' in html
            status, body, _ = get(url + asset)
            assert status == 200 and len(body) > 100, asset
        js = get(url + "dashboard.js")[1].decode()
        assert "innerHTML" not in js and "http" not in js  # text goes in as text; nothing fetched from elsewhere
        uplot = get(url + "uPlot.iife.min.js")[1]
        assert b"fetch(" not in uplot and b"XMLHttpRequest" not in uplot  # the chart library loads nothing either
        status, body, ctype = get(url + "api/data")
        assert status == 200 and ctype == "application/json"
        assert [p["name"] for p in json.loads(body)["peers"]] == ["tiny-s"]
        assert get(url + "etc/passwd")[0] == 404 and get(url + "../metrics.jsonl")[0] == 404
        req = urllib.request.Request(url + "api/data", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=10)
        assert exc.value.code == 405
    finally:
        stop(server)


def test_a_failure_building_the_data_is_one_line_and_the_server_keeps_serving(tmp_path, caplog):
    class Broken(RunWatcher):
        calls = 0

        def document(self) -> bytes:
            Broken.calls += 1
            if Broken.calls == 1:
                raise ValueError("bad row\nsecond line")
            return super().document()

    write(tmp_path / "metrics.jsonl", grpo_rows(2))
    server, url = serve(DashboardApp(Broken([tmp_path])), "127.0.0.1", 0, "test")
    try:
        status, body, _ = get(url + "api/data")
        assert status == 500 and json.loads(body) == {"error": "building the page's data failed: ValueError: bad row"}
        status, body, _ = get(url + "api/data")
        assert status == 200 and json.loads(body)["peers"][0]["round"] == 2
    finally:
        stop(server)


def test_node_metrics_port_serves_the_page_beside_metrics(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w = MetricsWriter(tmp_path / "me", prometheus_port=port, node_name="me")
    try:
        for row in grpo_rows(3, "me"):
            w.write(row)
        assert w.page_url == f"http://127.0.0.1:{port}/"
        assert get(w.page_url)[0] == 200 and b"swarm-node" in get(w.page_url)[1]
        doc = json.loads(get(w.page_url + "api/data")[1])
        assert doc["title"] == "me" and [(p["arm"], p["name"], p["round"]) for p in doc["peers"]] == [("node", "me", 3)]
        body = get(w.page_url + "metrics")[1].decode()
        assert 'swarm_node_round{node="me"} 3.0' in body and "# TYPE swarm_node_rounds_total counter" in body
    finally:
        w.close()


def _get_as(url: str, host: str | None) -> int:
    """Status of a GET of `url` with this Host header (None: none at all), as a DNS-rebinding page's request
    reaches the server: the browser connects to our address but names the attacker's host."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.putrequest("GET", u.path or "/", skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        res = conn.getresponse()
        res.read()
        return res.status
    finally:
        conn.close()


def test_a_request_naming_another_host_is_refused_so_dns_rebinding_reads_nothing(tmp_path, caplog):
    """/api/data (paths, peer ids) and /metrics answer only to hosts the server is reached by: localhost,
    IP addresses, the bound name, configured names. Another name (what a rebinding page sends) gets 421."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w = MetricsWriter(tmp_path / "me", prometheus_port=port, node_name="me", allowed_hosts=["scrape.example"])
    try:
        w.write(grpo_rows(1, "me")[0])
        url = w.page_url
        for path in ("api/data", "metrics", ""):
            assert _get_as(url + path, f"attacker.example:{port}") == 421, path
            assert _get_as(url + path, "attacker.example") == 421, path
        assert _get_as(url + "api/data", f"localhost.attacker.example:{port}") == 421
        assert _get_as(url + "api/data", "127.0.0.1:80@attacker.example") == 421  # malformed: refused
        for ok in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", f"[::1]:{port}", f"10.1.2.3:{port}",
                   f"scrape.example:{port}", None):
            assert _get_as(url + "api/data", ok) == 200, ok
            assert _get_as(url + "metrics", ok) == 200, ok
    finally:
        w.close()
    refused = [r.getMessage() for r in caplog.records if "refused a request for host" in r.getMessage()]
    assert len(refused) == 4, refused  # once per distinct host


def test_half_open_connections_are_closed_and_cannot_grow_threads(tmp_path, monkeypatch, capfd):
    """Clients that connect and send nothing: each is closed after the request timeout (no traceback), and
    beyond MAX_CONNECTIONS a new one is closed at once, so the server's threads stay bounded."""
    import threading

    from swarm_node.dashboard import server as srv

    monkeypatch.setattr(srv._QuietHandler, "timeout", 2.0)
    monkeypatch.setattr(srv, "MAX_CONNECTIONS", 8)
    write(tmp_path / "metrics.jsonl", grpo_rows(2))
    server, url = serve_dirs([tmp_path], 0, what="test")
    port = server.server_address[1]
    base = threading.active_count()
    socks = []
    try:
        for _ in range(20):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        assert threading.active_count() <= base + 8  # no more than the cap, however many connect
        assert server.turned_away == 12
        for s in socks[8:]:  # turned away at once: the server closed them
            assert s.recv(1) == b""
        end = time.monotonic() + 10
        while threading.active_count() > base and time.monotonic() < end:
            time.sleep(0.1)
        assert threading.active_count() <= base  # the timeout closed the silent ones and ended their threads
        for s in socks[:8]:
            assert s.recv(1) == b""
        assert get(url + "api/data")[0] == 200  # and it serves again
    finally:
        for s in socks:
            s.close()
        stop(server)
    assert "Traceback" not in capfd.readouterr().err


def test_bound_to_every_interface_the_address_shown_is_the_real_one(tmp_path, caplog):
    """0.0.0.0 exposes the page and /metrics on every interface: the URL and the log line say so (they
    said 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with caplog.at_level("INFO", logger="swarm_node.node.metrics"):
        w = MetricsWriter(tmp_path, prometheus_port=port, prometheus_host="0.0.0.0")
    try:
        assert w.page_url == f"http://0.0.0.0:{port}/"
        assert any(f"0.0.0.0:{port}" in r.getMessage() and "every interface" in r.getMessage() for r in caplog.records)
        assert _get_as(f"http://127.0.0.1:{port}/api/data", f"{socket.gethostname()}:{port}") == 200  # its own name
        assert _get_as(f"http://127.0.0.1:{port}/api/data", "attacker.example") == 421
    finally:
        w.close()


# ---- the command --------------------------------------------------------------------------------------------


def test_dashboard_port_in_use_is_one_line(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        rc = main(["dashboard", str(tmp_path), "--port", str(busy.getsockname()[1])])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "already in use" in err and "--port" in err, err


def test_dashboard_refuses_a_file_and_a_bad_address(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("")
    assert main(["dashboard", str(tmp_path / "metrics.jsonl"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and err.count("\n") == 1
    assert main(["dashboard", str(tmp_path), "--port", "0", "--initial-peers", "/ip4/127.0.0.1/tcp/1"]) == 2
    err = capsys.readouterr().err
    assert "/p2p/" in err and err.count("\n") == 1


def test_dashboard_command_serves_a_missing_dir_until_it_appears_and_stops_cleanly(tmp_path):
    later = tmp_path / "not-yet"
    # Ctrl-C as a terminal sends it: SIGINT at its default in the child, whatever this test run inherited (a
    # suite started in the background of a non-interactive shell ignores SIGINT, and so would the command:
    # it then slept on, seen 2026-12-02). -X faulthandler: if it ever hangs anyway, SIGABRT below makes it
    # print every thread's stack into the assertion.
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "swarm_node.cli", "dashboard", str(later),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert "does not exist yet" in lines[0], lines
        url = lines[1].split()[1]
        doc = json.loads(get(url + "api/data")[1])
        assert doc["peers"] == [] and "no such directory" in doc["problems"][0]
        write(later / "metrics.jsonl", grpo_rows(2, "n"))
        end = time.monotonic() + 20  # the server reads the files at most every 0.5 s; a loaded box is later
        while True:
            doc = json.loads(get(url + "api/data")[1])
            if doc["peers"] or time.monotonic() > end:
                break
            time.sleep(0.2)
        assert [p["round"] for p in doc["peers"]] == [2] and doc["problems"] == []
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=30)
            raise AssertionError(f"no exit 30 s after SIGINT; its threads:\n{err}") from None
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_the_pages_files_ship_in_the_wheel_and_the_vendored_ones_are_as_recorded():
    import fnmatch
    import hashlib

    from swarm_node.dashboard.server import STATIC

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "swarm_node.dashboard"]
    for name, _ in STATIC.values():
        assert (ROOT / "swarm_node" / "dashboard" / name).is_file() and any(fnmatch.fnmatch(name, g) for g in globs)
    vendor = ROOT / "swarm_node" / "dashboard" / "vendor"
    recorded = [ln.split() for ln in (vendor / "VENDOR.txt").read_text().splitlines()[1:]]
    assert {name for _, name in recorded} == {"uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"}
    for digest, name in recorded:  # scripts/vendor-uplot.sh wrote these; an edited copy fails here
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name


def test_the_page_writes_numbers_as_report_md_does():
    """The page's fmt() is Python's format(v, '.3f'), exact ties (k/16 accuracies) included (node runs it)."""
    import re
    import shutil

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the browser test checks the same numbers on the page)")
    js = (ROOT / "swarm_node" / "dashboard" / "dashboard.js").read_text()
    fmt_src = re.search(r"^function fmt\(.*?^}\n", js, re.S | re.M).group(0)
    values = [k / 16 for k in range(-17, 17)] + [k / 400 for k in range(401)] + [0.0005, 0.9995, 2 / 3, 1e-9]
    script = fmt_src + f"console.log(JSON.stringify({json.dumps(values)}.map(v => fmt(v))));"
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == [format(v, ".3f") for v in values]


def test_swarm_view_shows_a_dht_failure_as_one_line(monkeypatch, caplog):
    """The real DHT read is in the browser test (a demo's bootstrap); here only what a failure to join becomes."""
    from swarm_node.dashboard import swarm_view

    class Unreachable:
        def __init__(self, *a, **k):
            raise RuntimeError("could not bootstrap\ntraceback-ish second line")

    monkeypatch.setattr(swarm_view, "SwarmReader", Unreachable)
    watch = swarm_view.SwarmWatch(["/ip4/127.0.0.1/tcp/1/p2p/QmX"], interval_s=0.05).start()
    try:
        deadline = time.monotonic() + 10
        while watch.snapshot()["state"] != "error" and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # several more failed attempts
    finally:
        watch.close()
    snap = watch.snapshot()
    assert snap["error"] == "cannot read the swarm from /ip4/127.0.0.1/tcp/1/p2p/QmX: could not bootstrap"
    assert sum("swarm view" in r.message for r in caplog.records) == 1  # logged once, not every attempt
