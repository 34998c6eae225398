"""The service as the ``tracker`` client commands see it: where it is, their token, and the
few calls they make (register, list, read, delete), each failing with one readable line.

Where the service is: ``--url``, else ``TRACKER_URL``, else the URL a running ``tracker serve``
wrote to ``<warehouse>/service-url``, else ``http://127.0.0.1:8000``. The commands that run
programs (``tracker run``, ``tracker example``) use the *program token*, which may register
dataflows and then read and write those it registered, nothing else: ``--token``, else
``TRACKER_PROGRAM_TOKEN``, else the file the service generated, ``<warehouse>/program-token``.
The others (``tracker dataflows``, ``delete``, ``watch``) use the admin token: ``--token``, else
``TRACKER_ADMIN_TOKEN``, else ``<warehouse>/admin-token``. The warehouse: ``--warehouse``, else
``TRACKER_WAREHOUSE``, else ``./warehouse``. No worker process ever gets either: workers post
with their dataflow's own token.

Guarantee: every failure is a :class:`ClientError` whose message is one line saying what went
wrong and what to do (the commands print it and exit with code 2); nothing here prints.

>>> admin_token(None, "/nonexistent", env={})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tracker.worker.client.ClientError: no admin token: ... (--warehouse; /nonexistent/admin-token does not exist)
>>> program_token(None, "/nonexistent", env={"TRACKER_PROGRAM_TOKEN": "p", "TRACKER_ADMIN_TOKEN": "a"})
'p'
>>> program_token(None, "/nonexistent", env={"TRACKER_ADMIN_TOKEN": "a"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tracker.worker.client.ClientError: no program token: ... (--warehouse; /nonexistent/program-token does not exist)
>>> service_url(None, env={"TRACKER_URL": "http://10.0.0.7:9000/"})
'http://10.0.0.7:9000'
>>> service_url(None, "/nonexistent", env={})
'http://127.0.0.1:8000'
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


class ClientError(RuntimeError):
    """A one-line reason why a client command cannot go on (exit code 2)."""


def add_service_options(parser: argparse.ArgumentParser, token_note: str = "") -> None:
    """``--url``, ``--token`` and ``--warehouse`` as :func:`service_url` and :func:`admin_token`
    resolve them (``token_note``: what else a command says of its token)."""
    parser.add_argument("--url", help="the service (env TRACKER_URL, else the URL in <warehouse>/service-url; "
                        "default http://127.0.0.1:8000)")
    parser.add_argument("--token", help="the admin token or a dataflow's (default: env TRACKER_TOKEN, else "
                        f"TRACKER_ADMIN_TOKEN, else <warehouse>/admin-token){token_note}")
    parser.add_argument("--warehouse", help="where to find the service's URL and the generated admin token when not "
                        "given (env TRACKER_WAREHOUSE; default ./warehouse)")


def service_url(explicit: str | None, warehouse: str | Path | None = None, env: Mapping[str, str] = os.environ
                ) -> str:
    """``explicit``, else ``TRACKER_URL``, else the first line of ``<warehouse>/service-url`` (what
    ``tracker serve`` writes once it serves), else :data:`DEFAULT_URL` (no trailing slash)."""
    found = explicit or env.get("TRACKER_URL")
    if not found:
        try:
            found = (_warehouse(warehouse, env) / "service-url").read_text().strip()
        except OSError:
            found = None
    return (found or DEFAULT_URL).rstrip("/")


def _warehouse(warehouse: str | Path | None, env: Mapping[str, str]) -> Path:
    return Path(warehouse or env.get("TRACKER_WAREHOUSE") or "./warehouse")


def admin_token(explicit: str | None, warehouse: str | Path | None, env: Mapping[str, str] = os.environ) -> str:
    """``explicit``, else ``TRACKER_ADMIN_TOKEN``, else the first line of ``<warehouse>/admin-token``.

    Raises:
        ClientError: none of them gives a token.
    """
    return _token("admin", explicit, warehouse, env)


def program_token(explicit: str | None, warehouse: str | Path | None, env: Mapping[str, str] = os.environ) -> str:
    """``explicit``, else ``TRACKER_PROGRAM_TOKEN``, else the first line of ``<warehouse>/program-token``
    (never the admin token: a program does not need it).

    Raises:
        ClientError: none of them gives a token.
    """
    return _token("program", explicit, warehouse, env)


def _token(role: str, explicit: str | None, warehouse: str | Path | None, env: Mapping[str, str]) -> str:
    token = explicit or env.get(f"TRACKER_{role.upper()}_TOKEN")
    if token:
        return token
    path = _warehouse(warehouse, env) / f"{role}-token"
    try:
        token = path.read_text().strip()
    except OSError as error:
        why = "does not exist" if isinstance(error, FileNotFoundError) else f"cannot be read ({error.strerror})"
        raise ClientError(f"no {role} token: pass --token, set TRACKER_{role.upper()}_TOKEN, or run where the "
                          f"service's warehouse is (--warehouse; {path} {why})") from None
    if not token:
        raise ClientError(f"no {role} token: {path} is empty")
    return token


@dataclass(frozen=True)
class Admin:
    """Calls to the service at ``url`` with ``token``, the ``role`` token (``admin``, or
    ``program``: registering and reading its own dataflows only)."""

    url: str
    token: str
    timeout: float = 30.0
    role: str = "admin"

    def _call(self, method: str, path: str, attempts: int = 1, headers: dict[str, str] | None = None,
              **kwargs: Any) -> httpx.Response:
        """The answer to one request, sent again after a transport error up to ``attempts`` times
        in all (only for requests safe to repeat: reads, and registrations with their key)."""
        for attempt in range(attempts):
            try:
                answer = httpx.request(method, f"{self.url}{path}", timeout=self.timeout,
                                       headers={"Authorization": f"Bearer {self.token}", **(headers or {})}, **kwargs)
                break
            except httpx.TransportError as error:
                if attempt + 1 < attempts:
                    time.sleep(0.5 * 2 ** attempt)
                    continue
                raise ClientError(f"cannot reach the service at {self.url} ({_reason(error)}); start it (bin/serve) "
                                  "or point --url / TRACKER_URL at it") from None
        role = self.role
        if answer.status_code == 401:
            raise ClientError(f"the service at {self.url} refused the {role} token (401); use the one it was "
                              f"started with: --token, TRACKER_{role.upper()}_TOKEN or <warehouse>/{role}-token"
                              ) from None
        if answer.status_code == 403:
            raise ClientError(f"the service at {self.url} refused the token (403): {_detail(answer)}")
        return answer

    def check(self) -> None:
        """Raise :class:`ClientError` unless the service answers and takes the token."""
        self.dataflows()

    def register(self, body: dict[str, Any]) -> tuple[str, str]:
        """``POST /v1/dataflows``: the new dataflow's ``(id, token)``."""
        registered = self.enrol(body)
        return registered.id, registered.token

    def enrol(self, body: dict[str, Any]) -> Registered:
        """``POST /v1/dataflows``: the new dataflow's id, token and ``endpoint`` (its shard's base
        URL, where its workers connect without the proxy's hop; the service's URL when the
        answer has none)."""
        # The same key on every attempt: one that got in but whose answer was lost is answered
        # again as the first time, not registered twice.
        answer = self._call("POST", "/v1/dataflows", attempts=3, headers={"Idempotency-Key": uuid.uuid4().hex},
                            json=body)
        if answer.status_code != 201:
            raise ClientError(f"registration refused ({answer.status_code}): {_detail(answer)}")
        data = answer.json()
        return Registered(data["id"], data["token"], str(data.get("endpoint") or self.url).rstrip("/"))

    def dataflows(self, state: str | None = None, name: str | None = None) -> list[dict[str, Any]]:
        """``GET /v1/dataflows`` with its filters (oldest first)."""
        params = {k: v for k, v in (("state", state), ("name", name)) if v is not None}
        answer = self._call("GET", "/v1/dataflows", params=params)
        if answer.status_code != 200:
            raise ClientError(f"listing refused ({answer.status_code}): {_detail(answer)}")
        found: list[dict[str, Any]] = answer.json()
        return found

    def dataflow(self, dataflow_id: str) -> dict[str, Any]:
        """``GET /v1/dataflows/{id}``."""
        answer = self._call("GET", f"/v1/dataflows/{dataflow_id}")
        if answer.status_code != 200:
            raise ClientError(f"no dataflow {dataflow_id!r} ({answer.status_code}): {_detail(answer)}")
        found: dict[str, Any] = answer.json()
        return found

    def resolve(self, name_or_id: str) -> str:
        """The id of the dataflow with this id, else of the one (not deleted) with this name.

        Raises:
            ClientError: no such dataflow, or several have that name (the message lists their ids).
        """
        every = self.dataflows() + self.dataflows(state="deleted")
        if any(d["id"] == name_or_id for d in every):
            return name_or_id
        named = [d for d in every if d["name"] == name_or_id and d["state"] != "deleted"]
        if len(named) == 1:
            return str(named[0]["id"])
        if not named:
            raise ClientError(f"no dataflow has the id or name {name_or_id!r} (tracker dataflows lists them)")
        raise ClientError(f"{len(named)} dataflows are named {name_or_id!r}; give one id: "
                          + ", ".join(d["id"] for d in named))

    def delete(self, dataflow_id: str) -> None:
        """``DELETE /v1/dataflows/{id}``."""
        answer = self._call("DELETE", f"/v1/dataflows/{dataflow_id}")
        if answer.status_code != 204:
            raise ClientError(f"delete refused ({answer.status_code}): {_detail(answer)}")


