"""Tokens: the admin token, which may do everything, and one token per dataflow, which
may read and write only that dataflow.

>>> Principal(admin=False, dataflow_id="d1").may_access("d2")
False
>>> matches(token_hash("secret"), token_hash("secret"))
True

Tokens are ``secrets.token_urlsafe(32)``; only their SHA-256 is kept (in memory and in the
write-ahead log), and a presented token is compared by hashing it and using
``hmac.compare_digest`` against the stored hash, so neither a leaked log nor response timing
reveals a token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Principal:
    """Who is calling: the admin, or the holder of one dataflow's token."""

    admin: bool
    dataflow_id: str | None = None

    def may_access(self, dataflow_id: str) -> bool:
        """True iff this principal may read and write ``dataflow_id``."""
        return self.admin or self.dataflow_id == dataflow_id


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
