"""The hot-path process: ``python -m api.run.hot``, started (and restarted) by ``tracker serve``'s
supervisor (:mod:`api.run.supervisor`), never by hand.

It serves the app with uvicorn on the listening socket the supervisor passes
(``TRACKER_LISTEN_FD``): ingest, the write-ahead log, the engine, publication, the streams and
the Delta thread. It never imports pyspark and holds no JVM; Spark's work goes to the Spark
process over the channel. It heartbeats to the supervisor from its event loop and dies with it.
"""

from __future__ import annotations

import os
import socket
import sys

from api.channel.supervised import Supervised
from api.config import Settings
from api.run.server import configure_logging, serve_hot

LISTEN_FD_ENV = "TRACKER_LISTEN_FD"
SETTINGS_ENV = "TRACKER_SETTINGS"


def main() -> int:
    """Serve with the settings and socket the supervisor passed; the exit code."""
    supervised = Supervised.from_env()
    supervised.watch_parent()
    settings = Settings.from_json(os.environ.pop(SETTINGS_ENV))
    configure_logging(settings.log_level)
    listener = socket.socket(fileno=int(os.environ.pop(LISTEN_FD_ENV)))
    return serve_hot(settings, listener, supervised)


if __name__ == "__main__":
    sys.exit(main())
