"""What a child of ``tracker serve``'s supervisor does for it: say when it is ready, heartbeat,
give a one-line reason when it cannot boot, and die with its parent.

The supervisor passes a pipe's write end (``TRACKER_SUPERVISOR_FD``) and its pid
(``TRACKER_SUPERVISOR_PID``); the child writes lines to it: ``ready``, ``beat`` (every
:data:`BEAT_SECONDS`, from the child's event loop, so a beat means the loop runs),
``fatal <reason>`` before it exits with :data:`CANNOT_BOOT`, and ``down <reason>`` before it
exits to be started afresh (the Spark process whose JVM died). A child started by hand (no such
variables) does none of it.

For an optional child (the Spark process), the supervisor keeps its state in a file
(:func:`write_state`: ``starting``, or ``down`` with the reason and the time of the next
start), which the hot path reads (:func:`read_state`) to say why the child is not there.

>>> child = Supervised(None, None)
>>> child.ready(); child.fatal("nothing happens without a supervisor")
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

BEAT_SECONDS = 1.0
"""How often a child says it is alive."""
CANNOT_BOOT = 3
"""The exit code of a child that cannot start (as uvicorn's for a failed start-up): the
supervisor stops the service instead of restarting it forever."""
FD_ENV = "TRACKER_SUPERVISOR_FD"
PID_ENV = "TRACKER_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1


class Supervised:
    """The child's end of its supervisor's pipe (``fd``), and its supervisor's pid."""

    def __init__(self, fd: int | None, parent: int | None) -> None:
        self.fd = fd
        self.parent = parent

    @classmethod
    def from_env(cls) -> Supervised:
        """From the variables the supervisor set (none: not supervised)."""
        fd, parent = os.environ.pop(FD_ENV, None), os.environ.pop(PID_ENV, None)
        if fd is not None:
            os.set_blocking(int(fd), False)  # a beat is dropped rather than wait for the supervisor
        return cls(int(fd) if fd else None, int(parent) if parent else None)

    def watch_parent(self) -> None:
        """Die (SIGKILL) the moment the supervisor dies, however it dies (Linux), and exit now if
        it is gone already: nothing of the service outlives its supervisor."""
        if self.parent is None:
            return
        if sys.platform == "linux":
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.parent:
            os._exit(1)

    def _say(self, line: str) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):  # full (the supervisor is slow) or closed (it is gone)
            os.write(self.fd, (line.replace("\n", " ") + "\n").encode())

    def ready(self) -> None:
        """Tell the supervisor the child serves."""
        self._say("ready")

    def fatal(self, reason: str) -> None:
        """Tell the supervisor why the child cannot start (then exit with :data:`CANNOT_BOOT`)."""
        self._say(f"fatal {reason}")

    def down(self, reason: str) -> None:
        """Tell the supervisor why the child is about to exit (to be started again)."""
        self._say(f"down {reason}")

    async def beat(self) -> None:
        """Say ``ready``, then ``beat`` every :data:`BEAT_SECONDS`, forever (cancel to stop);
        exits the process if the parent is gone (where ``watch_parent``'s signal is not had)."""
        self.ready()
        while True:
            self._say("beat")
            if self.parent is not None and os.getppid() != self.parent:
                os._exit(1)
            await asyncio.sleep(BEAT_SECONDS)


# -- the state of an optional child, as its supervisor sees it -----------------------------------

def spark_state_file(spark_address: str) -> Path:
    """Where the supervisor keeps the Spark process's state: beside its socket, in the
    supervisor's private runtime directory."""
    return Path(spark_address).with_name("spark.state")


def write_state(path: Path | None, state: str, **fields: object) -> None:
    """Write an optional child's state (``starting`` or ``down``, with ``reason``, ``pid``,
    ``restarts`` and ``retry_at``: POSIX seconds) to ``path`` as one JSON object, replaced
    atomically: the hot path reads it to tell why the Spark process is not connected
    (:func:`read_state`). Nothing if ``path`` is ``None``.

    >>> import json, tempfile
    >>> path = Path(tempfile.mkdtemp()) / "spark.state"
    >>> write_state(path, "down", reason="it was killed by SIGKILL", retry_at=12.5)
    >>> json.loads(path.read_text())["reason"]
    'it was killed by SIGKILL'
    """
    if path is None:
        return
    partial = path.with_suffix(".partial")
    with contextlib.suppress(OSError):  # the runtime directory is gone: the service is stopping
        partial.write_text(json.dumps({"state": state, "since": time.time(), **fields}))
        partial.replace(path)


def read_state(path: Path) -> dict[str, Any] | None:
    """What :func:`write_state` last wrote to ``path``, or ``None`` (nothing yet, or unreadable).

    >>> read_state(Path("/nonexistent/spark.state")) is None
    True
    """
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
