"""Scrapy's log formatter, with a dropped item as one line (``LOG_FORMATTER``).

Scrapy logs a dropped item with the whole item under the reason, at the drop's level: every
reject of a crawl is then a screenful at INFO. Here the reason and the page are the line at that
level, and the item follows at DEBUG.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import logformatter
from scrapy.http import Response

logger = logging.getLogger(__name__)


class LogFormatter(logformatter.LogFormatter):
    def dropped(
        self, item: Any, exception: BaseException, response: Any, spider: Any
    ) -> logformatter.LogFormatterResult:
        result = super().dropped(item, exception, response, spider)
        if result["level"] <= logging.DEBUG:
            return result
        logger.debug("Dropped item: %s", item)
        page = response.url if isinstance(response, Response) else getattr(item, "_origin", None)
        return {
            "level": result["level"],
            "msg": "Dropped: %(exception)s%(page)s",
            "args": {"exception": exception, "page": f" on {page}" if page else ""},
        }
