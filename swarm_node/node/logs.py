"""Logging set-up: one readable line per event, hivemind's own chatter kept at warning level."""

from __future__ import annotations

import logging
import os
import sys

NOISY = ("hivemind", "transformers", "urllib3", "asyncio", "filelock", "httpx", "torch")


def setup_logging(level: str = "info") -> None:
    lvl = getattr(logging, level.upper(), logging.INFO)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s", "%H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(lvl)
    # hivemind installs its own handler on its loggers; route them through ours at warning unless debugging
    os.environ.setdefault("HIVEMIND_LOGLEVEL", "DEBUG" if lvl <= logging.DEBUG else "WARNING")
    for name in NOISY:
        lg = logging.getLogger(name)
        lg.setLevel(logging.DEBUG if lvl <= logging.DEBUG else logging.WARNING)
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.propagate = True
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - transformers always present, but logging must never fail
        pass
