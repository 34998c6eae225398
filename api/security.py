"""Browser-facing protections: the security headers of every HTTP answer, and the redaction of
tokens from log lines.

Guarantees: every HTTP answer of the app carries :data:`HEADERS` (a route that sets its own
``Content-Security-Policy``, such as ``/docs``, keeps it); a log line never holds the value of a
``token=`` query parameter or of a ``Bearer`` credential.

The policy allows only the service's own scripts, styles, images and connections, no plugins, no
framing (``frame-ancestors 'none'`` and ``X-Frame-Options: DENY``, against clickjacking), and one
inline style by its hash: the rule Cytoscape.js inserts into the page,
``.__________cytoscape_container { position: relative; }``.

>>> redact('127.0.0.1:5 - "WebSocket /v1/dataflows/d/ws?subscribe=false&token=abc-_1" [accepted]')
'127.0.0.1:5 - "WebSocket /v1/dataflows/d/ws?subscribe=false&token=[redacted]" [accepted]'
>>> redact("Authorization: Bearer s3cr.et")
'Authorization: Bearer [redacted]'
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_CYTOSCAPE_STYLE = "'sha256-pgvDUBa4IjFA2yuSJ2cqcyxmNYJMborsd0ORcRv9vw8='"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' " + _CYTOSCAPE_STYLE + "; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
"""The Content-Security-Policy of every answer (the dashboard's assets are vendored: no CDN)."""
HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
"""Headers added to every HTTP answer, besides the Content-Security-Policy."""
_CSP_NAME = b"content-security-policy"
_TOKEN = re.compile(r"(?i)((?:[?&]|%3F|%26)token=)[^&\s\"'#]*|(\bbearer\s+)[^\s\"',;]+")


def redact(text: str) -> str:
    """``text`` with token values replaced by ``[redacted]``."""
    return _TOKEN.sub(lambda m: (m.group(1) or m.group(2)) + "[redacted]", text)


def csp_with_scripts(html: str) -> str:
    """:data:`CSP` allowing, by their hashes, the inline scripts of ``html`` (FastAPI's Swagger UI
    page starts Swagger UI with one), so that no ``'unsafe-inline'`` is needed.

    >>> "'sha256-" in csp_with_scripts("<script>go()</script>")
    True
    """
    hashes = [base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
              for body in re.findall(r"<script>(.*?)</script>", html, re.S)]
    allowed = " ".join(f"'sha256-{h}'" for h in hashes)
    return CSP.replace("script-src 'self'", f"script-src 'self' {allowed}".rstrip())


class SecurityHeaders:
    """ASGI middleware adding the Content-Security-Policy and :data:`HEADERS` to every HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.csp = CSP.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(name.lower() == _CSP_NAME for name, _ in headers):
                    headers.append((_CSP_NAME, self.csp))
                headers.extend(HEADERS)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
