"""Who may write a warehouse: the service, or one writing ``tracker jobs`` run, never both.

The live service owns ``pointstamps``, ``frontiers``, ``frontier_changes`` and ``summaries`` of
its dataflows: it rewrites them from its in-memory state every few seconds. A Spark job writing
the same tables at the same time would interleave its commits with the service's (the appended
``frontier_changes`` would hold the same versions twice; a recomputed ``frontiers`` would be
overwritten, or overwrite newer state). So each writer holds an exclusive ``flock`` on
``<warehouse>/_owner.lock`` while it runs, and the file says who holds it. The kernel drops the
lock when the holder exits, however it exits (``kill -9`` included), so there is no stale lock
to clean up. Warehouses given as URIs (``s3://...``) are not locked: the lock is local.

>>> import tempfile
>>> root = tempfile.mkdtemp()
>>> held = WarehouseLock.acquire(root, "tracker serve")
>>> try:
...     WarehouseLock.acquire(root, "tracker jobs propagate")
... except WarehouseBusy as busy:
...     print(busy.holder["what"])
tracker serve
>>> held.release()
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

LOCK_FILE = "_owner.lock"


class WarehouseBusy(RuntimeError):
    """Another process holds the warehouse; ``holder`` is what it wrote about itself."""

    def __init__(self, path: Path, holder: dict[str, Any]) -> None:
        what = holder.get("what", "another process")
        since = holder.get("since")
        when = f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}" if since else ""
        super().__init__(f"{what} (pid {holder.get('pid', '?')}{when}) is writing the warehouse {path}")
        self.holder = holder


class WarehouseLock:
    """An exclusive hold on a local warehouse, until :meth:`release` or the process's end."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    @classmethod
    def acquire(cls, warehouse: str | os.PathLike[str], what: str) -> WarehouseLock:
        """Take the warehouse for ``what`` (a short description of the holder, shown to whoever
        is refused), or raise :class:`WarehouseBusy` at once; never waits."""
        if "://" in str(warehouse):
            return cls(None)
        path = Path(warehouse) / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise WarehouseBusy(Path(warehouse), holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"what": what, "pid": os.getpid(), "since": time.time()}).encode(), 0)
        return cls(fd)

    def fileno(self) -> int | None:
        """The descriptor holding the lock (``None`` for a remote warehouse): a child process
        that inherits it holds the lock as long as it lives, even past this process."""
        return self._fd

    def release(self) -> None:
        """Give the warehouse back (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return holder if isinstance(holder, dict) else {}
    except ValueError:  # the holder is between truncating and writing its note
        return {}
