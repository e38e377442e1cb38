"""The dashboard in a real browser (Debian's headless Chromium) against a running 2-peer demo.

While the demo runs, the page the demo prints renders its charts and they grow as rounds land (read back
from the charts: uPlot's data, the legend it built in the DOM, the coloured pixels of its canvas), and
`swarm-node dashboard DIR --initial-peers BOOTSTRAP` lists both peers from the DHT. The demo is asked for
far more rounds than the checks need and stopped with Ctrl-C once they are done (it then reports the rounds
done), so a fast machine cannot finish the run before the page is watched. After the demo ends, that page
shows the same peers, rounds and accuracies as report.json, and the pages fetched nothing from outside
their own origin. A screenshot of the live swarm page is kept (SWARM_NODE_SCREENSHOT=PATH copies it there,
e.g. docs/dashboard.png).

Skips with the reason where no browser is installed; SWARM_NODE_REQUIRE_BROWSER=1 (`make test` as root with
apt-get) turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tooling import browser

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
PEERS = ("tiny-s", "tiny-m")
ROUNDS = 5000  # never reached: the test stops the demo (Ctrl-C) when it has watched enough
CHARTS = ("chart-accuracy", "chart-reward", "chart-filtered", "chart-ratio")

# per chart, from the chart itself (uPlot's instance and the DOM it built): its series' labels, the points each
# holds, the legend rows uPlot drew, and how many of the canvas' pixels are coloured (lines, not grey axes)
POINTS_JS = """
const out = {};
for (const id of arguments[0]) {
  const el = document.getElementById(id);
  const u = el._uplot;
  const canvas = el.querySelector('canvas');
  let colored = 0;
  if (canvas && canvas.width) {
    const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] > 0 && Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 80) colored++;
    }
  }
  out[id] = {labels: u ? u.series.slice(1).map(s => s.label) : [],
             points: u ? u.data.slice(1).map(ys => ys.filter(v => v !== null).length) : [],
             rounds: u ? u.data[0].length : 0,
             legend: [...el.querySelectorAll('.u-legend .u-series')].map(tr => tr.textContent.trim()),
             colored: colored};
}
return out;
"""
TIME_BARS_JS = """
return [...document.querySelectorAll('#times tbody tr')].map(tr =>
  [...tr.querySelectorAll('.seg')].reduce((a, s) => a + s.getBoundingClientRect().width, 0));
