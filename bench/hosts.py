"""Another host on this machine: a network namespace with a veth pair to this one, running
``tracker shard K``, for the tests and benchmarks of shards on other hosts.

A :class:`Host` has its own address (``10.<subnet>.K.2``; this machine's end of the link is
``.1``), its own firewall and its own link, so the faults of a real network can be made
exactly: its packets dropped in either direction (an ``iptables`` rule in its namespace), its
link down, or the host gone altogether. Everything it makes (namespace, link, rules, a
blackhole route) is removed by :meth:`Host.remove`, which never raises, so a caller's
``finally`` cleans up even after a failure. It needs root, ``ip`` (iproute2) and, for
:meth:`Host.drop`, ``iptables``: :func:`missing` says which is not there.

The names made here carry the caller's pid, so two runs on one machine never collide; two
runs must still use two subnets (:func:`free_subnet` finds one no interface uses).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from api.run.process import ADMIN_TOKEN, SOURCE_ROOT, descendants

SUBNET = 232
"""The default second octet: ``10.SUBNET.K.0/30`` links host K to this machine."""
PORT = 8101
"""The port the host's shard listens on."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def missing(firewall: bool = False) -> str | None:
    """Why namespaces cannot be made here (not root, no ``ip``, or with ``firewall`` no
    ``iptables``), as a sentence; ``None`` when everything is there."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    needed = ["ip", *(["iptables"] if firewall else [])]
    absent = [tool for tool in needed if shutil.which(tool) is None]
    return f"network namespaces need {' and '.join(absent)} (apt-get install iproute2 iptables)" if absent else None


def free_subnet(start: int = 200) -> int:
    """A second octet ``n >= start`` such that no address of this machine is in ``10.n.0.0/16``."""
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    used = {int(word.split(".")[1]) for word in shown.split() if word.startswith("10.") and word.count(".") == 3}
    return next(n for n in range(start, 255) if n not in used)


def remove_leftovers(pid: int) -> list[str]:
    """Remove what the :class:`Host` objects of process ``pid`` made, if that process died before
    cleaning up (``kill -9``): their namespaces (and every process in them), links and
    blackhole routes. Returns the namespaces removed; never raises."""
    def run(*args: str) -> str:
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    removed = []
    for name in (line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip()):
        if not name.startswith(f"tsh{pid}-"):
            continue
        for inner in run("ip", "netns", "pids", name).split():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(inner), signal.SIGKILL)
        for word in run("ip", "-n", name, "-o", "-4", "addr", "show").split():
            if word.startswith("10.") and "/" in word:
                run("ip", "route", "del", "blackhole", word.split("/")[0] + "/32")
        run("ip", "netns", "del", name)
        removed.append(name)
    for line in run("ip", "-o", "link", "show").splitlines():
        link = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
        if link.startswith(f"tsh{pid % 100000}o"):
            run("ip", "link", "del", link)
    return removed


class Host:
    """A network namespace with a veth pair to this machine, running ``tracker shard K`` on
    ``warehouse`` (its output appended to ``log``), with ``env`` added to its environment.

    The shard is started at once, not waited for: poll :attr:`url` (``/healthz``).
    """

    def __init__(self, shard: int, warehouse: Path, log: Path, *, subnet: int = SUBNET,
                 env: dict[str, str] | None = None) -> None:
        self.shard = shard
        self.name = f"tsh{os.getpid()}-{shard}"
        self.outside, self.inside = f"tsh{os.getpid() % 100000}o{shard}", f"tsh{os.getpid() % 100000}i{shard}"
        self.address = f"10.{subnet}.{shard}.2"
        self.url = f"http://{self.address}:{PORT}"
        self.blackholed = False
        self.dropping: set[str] = set()
        _ip("netns", "add", self.name)
        _ip("link", "add", self.outside, "type", "veth", "peer", "name", self.inside)
        _ip("link", "set", self.inside, "netns", self.name)
        _ip("addr", "add", f"10.{subnet}.{shard}.1/30", "dev", self.outside)
        _ip("link", "set", self.outside, "up")
        for command in (("addr", "add", f"{self.address}/30", "dev", self.inside), ("link", "set", self.inside, "up"),
                        ("link", "set", "lo", "up")):
            _ip("netns", "exec", self.name, "ip", *command)
        environment = {**os.environ, "TRACKER_ADMIN_TOKEN": ADMIN_TOKEN, "TRACKER_SPARK": "0",
                       "TRACKER_FLUSH_SECONDS": "0.2", "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(log, "ab") as out:
            # `ip netns exec` execs the command: this pid is `tracker shard`'s supervisor.
            self.process = subprocess.Popen(
                ["ip", "netns", "exec", self.name, sys.executable, "-m", "tracker.cli", "shard", str(shard), "--host",
                 self.address, "--port", str(PORT), "--warehouse", str(warehouse)],
                cwd=SOURCE_ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT)

    def processes(self) -> list[int]:
        """The shard's supervisor and every process below it (hot path, sync process...)."""
        return [self.process.pid, *descendants(self.process.pid)] if self.process.poll() is None else []

    def gone(self) -> None:
        """The host disappears: its shard is killed, its link goes down and nothing sent to its
        address comes back (a blackhole route: with no route at all, this machine's default route
        could reach some other box answering for it)."""
        _ip("route", "add", "blackhole", f"{self.address}/32")  # first: no moment without a route to it
        self.blackholed = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        _ip("link", "set", self.outside, "down")

    def drop(self, on: bool = True, direction: str = "in") -> None:
        """Drop every packet of its shard's connections in one ``direction`` (an ``iptables``
        rule in its namespace), or (``on`` false) stop dropping them: ``in``, the packets
        arriving for its port (requests never arrive); ``out``, the packets leaving from it
        (requests arrive and are served, answers are lost)."""
        chain, match = {"in": ("INPUT", "--dport"), "out": ("OUTPUT", "--sport")}[direction]
        if on == (direction in self.dropping):
            return
        subprocess.run(["ip", "netns", "exec", self.name, "iptables", "-A" if on else "-D", chain, "-p", "tcp",
                        match, str(PORT), "-j", "DROP"], check=True, capture_output=True, timeout=10)
        (self.dropping.add if on else self.dropping.discard)(direction)

    def link(self, up: bool) -> None:
        """Take the link to this machine down (``ip link set ... down``: nothing passes either
        way) or up again. While it is down a blackhole route holds the host's address: the
        kernel drops the link's route with the link, and this machine's default route would
        otherwise carry the packets to whatever answers there (a sandbox's egress proxy answered
        HTTP 403 for it)."""
        if up:
            _ip("link", "set", self.outside, "up")
            if self.blackholed:
                _ip("route", "del", "blackhole", f"{self.address}/32")
                self.blackholed = False
            return
        if not self.blackholed:
            _ip("route", "add", "blackhole", f"{self.address}/32")  # first: no moment without a route to it
            self.blackholed = True
        _ip("link", "set", self.outside, "down")

    def remove(self) -> None:
        """Stop the shard (gracefully: its last Delta flush) and remove the rules, the namespace
        and the link. Never raises: what is already gone is skipped."""
        for pid in self.processes():  # a stopped process would not see the SIGTERM
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.blackholed:
            subprocess.run(["ip", "route", "del", "blackhole", f"{self.address}/32"], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.outside], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)  # its rules go with it
        self.dropping.clear()
