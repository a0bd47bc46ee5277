"""One log line for every process (the launcher and its api, the router, the gateway): the time,
the level and the logger before each message, as a log collector reads them."""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Log at ``level`` (a --log-level name) and above to stderr, in LOG_FORMAT."""
    logging.basicConfig(level=getattr(logging, level.upper()), format=LOG_FORMAT, stream=sys.stderr)