"""
ROWS_JS = """
return [...document.querySelectorAll('#peers tbody tr')].map(tr => {
  const cell = c => tr.querySelector('td.' + c).textContent;
  return {name: tr.dataset.peer, arm: tr.dataset.arm, round: +cell('round'), start: cell('acc-start'),
          end: cell('acc-end'), best: cell('acc-best')};
});
"""


def _need_browser() -> None:
    why = browser.missing()
    if why:
        if os.environ.get("SWARM_NODE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"SWARM_NODE_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)


def _wait(check, timeout: float, what: str, every: float = 0.5):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def _word_after(proc: subprocess.Popen, marker: str, prefix: str, timeout: float = 300) -> str:
    """The first word starting with `prefix` on the first output line of `proc` that holds `marker`."""
    end = time.monotonic() + timeout
    seen = []
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if marker in line:
            return next(w for w in line.split() if w.startswith(prefix))
    raise AssertionError(f"no {marker!r} line; output so far:\n{''.join(seen)[-3000:]}")


def _only_own_origin(driver, url: str) -> None:
    resources = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert resources and all(r.startswith(url) for r in resources), resources  # nothing from outside


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def test_page_renders_grows_and_matches_the_report(presets_dir, tmp_path):
    _need_browser()
    out = tmp_path / "demo"
    env = {**os.environ, "SWARM_NODE_PRESETS": str(presets_dir), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # --no-specialise: the swarm arm at once (the default trains each peer alone first)
    demo = subprocess.Popen([sys.executable, "-m", "swarm_node.cli", "demo", "--no-specialise", "--peers", *PEERS,
                             "--rounds", str(ROUNDS), "--eval-every", "2", "--out", str(out), "--dashboard-port", "0",
                             "--log-level", "warning"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # Ctrl-C as from a terminal
    dash = None
    try:
        url = _word_after(demo, "[demo] dashboard:", "http://")
        bootstrap = _word_after(demo, "[demo] bootstrap peer at", "/ip4/")
        # the same page from its own command, with the swarm view; used again once the demo has ended
        dash = subprocess.Popen([sys.executable, "-m", "swarm_node.cli", "dashboard", str(out), "--port", "0",
                                 "--initial-peers", bootstrap, "--swarm", "demo"],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        dash_url = _word_after(dash, "[dashboard] http", "http://", timeout=60)
        with browser.chromium() as driver:
            driver.get(url)

            def rendered():
                rows = driver.execute_script(ROWS_JS)
                pts = driver.execute_script(POINTS_JS, CHARTS)
                rew = pts["chart-reward"]
                ok = len(rows) == len(PEERS) and len(rew["points"]) == len(PEERS) and min(rew["points"]) >= 1
                return (rows, pts) if ok else None

            rows, first = _wait(rendered, 300, "both peers on the page with a reward curve each")
            assert sorted(r["name"] for r in rows) == sorted(PEERS)
            for c in CHARTS:  # uPlot drew each chart: a legend row per series it holds
                assert set(first[c]["labels"]) <= set(first[c]["legend"]), (c, first[c])
            assert sorted(first["chart-reward"]["labels"]) == sorted(PEERS)

            def grown():
                pts = driver.execute_script(POINTS_JS, CHARTS)
                rew = pts["chart-reward"]
                bigger = all(a >= b + 2 for a, b in zip(rew["points"], first["chart-reward"]["points"], strict=True))
                return pts if bigger else None

            later = _wait(grown, 300, "every peer's reward curve to grow by 2 rounds")
            assert later["chart-reward"]["rounds"] > first["chart-reward"]["rounds"]
            assert later["chart-reward"]["colored"] > 200  # the lines are on the canvas, in the peers' colours
            acc = later["chart-accuracy"]
            assert len(acc["points"]) >= len(PEERS) and all(n >= 2 for n in acc["points"][:len(PEERS)])
            bars = driver.execute_script(TIME_BARS_JS)  # the round's time split: a bar per peer
            assert len(bars) == len(PEERS) and all(w > 10 for w in bars), bars
            assert int(driver.execute_script("return document.body.dataset.renders")) >= 2
            assert "error" not in driver.find_element("id", "status").get_attribute("class")
            _only_own_origin(driver, url)

            # the swarm view: both peers, read from the DHT through the demo's bootstrap peer
            driver.get(dash_url)
            members = _wait(lambda: (m := driver.execute_script(
                "return [...document.querySelectorAll('table.members tr[data-peer-id]')].map("
                "tr => [...tr.children].map(td => td.textContent))")) and len(m) == len(PEERS) and m, 120,
                "both peers in the swarm view")
            assert all(m[1] == "grpo" and int(m[4]) >= 0 for m in members), members
            driver.set_window_size(1400, 1750)  # the picture: the swarm's page while it learns
            time.sleep(2.5)  # one more poll, drawn at the new width
            shot = tmp_path / "dashboard.png"
            assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
        assert demo.poll() is None, "the demo ended before the test stopped it"
        demo.send_signal(signal.SIGINT)  # Ctrl-C: the peers stop, the demo reports the rounds they did
        code, tail = demo.wait(timeout=120), demo.stdout.read()
        assert code == 130 and "[demo] interrupted: the report covers the rounds done" in tail, tail[-3000:]
        report = json.loads((out / "report.json").read_text())
        assert report["interrupted"] is True and "Interrupted (Ctrl-C)" in (out / "report.md").read_text()
        models = {s["model"]["name"] for peers in report["arms"].values() for s in peers.values()}
        assert {m[2] for m in members} == models, (members, models)  # the DHT names the models report.json does

        # the finished run on the same page: the same numbers as report.json
        with browser.chromium() as driver:
            driver.get(dash_url)
            rows = _wait(lambda: (r := driver.execute_script(ROWS_JS)) and len(r) == len(PEERS) and r, 60,
                         "the finished run's peers")
            page = {(r["arm"], r["name"]): r for r in rows}
            want = {(arm, name): s for arm, peers in report["arms"].items() for name, s in peers.items()}
            assert set(page) == set(want)
            for key, s in want.items():
                got = page[key]
                assert s["rounds"] >= 2
                assert (got["round"], got["start"], got["end"], got["best"]) == (
                    s["rounds"], _fmt(s["start_accuracy"]), _fmt(s["end_accuracy"]), _fmt(s["best_accuracy"])), key
            _only_own_origin(driver, dash_url)
        if os.environ.get("SWARM_NODE_SCREENSHOT"):
            shutil.copy(shot, os.environ["SWARM_NODE_SCREENSHOT"])
    finally:
        for proc in (demo, dash):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
