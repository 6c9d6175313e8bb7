"""Preview: validation for developer commands, with nothing written anywhere.

``scrapy parse --pipelines``, ``runspider`` and the other commands that are not crawl nodes
(see :mod:`scraper.shared_state`) clean items as a crawl does and check them against the same
declared schema, but there is no rejects table, no dedupe claim and no upsert behind them. An
invalid item is dropped with its reasons, exactly as a crawl would reject it. Items without a
storage contract (plain dicts) pass, since nothing is stored.
"""

from __future__ import annotations

from typing import Any

from scrapy.exceptions import DropItem

from ..items.base import StoredItem
from .validate import check, count_rejects


def reasons_for(item: Any) -> list[str]:
    """Why a crawl would reject *item* (empty when it would be stored)."""
    if isinstance(item, StoredItem):
        return check(item)
    return [f"{type(item).__name__} has no storage contract (use a StoredItem subclass)"]


def verdict(item: Any, dropped: str | None = None) -> str:
    """One line for a developer: would a crawl store *item*, and if not, why."""
    if dropped is not None:
        return dropped
    reasons = reasons_for(item)
    return f"not stored by a crawl: {'; '.join(reasons)}" if reasons else "valid: a crawl would store it"


class PreviewPipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Any) -> PreviewPipeline:
        return cls(crawler)

    def process_item(self, item: Any) -> Any:
        if not isinstance(item, StoredItem):
            # A plain dict from an ad-hoc spider (runspider -o out.jsonl): nothing is stored
            # here, so there is nothing to refuse; `scrapy parse --pipelines` says a crawl would.
            return item
        reasons = check(item)
        if not reasons:
            return item
        count_rejects(self.crawler.stats, reasons)
        raise DropItem(f"Rejected ({'; '.join(reasons)})", log_level="INFO")
