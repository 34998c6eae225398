"""Who may write a warehouse: the service, or one writing ``tracker jobs`` run, never both.

The live service owns ``pointstamps``, ``frontiers``, ``frontier_changes`` and ``summaries`` of
its dataflows: it rewrites them from its in-memory state every few seconds. A Spark job writing
the same tables at the same time would interleave its commits with the service's (the appended
``frontier_changes`` would hold the same versions twice; a recomputed ``frontiers`` would be
overwritten, or overwrite newer state). So each writer holds an exclusive ``flock`` while it
runs, and the file says who holds it. The kernel drops a lock when its holder exits, however it
exits (``kill -9`` included), so there is no stale lock to clean up. Warehouses given as URIs
(``s3://...``) are not locked: the lock is local.

The service takes one lock per role: ``<warehouse>/_owner.lock`` for ``tracker serve`` (its
supervisor: one per warehouse) and ``<warehouse>/_wal/shard-<k>/_owner.lock`` for the process
serving shard ``k`` (a shard's write-ahead log lives next to it), so that shards on several
hosts can share one warehouse while no shard is ever served twice. A writing job takes all of
them (:meth:`WarehouseLock.acquire_all`).

>>> import tempfile
>>> root = tempfile.mkdtemp()
>>> held = WarehouseLock.acquire(root, "tracker serve")
>>> shard = WarehouseLock.acquire(root, "shard 1", shard=1)
>>> try:
...     WarehouseLock.acquire_all(root, "tracker jobs propagate")
... except WarehouseBusy as busy:
...     print(busy.holder["what"])
tracker serve
>>> held.release()
>>> try:
...     WarehouseLock.acquire_all(root, "tracker jobs propagate")
... except WarehouseBusy as busy:
...     print(busy.holder["what"])
shard 1
>>> shard.release()
>>> WarehouseLock.acquire_all(root, "tracker jobs propagate").release()
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

LOCK_FILE = "_owner.lock"


def shard_directory(warehouse: str | os.PathLike[str], shard: int) -> Path:
    """Shard ``shard``'s directory: its write-ahead log and its lock."""
    return Path(warehouse) / "_wal" / f"shard-{shard}"


class WarehouseBusy(RuntimeError):
    """Another process holds the warehouse; ``holder`` is what it wrote about itself."""

    def __init__(self, path: Path, holder: dict[str, Any]) -> None:
        what = holder.get("what", "another process")
        since = holder.get("since")
        when = f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}" if since else ""
        super().__init__(f"{what} (pid {holder.get('pid', '?')}{when}) is writing the warehouse {path}")
        self.holder = holder


class WarehouseLock:
    """Exclusive holds on a local warehouse (or one of its shards), until :meth:`release` or
    the process's end."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds

    @classmethod
    def acquire(cls, warehouse: str | os.PathLike[str], what: str, shard: int | None = None) -> WarehouseLock:
        """Take the warehouse (``shard`` given: that shard) for ``what`` (a short description of
        the holder, shown to whoever is refused), or raise :class:`WarehouseBusy` at once; never
        waits."""
        if "://" in str(warehouse):
            return cls([])
        directory = Path(warehouse)
        if shard is not None:
            directory = shard_directory(warehouse, shard)
            directory.mkdir(parents=True, exist_ok=True)
        return cls([_take(directory / LOCK_FILE, Path(warehouse), what)])

    @classmethod
    def acquire_all(cls, warehouse: str | os.PathLike[str], what: str) -> WarehouseLock:
        """Take the warehouse and every shard it has, for a writer that must exclude the
        service wherever its shards run; :class:`WarehouseBusy` names the first holder found."""
        held = cls.acquire(warehouse, what)
        if "://" in str(warehouse):
            return held
        try:
            for lock in sorted((Path(warehouse) / "_wal").glob(f"shard-*/{LOCK_FILE}")):
                held._fds.append(_take(lock, Path(warehouse), what))
        except WarehouseBusy:
            held.release()
            raise
        return held

    def fileno(self) -> int | None:
        """The descriptor holding the (first) lock (``None`` for a remote warehouse): a child
        process that inherits it holds the lock as long as it lives, even past this process."""
        return self._fds[0] if self._fds else None

    def release(self) -> None:
        """Give the warehouse back (idempotent)."""
        for fd in self._fds:
            os.close(fd)  # closing the only descriptor drops the flock
        self._fds = []


def _take(path: Path, warehouse: Path, what: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise WarehouseBusy(warehouse, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"what": what, "pid": os.getpid(), "since": time.time()}).encode(), 0)
    return fd


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return holder if isinstance(holder, dict) else {}
    except ValueError:  # the holder is between truncating and writing its note
        return {}


FILE_MODES = {"owner": (0o077, 0o700), "group": (0o027, 0o750)}
"""``TRACKER_FILE_MODE``: ``(umask, the warehouse directory's mode)``. ``owner`` (the default):
only the user running the service reads or writes the warehouse, its tables and its log;
``group``: the warehouse directory's group may read them too (give the directory that group,
and its setgid bit, for the files inside to follow)."""


def restrict(warehouse: str | os.PathLike[str] | None, mode: str = "owner") -> None:
    """Make every file and directory this process (and its children: the Spark JVM, the
    shards) creates from now on private to the user (``mode`` ``owner``) or readable by the
    group too (``group``), and give a local ``warehouse`` directory the same mode: the files
    already inside are then out of other users' reach as well.

    >>> import stat, tempfile
    >>> root = tempfile.mkdtemp()
    >>> previous = os.umask(0o022); restrict(root); oct(stat.S_IMODE(os.stat(root).st_mode))
    '0o700'
    >>> _ = os.umask(previous)

    Raises:
        ValueError: ``mode`` is neither ``owner`` nor ``group``.
    """
    if mode not in FILE_MODES:
        raise ValueError(f"TRACKER_FILE_MODE must be owner or group, got {mode!r}")
    umask, directory = FILE_MODES[mode]
    os.umask(umask)
    if warehouse is not None and "://" not in str(warehouse) and os.path.isdir(warehouse):
        os.chmod(warehouse, directory)
