"""On a terminal, the node's rich progress bar and its log lines do not overwrite each other.

Runs a real RoundProgress with the node's logging set-up inside tmux (a real terminal) and reads the screen
back with `tmux capture-pane`: every log line must start on a line of its own, with nothing drawn over it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = r'''
import logging, time
from swarm_node.node.logs import setup_logging
from swarm_node.node.progress import RoundProgress
setup_logging("info")
log = logging.getLogger("swarm_node.test")
p = RoundProgress("tiny-s", total=30)
for r in range(1, 31):
    log.info("side line %02d " % r + "x" * 40)
    p.update({"round": r, "reward_mean": 0.5, "loss": 0.1, "local_groups": 4, "external_groups": 0,
              "filtered": 0, "gen_s": 0.01, "train_s": 0.01})
    time.sleep(0.1)
p.close()
log.info("after close")
print("DONE", flush=True)
time.sleep(60)
'''

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d I swarm_node\.(test|node): ")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_progress_bar_and_logs_do_not_collide_on_a_terminal(tmp_path):
    script = tmp_path / "progress.py"
    script.write_text(SCRIPT)
    session = f"swarm-node-test-{tmp_path.name}"
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "60", "-c", str(root),
                    f"PYTHONPATH={root} {sys.executable} {script}"], check=True)
    try:
        screen = ""
        end = time.monotonic() + 120
        while time.monotonic() < end and "DONE" not in screen:
            time.sleep(0.5)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session, "-S", "-300"],
                                    capture_output=True, text=True).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert "DONE" in screen, screen
    lines = [ln for ln in screen.splitlines() if "side line" in ln or "/30 | reward" in ln or "after close" in ln]
    assert len(lines) == 61, screen
    for ln in lines:
        assert LOG_LINE.match(ln) and "━" not in ln, f"log line drawn over:\n{ln}\n\nscreen:\n{screen}"
    for r in range(1, 31):  # each complete, on one line
        assert any(ln.endswith(f"side line {r:02d} " + "x" * 40) for ln in lines), r
