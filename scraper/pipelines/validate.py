"""Validate: check each item against the schema its type declares; reject with reasons.

An invalid item is written to the ``rejects`` table (reasons, the raw item as scraped, the page)
and dropped; the crawl goes on. The item is only dropped once its reject is committed, so an
invalid item is never simply lost. Items that declare no storage contract are rejected too:
storing them is impossible, and silently dropping them would hide a spider bug.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from typing import Any

from itemadapter import ItemAdapter
from scrapy.exceptions import DropItem
from scrapy.utils.defer import maybe_deferred_to_future

from ..items.base import StoredItem
from ..storage.owner import writer_for
from ..storage.writer import DatabaseUnavailable, WriteFailed
from .unstored import set_aside

logger = logging.getLogger(__name__)


def check(item: StoredItem) -> list[str]:
    """Every reason *item* violates its declared schema (empty when valid)."""
    try:
        return _check(item)
    except Exception as exc:  # a value no rule foresaw must still end as a reject, not be lost
        return [f"item: cannot be validated ({type(exc).__name__}: {exc})"]


_Rule = tuple[str, bool, Any, Any, Any, Any]
_rules: dict[type, tuple[tuple[_Rule, ...], dict[str, str]]] = {}


def _rules_for(item_type: type[StoredItem]) -> tuple[tuple[_Rule, ...], dict[str, str]]:
    """The schema of *item_type* read once: (field, required, type, max_length, pattern,
    minimum) per field, and each price field's currency field."""
    found = _rules.get(item_type)
    if found is None:
        rules = tuple(
            (
                name,
                bool(meta.get("required")),
                meta.get("type"),
                meta.get("max_length"),
                re.compile(meta["pattern"]) if meta.get("pattern") is not None else None,
                meta.get("minimum"),
            )
            for name, meta in item_type.fields.items()
        )
        found = _rules[item_type] = (rules, item_type.price_fields())
    return found


def _check(item: StoredItem) -> list[str]:
    reasons = list(getattr(item, "_problems", []))
    rules, currencies = _rules_for(type(item))
    flagged: set[str] = set()
    if reasons:
        flagged = {r.split(":", 1)[0] for r in reasons}
        # A price that failed to parse explains its missing currency; one reason is enough.
        flagged |= {currency for name, currency in currencies.items() if name in flagged}
    values = item._values
    for name, required, expected, max_length, pattern, minimum in rules:
        if name in flagged:
            continue
        value = values.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            if required:
                reasons.append(f"{name}: missing")
            continue
        if expected is not None and not isinstance(value, expected):
            reasons.append(f"{name}: expected {expected.__name__}, got {type(value).__name__}")
            continue
        if type(value) is list:  # a type=list field: its parts are what the text rules are for
            reasons.extend(_check_parts(name, value, max_length, pattern))
            continue
        if max_length is not None and isinstance(value, str) and len(value) > max_length:
            reasons.append(f"{name}: longer than {max_length} characters ({len(value)})")
        if pattern is not None and isinstance(value, str) and not pattern.fullmatch(value):
            reasons.append(f"{name}: {value[:50]!r} does not match {pattern.pattern}")
        if minimum is not None and value < minimum:
            reasons.append(f"{name}: {value} is below the minimum {minimum}")
    return reasons


def _check_parts(name: str, parts: list[Any], max_length: int | None, pattern: Any) -> list[str]:
    reasons = []
    for number, part in enumerate(parts, 1):
        if not isinstance(part, str):
            continue
        if max_length is not None and len(part) > max_length:
            reasons.append(f"{name}: part {number} longer than {max_length} characters ({len(part)})")
        if pattern is not None and not pattern.fullmatch(part):
            reasons.append(f"{name}: part {number} {part[:50]!r} does not match {pattern.pattern}")
    return reasons


def _json_safe(value: Any, depth: int = 0) -> Any:
    """What Postgres' jsonb takes: string keys, no NaN, no NUL, no lone surrogates; anything else
    as its text."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value.encode("utf-8", errors="replace").decode("utf-8").replace("\x00", "")
    if depth < 20 and isinstance(value, dict):
        return {_json_safe(str(k)): _json_safe(v, depth + 1) for k, v in value.items()}
    if depth < 20 and isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v, depth + 1) for v in value]
    return _json_safe(str(value)[:10_000])


def count_rejects(stats: Any, reasons: list[str]) -> None:
    """One rejected item, counted by each failing field (the metrics' ``reason`` label)."""
    for reason in reasons:
        stats.inc_value(f"item_rejected_reasons/{reason.split(':', 1)[0]}")
    stats.inc_value("item_rejected_count")


def reject_record(spider_name: str, item: Any, reasons: list[str]) -> dict[str, Any]:
    raw = _json_safe(getattr(item, "_raw", None) or ItemAdapter(item).asdict())
    reasons = [_json_safe(reason) for reason in reasons]
    url = raw.get("url") or getattr(item, "_origin", None)
    if not isinstance(url, str):
        url = getattr(item, "_origin", None)
    item_type = type(item).__name__
    body = json.dumps(raw, sort_keys=True, default=str, ensure_ascii=False)
    ident = hashlib.sha1(f"{spider_name}\0{item_type}\0{url}\0{'; '.join(reasons)}\0{body}".encode()).hexdigest()
    return {
        "id": ident,
        "spider": spider_name,
        "item_type": item_type,
        "url": str(url) if url else None,
        "reasons": "; ".join(reasons),
        "item": raw,
    }


class ValidatePipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.writer = writer_for(crawler)

    @classmethod
    def from_crawler(cls, crawler: Any) -> ValidatePipeline:
        return cls(crawler)

    async def process_item(self, item: Any) -> Any:
        if isinstance(item, StoredItem):
            reasons = check(item)
        else:
            reasons = [f"{type(item).__name__} has no storage contract (use a StoredItem subclass)"]
        if not reasons:
            return item
        await reject(self.crawler, self.writer, item, reasons)


async def reject(crawler: Any, writer: Any, item: Any, reasons: list[str]) -> None:
    """Write *item* to the rejects with its *reasons* and drop it (raises DropItem), or set it
    aside as a dead letter when the rejects cannot be written."""
    count_rejects(crawler.stats, reasons)
    try:
        await maybe_deferred_to_future(writer.add_reject(reject_record(crawler.spider.name, item, reasons)))
    except WriteFailed as exc:
        raise set_aside(crawler, item, exc, stop=isinstance(exc, DatabaseUnavailable)) from None
    raise DropItem(f"Rejected ({'; '.join(reasons)})", log_level="INFO")
