"""``tracker watch ID_OR_NAME``: a live terminal view of one dataflow, from the service's REST API.

Every ``--interval`` seconds it reads ``GET /v1/dataflows/{id}/lag`` (each location's
frontier, how long it has waited, its oldest pointstamp) and, for each operator input still
waiting, ``GET .../frontier/explain`` at its earliest frontier time (the pointstamps holding it
back, with the worker that last reported each, its age and what it is), and redraws one screen; ``--once``
prints one frame and exits. Only httpx is needed: it runs wherever the worker SDK does.

Guarantee: an unreachable service, a refused token or an unknown dataflow is one line on
stderr and exit code 2, before anything is drawn.

>>> frame = render({"name": "demo", "id": "0123456789abcdef"}, {"version": 3, "at": 0.0,
...     "max_lag_seconds": 4.0, "locations": [{"location": {"node": 1, "port": 0, "kind": "target"},
...     "operator": "sum", "port": "in 0", "frontier": [[2]], "lag_seconds": 4.0, "oldest_pointstamp": None}]},
...     {"1:0:target": [{"count": 1, "operator": "input", "port": "out 0", "location": {"node": 0, "port": 0,
...     "kind": "source"}, "time": [2], "worker": "w0", "age_seconds": 4.0, "stall_kind": "held_capability"}]},
...     colour=False)
>>> line = frame.splitlines()[2]
>>> print(line[:56].rstrip())
sum #1                in 0      {(2)}          4.0 s
>>> print(line[56:])
1 × input out 0 (0,0,source)@(2) · worker w0 · 4.0 s · capability held
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from typing import Any

import httpx

from tracker.worker.client import ClientError, admin_token, service_url

MAX_EXPLAINED = 12
"""Waiting inputs explained per frame (one request each), the longest waiting first."""


class WatchError(Exception):
    """Why the view cannot be drawn, in one line for the user."""


def _token(args: argparse.Namespace) -> str:
    """``--token``, else ``TRACKER_TOKEN`` (a dataflow's or the admin token), else the admin token
    as every client command finds it (:func:`tracker.worker.client.admin_token`)."""
    return admin_token(args.token or os.environ.get("TRACKER_TOKEN", "").strip() or None, args.warehouse)


def _get(client: httpx.Client, path: str, **params: Any) -> Any:
    try:
        answer = client.get(path, params=params or None)
    except httpx.HTTPError as error:
        raise WatchError(f"cannot reach the service at {client.base_url}: {error or type(error).__name__}") from None
    if answer.status_code == 401:
        raise WatchError("the token was refused (401): set TRACKER_TOKEN to the admin token or the dataflow's token")
    if answer.status_code == 403:
        raise WatchError("this token belongs to another dataflow (403)")
    if answer.status_code != 200:
        raise WatchError(f"GET {path}: HTTP {answer.status_code} {answer.text[:200]}")
    return answer.json()


def resolve(client: httpx.Client, wanted: str) -> dict[str, Any]:
    """The listing entry of the dataflow whose id or name is ``wanted`` (an id prefix of at
    least 6 characters too)."""
    flows = _get(client, "/v1/dataflows")
    exact = [f for f in flows if f["id"] == wanted]
    named = exact or [f for f in flows if f["name"] == wanted] or (
        [f for f in flows if f["id"].startswith(wanted)] if len(wanted) >= 6 else [])
    if not named:
        raise WatchError(f"no dataflow with id or name {wanted!r} visible to this token")
    if len(named) > 1:
        ids = ", ".join(f["id"] for f in named)
        raise WatchError(f"{len(named)} dataflows are called {wanted!r} ({ids}): give the id")
    return named[0]


def _key(location: dict[str, Any]) -> str:
    scope = location.get("scope") or []
    prefix = ",".join(map(str, scope)) + "/" if scope else ""
    return f"{prefix}{location['node']}:{location['port']}:{location['kind']}"


def _where(location: dict[str, Any]) -> str:
    scope = location.get("scope") or []
    prefix = f"[{','.join(map(str, scope))}]" if scope else ""
    return f"{prefix}({location['node']},{location['port']},{location['kind']})"


def _times(times: list[list[int]]) -> str:
    return "{" + ", ".join("(" + ", ".join(map(str, t)) + ")" for t in times) + "}"


def _seconds(value: float | None, at_least: bool = False) -> str:
    """``4.0 s``; ``≥ 4.0 s`` when it counts from a restart (the service cannot know more)."""
    return "-" if value is None else f"{'≥ ' if at_least else ''}{value:.1f} s"


def _worker(name: str | None, at_least: bool) -> str:
    return name or ("unknown (before the restart)" if at_least else "-")


_KINDS = {"held_capability": "capability held", "unconsumed_messages": "not yet consumed",
          "undrained_count": "does not drain"}


def _kind(pointstamp: dict[str, Any]) -> str:
    """`` · <what it is>`` of a blocker or oldest pointstamp (:func:`api.ops.lag.stall_kind`)."""
    said = _KINDS.get(pointstamp.get("stall_kind") or "")
    return f" · {said}" if said else ""


def _paint(text: str, lag: float | None, colour: bool) -> str:
    if not colour or lag is None:
        return text
    code = "32" if lag < 5 else "33" if lag < 30 else "31"  # green, yellow, red: as the dashboard
    return f"\x1b[{code}m{text}\x1b[0m"


def fetch(client: httpx.Client, flow: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """One frame's data: the lag report and the blockers of the longest-waiting inputs."""
    base = f"/v1/dataflows/{flow['id']}"
    report = _get(client, base + "/lag")
    waiting = sorted((row for row in report["locations"] if row["frontier"] and row["location"]["kind"] == "target"),
                     key=lambda row: -(row["lag_seconds"] or 0.0))[:MAX_EXPLAINED]
    held: dict[str, list[dict[str, Any]]] = {}
    for row in waiting:
        where = row["location"]
        params = {"node": where["node"], "port": where["port"], "kind": where["kind"],
                  "time": ",".join(map(str, row["frontier"][0]))}
        if where.get("scope"):
            params["scope"] = ",".join(map(str, where["scope"]))
        held[_key(where)] = _get(client, base + "/frontier/explain", **params)["blockers"]
    return report, held


def render(flow: dict[str, Any], report: dict[str, Any], held: dict[str, list[dict[str, Any]]], *,
           colour: bool) -> str:
    """One screen: a title line, a header, then a line per location (operator, port, frontier,
    lag, what holds it back)."""
    stamp = datetime.fromtimestamp(report["at"]).strftime("%H:%M:%S") if report["at"] else ""
    lines = [f"{flow['name']}  {flow['id']}  version {report['version']}  max lag "
             f"{_seconds(report['max_lag_seconds'], report.get('max_lag_at_least', False))}  {stamp}".rstrip(),
             f"{'OPERATOR':<21} {'PORT':<9} {'FRONTIER':<14} {'LAG':<8} HELD BACK BY"]
    for row in report["locations"]:
        where = row["location"]
        scope = where.get("scope") or []
        operator = (f"[{','.join(map(str, scope))}] " if scope else "") + f"{row['operator']} #{where['node']}"
        blockers = held.get(_key(where))
        if blockers is None:
            first = row["oldest_pointstamp"]
            blame = "" if first is None else (
                f"holds ({', '.join(map(str, first['time']))}) · worker "
                f"{_worker(first['worker'], first.get('age_at_least', False))}"
                f" · {_seconds(first['age_seconds'], first.get('age_at_least', False))}{_kind(first)}")
        else:
            blame = "; ".join(
                f"{b['count']} × {b['operator']} {b['port']} {_where(b['location'])}@({', '.join(map(str, b['time']))})"
                f" · worker {_worker(b['worker'], b.get('age_at_least', False))} · "
                f"{_seconds(b['age_seconds'], b.get('age_at_least', False))}{_kind(b)}"
                for b in blockers[:3]) or "nothing"
            if len(blockers) > 3:
                blame += f"; +{len(blockers) - 3} more"
        lag = _paint(f"{_seconds(row['lag_seconds'], row.get('lag_at_least', False)):<8}", row["lag_seconds"], colour)
        lines.append(f"{operator:<21} {row['port']:<9} {_times(row['frontier']):<14} {lag} {blame}".rstrip())
    return "\n".join(lines)


def watch(args: argparse.Namespace) -> int:
    """Run ``tracker watch``; the exit code."""
    try:
        token = _token(args)
        with httpx.Client(base_url=service_url(args.url, args.warehouse), headers={"Authorization": f"Bearer {token}"},
                          timeout=10.0) as client:
            flow = resolve(client, args.dataflow)
            frame = render(flow, *fetch(client, flow), colour=not args.once and sys.stdout.isatty())
            if args.once:
                print(frame)
                return 0
            shown = frame
            while True:
                sys.stdout.write("\x1b[H\x1b[2J" + shown + "\n")  # home, clear: redraw in place
                sys.stdout.flush()
                time.sleep(args.interval)
                try:
                    frame = shown = render(flow, *fetch(client, flow), colour=sys.stdout.isatty())
                except WatchError as error:  # keep watching through a restart of the service
                    shown = f"{frame}\n\n{error} (retrying every {args.interval:g} s)"
    except (WatchError, ClientError) as error:
        print(f"tracker watch: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
