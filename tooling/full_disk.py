"""A disk that fills up and frees again, for the full-disk tests (test tooling, not installed).

Two ways, both through the kernel's real write path:
- `TmpfsDisk`: a small tmpfs mounted on a directory (needs root), filled by a ballast file that a thread
  keeps topping up (whatever the node frees, e.g. a failed checkpoint's temporary copy, is taken again),
  and freed by deleting it. Writes fail with ENOSPC after a short write, as on a real full disk.
- `FileSizeLimit`: RLIMIT_FSIZE on a process (any user may lower and raise its own soft limit, and a
  child's through prlimit): a write past the limit fails with EFBIG after a short write. Python ignores
  SIGXFSZ, so the process is not killed. The fallback where mounting is impossible (no root in CI).
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import threading
from pathlib import Path


def mount_tmpfs(path: Path, size: str) -> bool:
    """Mount a tmpfs of `size` (e.g. "600k", "32m") on `path`; False when this process may not mount."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class TmpfsDisk:
    """A tmpfs at `path` that `fill()` keeps full until `free()`; `close()` unmounts it."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = Path(path)
        self.mounted = mount_tmpfs(self.path, size)
        self.ballast = self.path / ".ballast"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.full_once = threading.Event()  # set once the ballast has filled the disk the first time

    def fill(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._top_up, daemon=True)
        self._thread.start()
        assert self.full_once.wait(30), "the ballast never filled the tmpfs"

    def _top_up(self) -> None:
        chunk = b"\0" * 65536
        with open(self.ballast, "ab", buffering=0) as fh:
            while not self._stop.is_set():
                try:
                    while True:
                        n = fh.write(chunk)
                        if n < len(chunk):  # a short write: the disk is full
                            break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                self.full_once.set()
                self._stop.wait(0.01)

    def free(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.ballast.unlink(missing_ok=True)

    def close(self) -> None:
        self.free()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=10)


class FileSizeLimit:
    """`fill(limit)`: no file of process `pid` (0: this one) may grow past `limit` bytes; `free()`: as before."""

    def __init__(self, pid: int = 0) -> None:
        self.pid = pid
        self.before = resource.prlimit(pid, resource.RLIMIT_FSIZE)

    def fill(self, limit: int) -> None:
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, (limit, self.before[1]))

    def free(self) -> None:
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, self.before)

    @staticmethod
    def works() -> bool:
        """Whether a write past the limit fails with EFBIG here (it does on Linux)."""
        return hasattr(resource, "prlimit") and os.name == "posix"


def tmpfs_or_skip(path: Path, size: str, instead: str) -> TmpfsDisk:
    """A mounted TmpfsDisk at `path`, or skip the test (not root), naming the case that runs `instead`."""
    import pytest

    disk = TmpfsDisk(path, size)
    if not disk.mounted:
        pytest.skip(f"cannot mount a tmpfs (not root); {instead}")
    return disk
