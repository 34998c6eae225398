"""``tracker sql "<query>"``: one SQL query to the service's ``POST /v1/sql``, its rows printed as
a table (or ``--json``, ``--csv``). Only httpx is needed: it runs wherever the worker SDK does.

The service and the token are found as ``tracker watch`` finds them (``--url``, ``TRACKER_URL``,
``<warehouse>/service-url``; ``--token``, ``TRACKER_TOKEN``, the admin token). ``--param
name=value`` binds ``$name`` (a whole number or a decimal one is sent as a number, anything else
as text).

Guarantee: a refused query, a limit reached, an unreachable service or a refused token is one
line on stderr and exit code 2 (a cut answer, ``truncated``, is printed, then said on stderr,
exit code 0).

>>> print(render({"columns": [{"name": "node", "type": "INTEGER"}, {"name": "operator", "type": "VARCHAR"}],
...               "rows": [[1, "map"], [12, None]]}))
node  operator
----  --------
   1  map
  12  NULL
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Any

import httpx

from tracker.worker.client import ClientError, add_service_options, admin_token, service_url


def param(text: str) -> tuple[str, str | int | float]:
    """``name=value`` of ``--param``: the value as a number when it is one.

    >>> param("id=abc"), param("limit=10"), param("since=2026-01-01")
    (('id', 'abc'), ('limit', 10), ('since', '2026-01-01'))
    """
    name, equals, value = text.partition("=")
    if not equals or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"must be name=value (name: letters, digits, _), got {text!r}")
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            continue
    return name, value


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


_NUMERIC = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
            "FLOAT", "DOUBLE", "DECIMAL")


def render(answer: dict[str, Any]) -> str:
    """The rows as a plain aligned table (numbers to the right)."""
    headers = [c["name"] for c in answer["columns"]]
    numeric = [c["type"].split("(")[0] in _NUMERIC for c in answer["columns"]]
    body = [[_cell(v) for v in row] for row in answer["rows"]]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric, strict=True))
        return "  ".join(padded).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in body)])


def sql(args: argparse.Namespace) -> int:
    """Run ``tracker sql``; the exit code."""
    def fail(message: str) -> int:
        print(f"tracker sql: error: {message}", file=sys.stderr)
        return 2

    query = sys.stdin.read() if args.query == "-" else args.query
    try:
        token = admin_token(args.token or os.environ.get("TRACKER_TOKEN", "").strip() or None, args.warehouse)
        url = service_url(args.url, args.warehouse)
    except ClientError as error:
        return fail(str(error))
    body: dict[str, Any] = {"query": query, "params": dict(args.param or [])}
    if args.max_rows is not None:
        body["max_rows"] = args.max_rows
    try:
        answer = httpx.post(f"{url}/v1/sql", json=body, headers={"Authorization": f"Bearer {token}"},
                            timeout=args.timeout, follow_redirects=True)
    except httpx.HTTPError as error:
        return fail(f"cannot reach the service at {url} ({error or type(error).__name__}); start it or point --url "
                    "/ TRACKER_URL at it")
    if answer.status_code != 200:
        try:
            refused = answer.json()
            detail = refused.get("detail")
            reason = f"{refused.get('error')}: {detail if isinstance(detail, str) else json.dumps(detail)}"
        except (ValueError, AttributeError):
            reason = answer.text[:300]
        return fail(f"HTTP {answer.status_code} {reason}")
    result = answer.json()
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow([c["name"] for c in result["columns"]])
        writer.writerows([_cell(v) if isinstance(v, list | dict) else v for v in row] for row in result["rows"])
    else:
        print(render(result))
        print(f"({result['row_count']} row{'s' if result['row_count'] != 1 else ''}, {result['seconds']:.3f} s)",
              file=sys.stderr)
    if result["truncated"]:
        print(f"tracker sql: the answer was cut at {result['row_limit']} rows (more were found): add a LIMIT, or "
              "narrow the query", file=sys.stderr)
    return 0


def add_sql_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sql`` to the ``tracker`` command's sub-parsers."""
    parser = commands.add_parser("sql", help="run a read-only SQL query (DuckDB) over the service's live state and "
                                 "its Delta tables (docs/tables.md, \"SQL\")")
    parser.add_argument("query", help="one SELECT; '-' reads it from standard input")
    parser.add_argument("--param", type=param, action="append", metavar="NAME=VALUE",
                        help="bind $NAME in the query (repeatable)")
    parser.add_argument("--max-rows", type=int, default=None, metavar="N",
                        help="rows printed at most (at most the service's TRACKER_SQL_ROWS)")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the service's JSON answer")
    shown.add_argument("--csv", action="store_true", help="print CSV (lists and structs as JSON)")
    add_service_options(parser, "; a dataflow's token sees its dataflow only")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the answer (default 120)")
    parser.set_defaults(func=sql)
