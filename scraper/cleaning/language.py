"""The language a page declares (``Content-Language``, ``<html lang>``) and the date languages
it implies."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

__all__ = ["PAGE_KEYS", "date_languages", "declared_language", "parse_locale"]

# The request meta keys with which a spider sets one page's reading of its values: the locale
# (number symbols, date order), the currency of unmarked prices, the numeric date order.
PAGE_KEYS = ("locale", "default_currency", "date_order")

_HTML_LANG = re.compile(rb"<html\b[^>]*?\blang\s*=\s*[\"']?([A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8})*)", re.IGNORECASE)
_TAG = re.compile(r"^[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{1,8})*$")
# The <html> tag comes first; a page that hides it past this point declares nothing usable.
_HEAD_BYTES = 4096


def declared_language(content_language: bytes | str | None, body: bytes | None) -> str | None:
    """``Content-Language`` (its first tag) if the server sends one, else ``<html lang>``."""
    if isinstance(content_language, bytes):
        content_language = content_language.decode("latin-1", errors="replace")
    if content_language:
        first = content_language.split(",")[0].split(";")[0].strip()
        if _TAG.match(first):
            return first
    if body:
        match = _HTML_LANG.search(body[:_HEAD_BYTES])
        if match:
            return match.group(1).decode("ascii")
    return None


@lru_cache(maxsize=1)
def _supported() -> frozenset[str]:
    from dateparser.data.languages_info import language_order

    return frozenset(language_order)


def date_languages(configured: Iterable[str] | str | None, page: str | None) -> tuple[str, ...] | None:
    """The languages dates are read in: the configured ones (spider or setting) if any, else the
    page's own language with English after it (shops mix in ISO and English dates), else None
    (English). Tags dateparser does not know are dropped, region first (``de-AT`` -> ``de``)."""
    if isinstance(configured, str):
        configured = [part for part in re.split(r"[,\s]+", configured) if part]
    wanted = list(configured or ())
    if not wanted and page:
        wanted = [page, "en"]
    supported = _supported()
    found: list[str] = []
    for tag in wanted:
        tag = tag.strip().replace("_", "-")
        for candidate in (tag, tag.split("-")[0].lower()):
            if candidate in supported and candidate not in found:
                found.append(candidate)
                break
    return tuple(found) or None


def parse_locale(tag: str) -> Any:
    """The Babel Locale of a tag as pages write it (``de-CH``, ``pt_BR``), else of its language
    alone (``de-XX`` -> ``de``), else None."""
    from babel import Locale, UnknownLocaleError

    tag = tag.strip()
    for candidate in (tag.replace("-", "_"), re.split(r"[-_]", tag)[0].lower()):
        try:
            return Locale.parse(candidate)
        except (UnknownLocaleError, ValueError, TypeError):
            continue
    return None
