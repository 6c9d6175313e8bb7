"""Clean: turn what a page shows into typed values, with well-kept libraries.

Each stored field names its cleaner (``clean=`` on the ``Field``): ``text`` (entities, tags,
whitespace), ``price`` (price-parser: Decimal + ISO currency into the field named by
``currency_field``, default ``currency``), ``date`` (dateparser: ISO 8601, UTC), ``url`` (w3lib:
canonical, absolute). A value that is present but cannot be cleaned is recorded as a problem
for the validate pipeline, with the raw value, never silently replaced by nothing.

Defaults per crawl: ``CLEAN_DEFAULT_CURRENCY`` (for a bare ``$``), ``CLEAN_DATE_ORDER`` (e.g.
``DMY`` for ``01/02/2026``), ``CLEAN_TIMEZONE`` (for times without an offset). A spider
overrides each with the attribute ``default_currency``, ``date_order`` or ``timezone``.
"""

from __future__ import annotations

import copy
from typing import Any

from ..cleaning import canonical_url, clean_text, parse_date, parse_price
from ..items.base import StoredItem


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


class CleanPipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        settings = crawler.settings
        self.default_currency = settings.get("CLEAN_DEFAULT_CURRENCY") or None
        self.date_order = settings.get("CLEAN_DATE_ORDER") or None
        self.timezone = settings.get("CLEAN_TIMEZONE") or "UTC"

    @classmethod
    def from_crawler(cls, crawler: Any) -> "CleanPipeline":
        return cls(crawler)

    def _option(self, name: str, default: Any) -> Any:
        return getattr(self.crawler.spider, name, None) or default

    def process_item(self, item: Any) -> Any:
        if not isinstance(item, StoredItem):
            return item
        item._raw = copy.deepcopy(dict(item))
        problems: list[str] = []
        if not _present(item.get("source")) and "source" in item.fields:
            item["source"] = self.crawler.spider.name
        for name, meta in item.fields.items():
            kind = meta.get("clean")
            if not kind or name not in item:
                continue
            raw = item[name]
            if kind == "text":
                item[name] = clean_text(raw)
            elif kind == "url":
                item[name] = canonical_url(raw)
                if _present(raw) and item[name] is None:
                    problems.append(f"{name}: not an http(s) URL: {str(raw)[:200]!r}")
            elif kind == "date":
                item[name] = parse_date(
                    raw,
                    date_order=self._option("date_order", self.date_order),
                    timezone=self._option("timezone", self.timezone),
                )
                if _present(raw) and item[name] is None:
                    problems.append(f"{name}: not a date: {str(raw)[:200]!r}")
            elif kind == "price":
                currency_field = meta.get("currency_field", "currency")
                declared = clean_text(item.get(currency_field)) if currency_field in item.fields else None
                amount, currency = parse_price(raw, self._option("default_currency", self.default_currency))
                item[name] = amount
                if _present(raw) and amount is None:
                    problems.append(f"{name}: not a price: {str(raw)[:200]!r}")
                if currency_field in item.fields:
                    item[currency_field] = (declared or currency or "").upper() or None
            else:
                raise ValueError(f"{type(item).__name__}.{name}: unknown cleaner {kind!r}")
        item._problems = problems
        return item
