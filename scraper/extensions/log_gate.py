"""Build no log record that no handler will take.

Scrapy lets every record through its loggers (the root logger at ``NOTSET``) and filters by
``LOG_LEVEL`` at its handler. At ``INFO``, each page still builds and throws away DEBUG records:
"Crawled (200) <GET …>" per response and "Scraped from …" per item, with their caller looked up
and, with secrets to redact (:mod:`scraper.runtime.secrets`), their text formatted: about 30 µs of CPU
per page on the demo shop. While the crawl runs, the ``scrapy`` and ``scraper`` loggers are
set to the lowest level a root handler takes, so those records are not made at all; a handler
that takes DEBUG (``LOG_LEVEL=DEBUG``, a test's log capture) keeps them all. The levels are put
back when the engine stops.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import signals

LOGGERS = ("scrapy", "scraper")


def lowest_handled_level() -> int:
    """The lowest level any handler on the root logger takes (NOTSET, 0, when one takes all)."""
    levels = [handler.level for handler in logging.root.handlers]
    return min(levels) if levels else logging.NOTSET


class LogGate:
    def __init__(self) -> None:
        self._saved: dict[str, int] = {}

    @classmethod
    def from_crawler(cls, crawler: Any) -> LogGate:
        ext = cls()
        crawler.signals.connect(ext.engine_started, signal=signals.engine_started)
        crawler.signals.connect(ext.engine_stopped, signal=signals.engine_stopped)
        return ext

    def engine_started(self) -> None:
        level = lowest_handled_level()
        if level <= logging.DEBUG:
            return
        for name in LOGGERS:
            logger = logging.getLogger(name)
            # Scrapy's own logging config sets "scrapy" to DEBUG; a higher level set on purpose stays.
            if logger.level <= logging.DEBUG:
                self._saved[name] = logger.level
                logger.setLevel(level)

    def engine_stopped(self) -> None:
        for name, level in self._saved.items():
            logging.getLogger(name).setLevel(level)
        self._saved.clear()
