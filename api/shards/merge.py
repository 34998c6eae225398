"""The front's merges of what every shard answers: their ``/metrics`` into one exposition (each
series labelled with its ``shard``) and their ``/healthz`` into one status.

Prometheus scrapes the front alone (one target, as with one shard); the alert rules
(``ops/prometheus/alerts.yml``) compare series label by label, so each shard's series alert on
their own, and ``tracker_shard_up`` says which shard did not answer the scrape.

>>> head = '# HELP a A\\n# TYPE a gauge\\n'
>>> text = merge_metrics({0: head + 'a 1.0\\n', 1: head + 'a{x="y"} 2.0\\n', 2: None})
>>> print(text, end="")
# HELP a A
# TYPE a gauge
a{shard="0"} 1.0
a{shard="1",x="y"} 2.0
# HELP tracker_shard_up Whether the shard answered this scrape (1) or not (0).
# TYPE tracker_shard_up gauge
tracker_shard_up{shard="0"} 1
tracker_shard_up{shard="1"} 1
tracker_shard_up{shard="2"} 0
"""

from __future__ import annotations

from typing import Any


def _labelled(line: str, shard: int) -> str:
    """A sample line with ``shard`` as its first label."""
    brace, space = line.find("{"), line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = line[brace + 1:]
        return f'{line[:brace]}{{shard="{shard}"{"" if rest.startswith("}") else ","}{rest}'
    return f'{line[:space]}{{shard="{shard}"}}{line[space:]}'


def merge_metrics(texts: dict[int, str | None]) -> str:
    """One Prometheus text exposition of every shard's (``None``: the shard did not answer):
    each family once, its samples from every shard together, each labelled ``shard``."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    for shard, text in sorted(texts.items()):
        header: list[str] = []
        samples: list[str] = []
        for line in (text or "").splitlines():
            if not line.strip():
                continue
            if line.startswith("# HELP "):
                name = line.split(" ", 3)[2]
                header, samples = families.setdefault(name, ([], []))
                if not header:
                    header.append(line)
            elif line.startswith("#"):
                if line.startswith("# TYPE ") and len(header) == 1:
                    header.append(line)
            else:
                samples.append(_labelled(line, shard))
    lines = [line for header, samples in families.values() for line in (*header, *samples)]
    lines += ["# HELP tracker_shard_up Whether the shard answered this scrape (1) or not (0).",
              "# TYPE tracker_shard_up gauge"]
    lines += [f'tracker_shard_up{{shard="{shard}"}} {0 if text is None else 1}'
              for shard, text in sorted(texts.items())]
    return "\n".join(lines) + "\n"


def merge_health(answers: dict[int, tuple[int, dict[str, Any]] | None], endpoints: dict[int, str]) -> dict[str, Any]:
    """``/healthz`` of the whole service from each shard's ``(status code, body)`` (``None``:
    no answer): ``ok`` when every shard is, ``degraded`` otherwise (a shard down, failed or
    degraded), with each shard's status and the first shard's ``engine`` and ``spark``.

    >>> merge_health({0: (200, {"status": "ok", "dataflows": 2, "engine": "e", "spark": "off"}), 1: None},
    ...              {0: "http://a", 1: "http://b"})["shards"][1]
    {'shard': 1, 'endpoint': 'http://b', 'status': 'unavailable'}
    """
    shards = []
    for shard, answer in sorted(answers.items()):
        entry: dict[str, Any] = {"shard": shard, "endpoint": endpoints[shard]}
        if answer is None:
            entry["status"] = "unavailable"
        else:
            entry.update(answer[1])
            entry["status"] = answer[1].get("status", "failed")
        shards.append(entry)
    first = next((s for s in shards if "engine" in s), {})
    return {"status": "ok" if all(s["status"] == "ok" for s in shards) else "degraded",
            "dataflows": sum(int(s.get("dataflows", 0)) for s in shards),
            "live_dataflows": sum(int(s.get("live_dataflows", 0)) for s in shards),
            "engine": first.get("engine"), "spark": first.get("spark"),
            **{k: v for k, v in first.items() if k.startswith("spark_")}, "delta": first.get("delta"),
            "shards": shards}
