"""Bearer authentication over HTTP: the token of an ``Authorization`` header, and the 401 and
403 answers (the tokens themselves: :mod:`api.host.tokens`).

>>> bearer("Bearer abc")
'abc'
>>> unauthorized("no").status_code
401
"""

from __future__ import annotations

from fastapi import HTTPException


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or a 401."""
    if not authorization:
        raise unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("the Authorization header must be 'Bearer <token>'")
    return token.strip()


def bearer_or_none(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, ``None`` without a usable one
    (for open routes that show more to a token).

    >>> bearer_or_none(None), bearer_or_none("Bearer t")
    (None, 't')
    """
    try:
        return bearer(authorization)
    except HTTPException:
        return None


def unauthorized(detail: str) -> HTTPException:
    """A 401 with the ``WWW-Authenticate`` challenge."""
    return HTTPException(401, {"error": "unauthorized", "detail": detail}, headers={"WWW-Authenticate": "Bearer"})


def forbidden(detail: str) -> HTTPException:
    """A 403: a valid token that may not do this."""
    return HTTPException(403, {"error": "forbidden", "detail": detail})
