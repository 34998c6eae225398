"""The front's process: ``python -m api.run.front``, started (and restarted) by ``tracker serve``'s
supervisor when the service has several shards, never by hand.

It serves :func:`api.web.front.create_front` with uvicorn on the socket the supervisor passes
(``TRACKER_LISTEN_FD``: a loopback port HAProxy sends the front's routes to, or the public
address when no HAProxy runs), heartbeats to the supervisor and dies with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys

import uvicorn

from api.channel.supervised import Supervised
from api.config import Settings
from api.run.hot import LISTEN_FD_ENV, SETTINGS_ENV
from api.run.server import configure_logging
from api.shards.layout import Shard
from api.web.front import create_front
from api.web.security import HEADERS

SHARDS_ENV = "TRACKER_SHARDS_JSON"
"""The front's shards, ``[{"index", "endpoint", "local"}]``."""
PROXIED_ENV = "TRACKER_PROXIED"
"""``1`` when HAProxy routes the dataflows' requests (the front then never sees them)."""


def main() -> int:
    """Serve the front with the settings, shards and socket the supervisor passed; the exit code."""
    supervised = Supervised.from_env()
    supervised.watch_parent()
    settings = Settings.from_json(os.environ.pop(SETTINGS_ENV))
    configure_logging(settings.log_level)
    shards = [Shard(int(s["index"]), str(s["endpoint"]), bool(s["local"]))
              for s in json.loads(os.environ.pop(SHARDS_ENV))]
    listener = socket.socket(fileno=int(os.environ.pop(LISTEN_FD_ENV)))
    app = create_front(shards, proxied=os.environ.pop(PROXIED_ENV, "0") == "1", supervised=supervised.beat,
                       settings=settings)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=2,
                            headers=HEADERS)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises the SIGINT it stopped for again
        uvicorn.Server(config).run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
