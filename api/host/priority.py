"""Thread priorities in a hot-path process: the event loop first.

The event loop serves every tenant; a thread that does background work in native code with the
GIL released (delta-rs writing Delta) runs below it, so that when the cores are short the loop
gets them. Only such threads: a thread that holds the GIL while it runs Python must keep the
loop's priority, or the loop, waiting for the GIL, would wait for a thread the kernel is not
running (priority inversion). Work that is both (a SQL query) goes to a process of its own
(:mod:`api.sql.process`).

>>> pool = background_pool("example", 19)
>>> pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result() >= 0
True
>>> pool.shutdown()
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor


def lower_priority(nice: int) -> None:
    """Run the calling thread ``nice`` below its process (Linux sets niceness per thread; the
    threads it starts inherit it). Without effect where the system refuses."""
    if nice:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + nice)


def background_pool(name: str, nice: int, workers: int = 1) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads named ``name``, each ``nice`` below the process."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=lower_priority, initargs=(nice,))
