"""Clean: turn what a page shows into typed values, with well-kept libraries.

Each stored field names its cleaner (``clean=`` on the ``Field``): ``text`` (entities, tags,
whitespace), ``price`` (price-parser: Decimal rounded to the currency's ISO 4217 minor unit, the
ISO code into the field named by ``currency_field``, default ``currency``), ``date``
(dateparser: UTC), ``availability`` (schema.org's term: ``InStock``, ``OutOfStock``...), ``url`` (w3lib: canonical, absolute). A value that is present but cannot be
cleaned is recorded as a problem for the validate pipeline, with the raw value, never silently
replaced by nothing; whatever goes wrong inside a cleaner is such a problem too, so an item
always ends as one row or one reject. Two exceptions: an optional date that cannot be read is
left empty and counted (``clean/unparsed/<field>``) unless it reads as several dates (a reject
naming them), and a currency field's symbol or name
(``€``, ``руб.``, ``euro``) is mapped to its code.

A one-element list (an ItemLoader without ``TakeFirst``, extruct's output) is cleaned as its
element; more than one element in a scalar field is a problem. Fields declared with
``join=True`` (a description read with ``getall()``) join their cleaned parts with a space instead,
``join="; "`` with that separator; fields declared ``type=list`` keep them apart, each part
cleaned as a value of the field (a single value becomes a list of one; empty parts are dropped,
and a list left empty is no value).

Numbers and dates are read by a locale (CLDR: the decimal and grouping symbols, the numeric date
order), or rejected with the reason. Which locale, first found wins: the page's request meta
``locale`` (one spider, many country stores), the spider's ``locale`` attribute, the page's
declared language (``Content-Language``, ``<html lang>``), the ``CLEAN_LOCALE`` setting. The
meta keys ``default_currency`` and ``date_order`` likewise override the spider's for one page.

Defaults per crawl: ``CLEAN_DEFAULT_CURRENCY`` (for a price with no currency mark at all),
``CLEAN_DATE_ORDER`` (e.g. ``MDY`` for ``01/02/2026``), ``CLEAN_TIMEZONE`` (for times without an
offset), ``DATE_LANGUAGES`` (e.g. ``de,en``). A spider overrides each with the attribute
``default_currency``, ``date_order``, ``timezone`` or ``date_languages``, and may set
``decimal_separator`` (also a ``Field`` option) when its prices use a known one. Without date
languages, and for a currency mark several currencies share, the page's declared language
(``Content-Language``, ``<html lang>``) decides.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from decimal import Decimal
from typing import Any

from ..cleaning import canonical_url, clean_text, read_date, read_price
from ..cleaning.availability import normalise_availability
from ..cleaning.currency import currency_of, territory_of
from ..cleaning.language import PAGE_KEYS, date_languages, declared_language
from ..item_observers import on_response_received
from ..items.base import StoredItem

# Pages whose declared language is remembered until their items are cleaned; items follow
# their page closely, so this only has to outlast the items in flight.
_LANGUAGE_MEMORY = 4096


_TEXT_LIKE = (str, int, float, Decimal, bytes, list, tuple)
_IMMUTABLE = (str, int, float, Decimal, bytes, type(None))


def _raw_copy(values: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of what a spider yields: strings and lists of strings are copied by hand
    (``copy.deepcopy`` cost ~0.1 ms per item, most of it on them), anything else deeply."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, _IMMUTABLE):
            out[name] = value
        elif type(value) is list and all(isinstance(v, _IMMUTABLE) for v in value):
            out[name] = list(value)
        else:
            out[name] = copy.deepcopy(value)
    return out


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


def _show(raw: Any) -> str:
    return repr(raw if isinstance(raw, str) else raw)[:200]


def _safe_text(value: Any) -> Any:
    """Strings Postgres can store: no NUL, no lone surrogates (which no encoding can write)."""
    if isinstance(value, str) and not value.isascii():
        value = value.encode("utf-8", errors="replace").decode("utf-8")
    return value.replace("\x00", "") if isinstance(value, str) else value


_PART_LIKE = (str, int, float, Decimal, bytes)


def _separator(meta: dict[str, Any]) -> str | None:
    join = meta.get("join")
    return join if isinstance(join, str) else (" " if join else None)


class _Plan:
    """What cleaning an item type takes, read once from its fields: each field's name, cleaner,
    what its parts are joined with (None: one value), whether they are kept as a list, and its
    declaration; its price fields and the currency field each fills."""

    def __init__(self, item_type: type[StoredItem]) -> None:
        self.fields = tuple(
            (name, meta.get("clean"), _separator(meta), meta.get("type") is list, meta)
            for name, meta in item_type.fields.items()
        )
        self.prices = tuple(item_type.price_fields().items())


class CleanPipeline:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        settings = crawler.settings
        self.default_currency = settings.get("CLEAN_DEFAULT_CURRENCY") or None
        self.date_order = settings.get("CLEAN_DATE_ORDER") or None
        self.timezone = settings.get("CLEAN_TIMEZONE") or "UTC"
        self.date_languages = settings.get("DATE_LANGUAGES") or None
        self.locale = settings.get("CLEAN_LOCALE") or None
        # Page URL -> (declared language, the page's own meta keys, in PAGE_KEYS' order).
        self._languages: OrderedDict[str, tuple[str | None, tuple[Any, ...]]] = OrderedDict()
        # Per page language: the territory and date languages it implies (a crawl sees a few).
        self._contexts: dict[str | None, dict[str, Any]] = {}
        self._plans: dict[type, _Plan] = {}
        on_response_received(crawler, self._remember_language)

    @classmethod
    def from_crawler(cls, crawler: Any) -> CleanPipeline:
        return cls(crawler)

    def _remember_language(self, response: Any, request: Any = None) -> None:
        try:
            language = declared_language(response.headers.get(b"Content-Language"), response.body)
        except Exception:  # a page without a readable declaration declares nothing
            language = None
        meta = getattr(request, "meta", None) or {}
        self._languages[response.url] = (
            language,
            tuple(str(meta[key]) if meta.get(key) else None for key in PAGE_KEYS),
        )
        self._languages.move_to_end(response.url)
        while len(self._languages) > _LANGUAGE_MEMORY:
            self._languages.popitem(last=False)

    def _option(self, name: str, default: Any) -> Any:
        return getattr(self.crawler.spider, name, None) or default

    def process_item(self, item: Any) -> Any:
        if not isinstance(item, StoredItem):
            return item
        # The item's own dict: dict(item) reads it through one method call per field.
        try:
            item._raw = _raw_copy(item._values)
        except Exception:  # an uncopyable value: keep what the item holds, as it is
            item._raw = dict(item._values)
        problems: list[str] = []
        if not _present(item.get("source")) and "source" in item.fields:
            item["source"] = self.crawler.spider.name
        page = self._languages.get(str(getattr(item, "_origin", "") or "")) or (None, (None, None, None))
        context = self._contexts.get(page)
        if context is None:
            declared, (locale, currency, order) = page
            locale = locale or self._option("locale", None) or declared or self.locale
            context = {
                "page_language": declared,
                "locale": locale,
                "territory": territory_of(locale),
                "languages": date_languages(self._option("date_languages", self.date_languages), locale),
                "default_currency": currency,
                "date_order": order,
            }
            if len(self._contexts) < _LANGUAGE_MEMORY:
                self._contexts[page] = context
        plan = self._plans.get(type(item))
        if plan is None:
            plan = self._plans[type(item)] = _Plan(type(item))
        values = item._values
        # A price's currency field is cleaned with its price, which may name the currency.
        with_price = {currency for name, currency in plan.prices if name in values}
        for name, kind, join, many, meta in plan.fields:
            if name not in values or name in with_price:
                continue
            try:
                if many:
                    problem = self._clean_parts(values, name, kind)
                else:
                    problem = self._clean_field(item, values, name, kind, join, meta, context)
            except Exception as exc:  # a cleaner's bug must not lose the item: it is a reject
                values[name] = None
                problem = f"{name}: cannot be cleaned ({type(exc).__name__}: {exc}): {_show(item._raw.get(name))}"
            if problem:
                problems.append(problem)
        item._problems = problems
        return item

    def _clean_field(
        self,
        item: StoredItem,
        values: dict[str, Any],
        name: str,
        kind: str | None,
        join: str | None,
        meta: dict[str, Any],
        context: dict[str, Any],
    ) -> str | None:
        # *values* is the item's own dict: every name comes from its fields, so writing there is
        # what ``item[name] = …`` does, without a method call per read and write.
        raw = values[name]
        if join is not None and isinstance(raw, (list, tuple)):
            # clean_text joins a list with a space; with another separator each part is cleaned alone.
            if join != " ":
                parts = [part for part in map(clean_text, raw) if part]
                values[name] = _safe_text(join.join(parts)) if parts else None
                return None
        elif isinstance(raw, (list, tuple)):
            present = [v for v in raw if _present(v)]
            if len(present) > 1:
                values[name] = None
                return f"{name}: {len(present)} values where one is expected: {_show(list(raw))}"
            raw = values[name] = present[0] if present else None
        if kind is None:
            values[name] = _safe_text(raw)
            return None
        if kind == "text":
            if raw is not None and (isinstance(raw, bool) or not isinstance(raw, _TEXT_LIKE)):
                values[name] = None
                return f"{name}: expected text, got {type(raw).__name__}: {_show(raw)}"
            values[name] = _safe_text(clean_text(raw))
        elif kind == "url":
            url = values[name] = canonical_url(raw)
            if url is None and _present(raw):
                return f"{name}: not an http(s) URL: {_show(raw)}"
        elif kind == "availability":
            text = _safe_text(clean_text(raw)) if isinstance(raw, _TEXT_LIKE) and not isinstance(raw, bool) else None
            if text is None and _present(raw):
                values[name] = None
                return f"{name}: expected text, got {type(raw).__name__}: {_show(raw)}"
            values[name] = normalise_availability(text)
        elif kind == "date":
            return self._clean_date(item, name, meta, raw, context)
        elif kind == "price":
            return self._clean_price(item, name, meta, raw, context)
        else:
            raise ValueError(f"{type(item).__name__}.{name}: unknown cleaner {kind!r}")
        return None

    def _clean_parts(self, values: dict[str, Any], name: str, kind: str | None) -> str | None:
        """A ``type=list`` field: each part cleaned as the field's value, empty ones dropped."""
        raw = values[name]
        parts = raw if isinstance(raw, (list, tuple)) else [raw]
        kept: list[Any] = []
        problem = None
        for number, part in enumerate(parts, 1):
            if not _present(part):
                continue
            if kind is None:
                kept.append(_safe_text(part))
                continue
            if isinstance(part, bool) or not isinstance(part, _PART_LIKE):
                problem = problem or f"{name}: part {number} is not text but {type(part).__name__}: {_show(part)}"
                continue
            if kind == "url":
                cleaned = canonical_url(part)
                if cleaned is None:
                    problem = problem or f"{name}: part {number} is not an http(s) URL: {_show(part)}"
            elif kind == "availability":
                cleaned = normalise_availability(_safe_text(clean_text(part)))
            else:
                cleaned = _safe_text(clean_text(part))
            if cleaned is not None:
                kept.append(cleaned)
        values[name] = kept or None
        return problem

    def _clean_date(
        self, item: StoredItem, name: str, meta: dict[str, Any], raw: Any, context: dict[str, Any]
    ) -> str | None:
        reading = read_date(
            raw,
            date_order=context["date_order"] or self._option("date_order", self.date_order),
            locale=context["locale"],
            timezone=self._option("timezone", self.timezone),
            languages=list(context["languages"]) if context["languages"] else None,
        )
        value = item[name] = reading.value
        if reading.problem:
            # Several readings, optional or not: storing none would hide that the page says a
            # date the crawl cannot tell, and storing one would be a guess.
            return f"{name}: {reading.problem}"
        if value is None and _present(raw):
            if meta.get("required"):
                return f"{name}: not a date: {_show(raw)}"
            # Optional: the item is still worth storing without it; the count shows how often.
            self.crawler.stats.inc_value(f"clean/unparsed/{name}")
            # Per item type too: the quality checks judge the share of a type's items (see
            # scraper.quality.monitor.UNREADABLE_STAT).
            self.crawler.stats.inc_value(f"clean/unreadable/{type(item).__name__}.{name}")
        return None

    def _clean_price(
        self, item: StoredItem, name: str, meta: dict[str, Any], raw: Any, context: dict[str, Any]
    ) -> str | None:
        currency_field = meta.get("currency_field", "currency")
        has_currency = currency_field in item.fields
        default = context["default_currency"] or self._option("default_currency", self.default_currency)
        territory = context["territory"]
        declared = None
        problem = None
        if not _present(raw):
            # No price (an item without price_high, say): its currency field is still mapped,
            # and left alone when it does not read, as another price may need it.
            item[name] = None
            value = item.get(currency_field) if has_currency else None
            if isinstance(value, str) and value.strip():
                item[currency_field] = currency_of(value, default, territory).code or value
            return None
        if has_currency:
            value = item.get(currency_field)
            if isinstance(value, (list, tuple)):
                value = next((v for v in value if _present(v)), None) if len(value) <= 1 else value
            text = clean_text(value) if isinstance(value, (str, int, float)) else None
            if _present(value) and text is None:
                problem = f"{currency_field}: not a currency: {_show(value)}"
            elif text:
                reading = currency_of(text, default, territory)
                declared = reading.code
                if reading.problem:
                    problem = f"{currency_field}: {reading.problem}"
        separator = meta.get("decimal_separator") or self._option("decimal_separator", None)
        price = read_price(raw, declared or default, territory, decimal_separator=separator, locale=context["locale"])
        item[name] = price.amount
        if price.amount is None:
            if price.problem:
                return f"{name}: {price.problem}: {_show(raw)}"
            return f"{name}: not a price: {_show(raw)}"
        if has_currency:
            # A currency the page states in its own field wins over the price text's mark.
            item[currency_field] = declared or (None if problem else price.currency)
            if problem:
                return problem
            if declared is None and price.problem:
                return f"{currency_field}: {price.problem} in {_show(raw)}"
        return None
