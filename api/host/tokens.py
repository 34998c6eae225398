"""Tokens: the admin token, which may do everything; the program token, which may register
dataflows and then read and write those it registered, nothing else; and one token per
dataflow, which may read and write only that dataflow.

>>> Principal(admin=False, dataflow_id="d1").may_access("d2")
False
>>> matches(token_hash("secret"), token_hash("secret"))
True

A dataflow registered with the program token gets as its own token one derived from the program
token and its id (:func:`program_dataflow_token`), so the program token's holder owns exactly the
dataflows whose stored token hash is that of the derived token: the service needs no record of
who registered what, a restart keeps it, and a changed program token owns none of the old ones.

>>> program = Principal(admin=False, program="p-secret")
>>> mine = token_hash(program_dataflow_token("p-secret", "d1"))
>>> program.may_access("d1", mine), program.may_access("d2", mine), program.may_access("d1", None)
(True, False, False)
>>> program.role, program.may_register, Principal(admin=False, dataflow_id="d1").may_register
('program', True, False)

Tokens are ``secrets.token_urlsafe(32)``; only their SHA-256 is kept (in memory and in the
write-ahead log), and a presented token is compared by hashing it and using
``hmac.compare_digest`` against the stored hash, so neither a leaked log nor response timing
reveals a token.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import secrets
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def new_token() -> str:
    """A fresh random token."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """The stored form of a token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def matches(presented_hash: str, stored_hash: str) -> bool:
    """Constant-time comparison of two hashes."""
    return hmac.compare_digest(presented_hash.encode(), stored_hash.encode())


def program_dataflow_token(program_token: str, dataflow_id: str) -> str:
    """The token of dataflow ``dataflow_id`` when the program token registered it: an HMAC of the
    id under the program token (as strong as a random one to whoever lacks the program token).

    >>> program_dataflow_token("p", "d1") == program_dataflow_token("p", "d1") != program_dataflow_token("p", "d2")
    True
    """
    digest = hmac.new(program_token.encode(), b"dataflow:" + dataflow_id.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass(frozen=True)
class Principal:
    """Who is calling: the admin, the holder of the program token (``program``, the token
    itself: what its dataflows' tokens derive from), or the holder of one dataflow's token."""

    admin: bool
    dataflow_id: str | None = None
    program: str | None = field(default=None, repr=False)

    @property
    def role(self) -> str:
        """``admin``, ``program`` or ``dataflow``."""
        return "admin" if self.admin else "program" if self.program is not None else "dataflow"

    @property
    def may_register(self) -> bool:
        """Whether it may register dataflows (the admin and the program token)."""
        return self.admin or self.program is not None

    def may_access(self, dataflow_id: str, stored_hash: str | None = None) -> bool:
        """True iff this principal may read and write ``dataflow_id``, whose token's stored hash
        is ``stored_hash`` (what says whether the program token registered it; ``None``: unknown)."""
        if self.admin:
            return True
        if self.program is not None:
            return stored_hash is not None and matches(_derived_hash(self.program, dataflow_id), stored_hash)
        return self.dataflow_id == dataflow_id


@functools.lru_cache(maxsize=1 << 16)
def _derived_hash(program_token: str, dataflow_id: str) -> str:
    """The stored form of a program's dataflow token, remembered: the program token's listing
    checks every dataflow (an HMAC and a hash each, ~4 us: 4 ms per listing of 1,000 without it)."""
    return token_hash(program_dataflow_token(program_token, dataflow_id))


def load_program_token(warehouse: Path, configured: str | None) -> str:
    """The program token: ``TRACKER_PROGRAM_TOKEN`` if set, else ``<warehouse>/program-token``,
    generated (mode 0600) on first start. Several processes starting at once (the shards of one
    warehouse) agree on one: the file appears whole or not at all (a link), and whoever finds it
    there reads it. Announces the file, never the token.

    >>> import tempfile
    >>> where = Path(tempfile.mkdtemp())
    >>> first = load_program_token(where, None)
    >>> load_program_token(where, None) == first, load_program_token(where, "chosen")
    (True, 'chosen')
    """
    if configured:
        return configured
    path = warehouse / "program-token"
    token, made = shared_secret(path, new_token)
    if made:
        print(f"[tracker] generated a program token for programs' workers (set TRACKER_PROGRAM_TOKEN to choose "
              f"one); it is in {path}", file=sys.stderr, flush=True)
    return token


def shared_secret(path: Path, make: Callable[[], str]) -> tuple[str, bool]:
    """The secret in ``path`` (made by ``make``, mode 0600, if there is none yet) and whether
    this call made it. Several processes starting at once (the shards of one warehouse) agree
    on one: the file appears whole or not at all (a link), and whoever finds it there reads it.

    Raises:
        ValueError: the file is empty (say which).
    """
    made = False
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, draft = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")  # mode 0600
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(make() + "\n")
            os.link(draft, path)
            made = True
        except FileExistsError:
            pass  # another process made it first: its secret is the one
        finally:
            os.unlink(draft)
    secret = path.read_text().strip()
    if not secret:
        raise ValueError(f"{path} is empty: delete it to have a new one made")
    return secret, made


def load_admin_token(warehouse: Path, configured: str | None) -> str:
    """The admin token: ``TRACKER_ADMIN_TOKEN`` if set, else ``<warehouse>/admin-token``,
    generated (mode 0600) on first start. Announces the file, never the token, in logs."""
    if configured:
        return configured
    path = warehouse / "admin-token"
    if path.exists():
        token = path.read_text().strip()
        if token:
            print(f"[tracker] admin token: read from {path}", file=sys.stderr, flush=True)
            return token
    warehouse.mkdir(parents=True, exist_ok=True)
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    # Printed once, to the terminal that started the service; it is never logged afterwards.
    print(f"[tracker] generated an admin token (set TRACKER_ADMIN_TOKEN to choose one); it is in {path}:\n"
          f"[tracker]   {token}", file=sys.stderr, flush=True)
    return token
