"""Counting the bytes real peers send each other on 127.0.0.1, with no other process's traffic in the count.

A benchmark re-runs itself in a new user+network namespace (`unshare -rn`, then `ip link set lo up`),
where the loopback interface carries only the packets of the processes it starts; `lo_bytes()` reads
that interface's transmitted-bytes counter (each loopback packet is transmitted once, so every byte is
counted once, TCP/IP headers included). Used by benchmarks/swarm_scale.py and control_costs.py.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

IN_NETNS_ENV = "SWARM_NODE_IN_NETNS"
"""Set to "1" in the re-run process, so it does not re-run itself again."""


def lo_bytes(dev: str = "/proc/net/dev") -> int:
    """Bytes transmitted so far on the loopback interface `lo` (0 where there is none)."""
    for line in Path(dev).read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[8])  # receive: 8 fields, then transmitted bytes
    return 0


def in_private_netns() -> bool:
    """Is this process the re-run inside a namespace of its own?"""
    return os.environ.get(IN_NETNS_ENV) == "1"


def netns_available() -> bool:
    """Can this user make a user+network namespace here (unshare installed and allowed)?"""
    return bool(shutil.which("unshare")) and subprocess.run(
        ["unshare", "-rn", "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def rerun_in_netns(module: str, argv: list[str]) -> int | None:
    """Run `python -m module *argv` in a private network namespace with loopback up and wait for it ->
    its exit code; None where no namespace can be made (the caller then counts some other way)."""
    if not netns_available():
        return None
    cmd = "ip link set lo up && exec " + shlex.join([sys.executable, "-m", module, *argv])
    return subprocess.run(["unshare", "-rn", "sh", "-c", cmd], env={**os.environ, IN_NETNS_ENV: "1"}).returncode


def isolate(args, module: str, without: str) -> int | None:
    """A benchmark's start: with `args.netns` and not yet inside a namespace, re-run `module` in one and return
    its exit code; where no namespace can be made, say `without` (what the counts then mean), set
    `args.netns` False and return None, as inside one, so the caller goes on measuring."""
    if args.netns and not in_private_netns():
        code = rerun_in_netns(module, sys.argv[1:])
        if code is not None:
            return code
        print(f"no user+network namespace available: {without}", file=sys.stderr)
        args.netns = False
    return None
