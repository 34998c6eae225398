"""Browser-facing protections: the security headers of every HTTP answer, and the redaction of
tokens from log lines.

Guarantees: every HTTP answer of ``tracker serve`` carries :data:`HEADERS` (uvicorn writes them
with the status line, as its own default headers, so they cost no middleware on the hot path and
reach the 413, 431 and 408 answers too); a log line never holds the value of a query parameter
whose name ends in ``token`` (``token=``, ``access_token=``...), ``secret``, ``password`` or
``key``, nor of a ``Bearer`` credential.

The policy allows only the service's own scripts, styles, images and connections, no plugins, no
framing (``frame-ancestors 'none'`` and ``X-Frame-Options: DENY``, against clickjacking), no
inline script anywhere (the dashboard and ``/docs`` load theirs from ``/static``), and one inline
style by its hash: the rule Cytoscape.js inserts into the page,
``.__________cytoscape_container { position: relative; }``.

>>> redact('127.0.0.1:5 - "WebSocket /v1/dataflows/d/ws?subscribe=false&token=abc-_1" [accepted]')
'127.0.0.1:5 - "WebSocket /v1/dataflows/d/ws?subscribe=false&token=[redacted]" [accepted]'
>>> redact("/ws?access_token=abc&x=1 and /ws?API_KEY=k")
'/ws?access_token=[redacted]&x=1 and /ws?API_KEY=[redacted]'
>>> redact("Authorization: Bearer s3cr.et")
'Authorization: Bearer [redacted]'
>>> dict(HEADERS)["X-Frame-Options"]
'DENY'
"""

from __future__ import annotations

import re

_CYTOSCAPE_STYLE = "'sha256-pgvDUBa4IjFA2yuSJ2cqcyxmNYJMborsd0ORcRv9vw8='"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' " + _CYTOSCAPE_STYLE + "; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
"""The Content-Security-Policy of every answer (the dashboard's assets are vendored: no CDN)."""
HEADERS = [
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
]
"""Headers of every HTTP answer (``uvicorn.Config(headers=...)``)."""
_TOKEN = re.compile(r"(?i)((?:[?&]|%3F|%26)[\w.-]*(?:token|secret|password|key)=)[^&\s\"'#\\]*"
                    r"|(\bbearer\s+)[^\s\"',;\\]+")


def redact(text: str) -> str:
    """``text`` with secret values replaced by ``[redacted]`` (text, not its JSON: a value is
    taken up to the next quote, and in JSON the backslash escaping that quote would go too)."""
    return _TOKEN.sub(lambda m: (m.group(1) or m.group(2)) + "[redacted]", text)