class Registered(NamedTuple):
    """A registered dataflow: its id, its token and its shard's base URL (``endpoint``)."""

    id: str
    token: str
    endpoint: str


def register(url: str, token: str, body: dict[str, Any]) -> tuple[str, str]:
    """Register the dataflow ``body`` (``Dataflow.registration(workers)``, or a hand-written
    body) with ``token`` (the program token, or the admin token); its ``(id, token)``.

    Raises:
        ClientError: the service cannot be reached, refuses the token or the graph.
    """
    return Admin(url.rstrip("/"), token).register(body)


def connect(url: str | None, token: str | None, warehouse: str | None, *, role: str = "admin") -> Admin:
    """The service (``--url``/``TRACKER_URL``/``<warehouse>/service-url``) with the ``role`` token
    (``--token``, ``TRACKER_ADMIN_TOKEN`` or ``<warehouse>/admin-token``; for ``program``,
    ``TRACKER_PROGRAM_TOKEN`` or ``<warehouse>/program-token``), checked to answer and accept it.

    Raises:
        ClientError: no token, the service cannot be reached, or it refuses the token.
    """
    found = program_token(token, warehouse) if role == "program" else admin_token(token, warehouse)
    admin = Admin(service_url(url, warehouse), found, role=role)
    admin.check()
    return admin


def _reason(error: httpx.TransportError) -> str:
    text = str(error).strip() or type(error).__name__
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text.splitlines()[-1][:200]


def _detail(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:200]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("error") or body)[:300]
    return str(body)[:300]
