"""One log line for every process (the launcher and its api, the router, the gateway): the time,
the level and the logger before each message, as a log collector reads them."""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# HTTP clients whose info and debug lines are one per request our own polls make
_CHATTY = ("httpx", "httpcore")


def configure_logging(level: str) -> None:
    """Log at ``level`` (a --log-level name) and above to stderr, in LOG_FORMAT; the HTTP
    clients' warnings and errors only."""
    logging.basicConfig(level=getattr(logging, level.upper()), format=LOG_FORMAT, stream=sys.stderr)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
