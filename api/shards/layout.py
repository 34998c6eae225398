"""The shards of one service: which run here and which on other hosts, where each is reached,
and each shard's part of the warehouse (``<warehouse>/_wal/shard-<k>/``: its write-ahead log
and its lock, :mod:`spark_jobs.ownership`).

>>> hosts = parse_shard_hosts("2=http://10.201.0.2:8101, 3=http://h3:8101/")
>>> hosts
{2: 'http://10.201.0.2:8101', 3: 'http://h3:8101'}
>>> [s.index for s in plan(2, hosts, "127.0.0.1", [8101, 8102])], plan(1, {}, "::", [9000])[0].endpoint
([0, 1, 2, 3], 'http://[::1]:9000')
>>> default_shards(2), default_shards(8)
(1, 4)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from api.shards.ids import MAX_SHARD
from spark_jobs.ownership import shard_directory


@dataclass(frozen=True)
class Shard:
    """One shard: its index, the base URL its dataflows' routes answer under (``endpoint``,
    what registrations and ``GET /v1/dataflows/{id}`` tell workers) and whether this
    supervisor runs it (else another host does: ``tracker shard``)."""

    index: int
    endpoint: str
    local: bool

    @property
    def address(self) -> tuple[str, int]:
        """The host and port of :attr:`endpoint` (what the proxy connects to)."""
        parts = urlsplit(self.endpoint)
        return parts.hostname or "127.0.0.1", parts.port or 80


def default_shards(cpus: int | None = None) -> int:
    """One shard per two cores, at least one (``--shards`` when not given)."""
    return max(1, (cpus if cpus is not None else os.cpu_count() or 1) // 2)


def url_of(host: str, port: int) -> str:
    """The URL a client reaches ``host:port`` at (a wildcard address is reached on loopback).

    >>> url_of("0.0.0.0", 8000), url_of("10.0.0.7", 80)
    ('http://127.0.0.1:8000', 'http://10.0.0.7:80')
    """
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def parse_shard_hosts(text: str) -> dict[int, str]:
    """``--shard-hosts``: shards on other hosts, ``K=URL`` items separated by commas (``URL``
    being the base URL ``tracker shard K`` answers at). Raises ``ValueError`` with one line."""
    found: dict[int, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        index, equals, url = item.partition("=")
        parts = urlsplit(url.strip())
        if not (equals and index.strip().isdigit() and parts.scheme == "http" and parts.hostname):
            raise ValueError(f"--shard-hosts: each item is K=http://HOST:PORT, got {item!r}")
        shard = int(index)
        if shard > MAX_SHARD or shard in found:
            raise ValueError(f"--shard-hosts: shard {shard} is out of range (0-{MAX_SHARD}) or listed twice")
        found[shard] = url.strip().rstrip("/")
    return found


def plan(local: int, remote: dict[int, str], advertise: str, ports: list[int]) -> list[Shard]:
    """Every shard, by index: shards ``0 .. local - 1`` run here, reached at ``advertise`` on
    ``ports`` (one each); ``remote`` lists the others. Raises ``ValueError`` if an index is both."""
    both = sorted(set(range(local)) & set(remote))
    if both:
        raise ValueError(f"shard {both[0]} is both run here (--shards {local} runs 0-{local - 1}) and listed in "
                         "--shard-hosts")
    shards = [Shard(k, url_of(advertise, ports[k]), True) for k in range(local)]
    shards += [Shard(k, url, False) for k, url in remote.items()]
    return sorted(shards, key=lambda s: s.index)


def wal_directory(warehouse: Path, shard: int) -> Path:
    """Shard ``shard``'s write-ahead log directory."""
    return shard_directory(warehouse, shard)


def logged_shards(warehouse: Path) -> set[int]:
    """The shards whose log the warehouse holds (the log from before shards counts as shard 0's)."""
    found = {0} if any((warehouse / "_wal").glob("wal-*.log")) else set()
    for directory in (warehouse / "_wal").glob("shard-*"):
        suffix = directory.name.removeprefix("shard-")
        if suffix.isdigit() and any(directory.glob("wal-*.log")):
            found.add(int(suffix))
    return found


def adopt_legacy_log(warehouse: Path) -> int:
    """Move the log written before shards (``<warehouse>/_wal/wal-*.log``) into shard 0's
    directory, where it is recovered as shard 0's; the number of segments moved. Only for the
    holder of shard 0's lock. A segment of the same name in both places (which no version of
    the service writes) is refused rather than overwritten.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "_wal").mkdir(); (root / "_wal" / "wal-000001.log").write_bytes(b"x")
    1
    >>> adopt_legacy_log(root), sorted(p.name for p in wal_directory(root, 0).iterdir())
    (1, ['wal-000001.log'])
    """
    legacy = sorted((warehouse / "_wal").glob("wal-*.log"))
    if not legacy:
        return 0
    target = wal_directory(warehouse, 0)
    target.mkdir(parents=True, exist_ok=True)
    clash = [p.name for p in legacy if (target / p.name).exists()]
    if clash:
        raise FileExistsError(f"{clash[0]} is both in {warehouse / '_wal'} and in {target}; move one aside")
    for path in legacy:
        os.rename(path, target / path.name)  # same directory tree: atomic, nothing copied
    for directory in (target, warehouse / "_wal"):  # the renames are durable before anything follows them
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return len(legacy)
