"""Date normalisation: raw scraped date -> timezone-aware UTC datetime.

dateparser handles the long tail of human formats but costs around a
millisecond per call, so cheap exact paths (date objects, ISO 8601, unix
timestamps, the common English and numeric layouts) run first and textual
results are memoised, since listing pages repeat the same few date strings
thousands of times.

Dates are read in the languages given (the site's: ``9. März 2026`` needs
``de``), English when none are. Numeric dates with dots (``12.11.2026``) are
day first unless a date order says otherwise: that is how every country that
writes dots writes them, whatever the page's language.

The fast path answers as dateparser does, except where dateparser is wrong
and it deliberately is not: a wall time that occurs twice when clocks go back
(the "fold") is read as its first occurrence, as Python's zoneinfo does
(dateparser takes the second), and years past 2037 keep their daylight saving
time (dateparser's pytz zones stop having transitions there).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .date_locale import locale_reading

__all__ = ["DateReading", "parse_date", "read_date"]

UTC = UTC

# Needs a full Y-M-D so fromisoformat never sees bare years or "2026-11".
_ISO_LIKE = re.compile(r"^\d{4}-?\d{2}-?\d{2}(?:[T ]|$)")

# 10 digits = seconds (2001..2286), 13 digits = milliseconds (JavaScript).
_EPOCH = re.compile(r"^\d{10}(?:\d{3})?$")
_EPOCH_SECONDS_RANGE = (10**9, 10**10)

# "no-spaces-time" and the timestamp parsers are left out: they turn "2026" or
# "20261112" into made-up dates even with REQUIRE_PARTS; timestamps are
# handled explicitly above instead.
_ABSOLUTE_PARSERS = ["custom-formats", "absolute-time"]
_RELATIVE_PARSERS = ["relative-time"]
_REQUIRE_PARTS = ["day", "month", "year"]

_DEFAULT_LANGUAGES = ("en",)


@dataclass(frozen=True)
class DateReading:
    """A date, or why a text that may be one was refused (``problem``)."""

    value: datetime | None = None
    problem: str | None = None


_NO_DATE = DateReading()


def parse_date(
    raw: object,
    date_order: str | None = None,
    timezone: str = "UTC",
    languages: list[str] | None = None,
    locale: str | None = None,
) -> datetime | None:
    """Return ``raw`` as an aware UTC datetime, or None if it is no full date or is refused.

    ``locale`` (the page's, ``pt-BR``) gives the numeric date order when ``date_order`` is not
    set (CLDR's short date pattern: ``dd/MM/y`` is DMY) and the calendar: a locale whose
    default calendar is not the Gregorian one is read in it (Buddhist years) or refused
    (Persian), never stored as a Gregorian year 2569 or 1405. A numeric date the locale does
    not write and that reads as several dates is refused (see :func:`read_date` for why).

    ``timezone`` is assumed for inputs that carry no offset (date-only inputs
    become midnight there). ``date_order`` ("DMY", "MDY", "YMD") settles
    numeric dates such as "11/12/2026"; without it dotted dates are day first
    and the others follow the language's convention (month first for
    English). ``languages`` (ISO 639-1 codes) are those of the site; English
    when None. Relative dates ("yesterday", "3 hours ago") are resolved
    against the current clock and never cached.
    """
    return read_date(raw, date_order, timezone, languages, locale).value


def read_date(
    raw: object,
    date_order: str | None = None,
    timezone: str = "UTC",
    languages: list[str] | None = None,
    locale: str | None = None,
) -> DateReading:
    """What :func:`parse_date` reads, with the reason when a date is refused as ambiguous.

    Without ``date_order``, a numeric date whose separators or field order the ``locale``'s
    CLDR patterns do not write (``2.7.2026`` on an sv-FI page: ``y-MM-dd``) is read in the one
    order that makes it a date; when several do (2 July, 7 February) it is refused with those
    readings and the fix (``problem``), never one of them guessed.
    """
    if raw is None or isinstance(raw, bool):
        return _NO_DATE
    if isinstance(raw, datetime):
        return DateReading(_localise(raw, timezone))
    if isinstance(raw, date):
        return DateReading(_localise(datetime(raw.year, raw.month, raw.day), timezone))
    if isinstance(raw, (int, float)):
        return DateReading(_from_epoch(raw))
    if not isinstance(raw, str):
        return _NO_DATE

    text = " ".join(raw.split())
    if not text:
        return _NO_DATE
    if locale:
        reading = locale_reading(locale)
        text = reading.prepare(text)
        order = date_order
        if order is None:
            order, problem = reading.numeric_order(text)
            if problem is not None:
                return DateReading(problem=problem)
        found = _parse_string(text, order, timezone, languages, relative=reading.relative)
        return DateReading(reading.to_gregorian(found, text) if found is not None else None)
    return DateReading(_parse_string(text, date_order, timezone, languages))


def _parse_string(
    text: str, date_order: str | None, timezone: str, languages: list[str] | None, relative: bool = True
) -> datetime | None:
    if _EPOCH.match(text):
        return _from_epoch(int(text))
    if _ISO_LIKE.match(text):
        iso = _from_iso(text, timezone)
        if iso is not None:
            return iso
    langs = tuple(languages) if languages else _DEFAULT_LANGUAGES
    if date_order is None and _DOTTED.match(text):
        date_order = "DMY"
    if "en" in langs or _NUMERIC.match(text):
        common = _parse_common(text, date_order, timezone)
        if common is not None:
            return common
    found = _parse_absolute(text, date_order, timezone, langs)
    if found is not None:
        return found
    if relative and not _YEAR.search(text) and _is_relative(text, timezone, langs):
        return _parse_text(text, date_order, timezone, langs, _RELATIVE_PARSERS)
    return None


_MONTHS = {
    name: number
    for number, names in enumerate(
        [
            ("jan", "january"),
            ("feb", "february"),
            ("mar", "march"),
            ("apr", "april"),
            ("may",),
            ("jun", "june"),
            ("jul", "july"),
            ("aug", "august"),
            ("sep", "sept", "september"),
            ("oct", "october"),
            ("nov", "november"),
            ("dec", "december"),
        ],
        start=1,
    )
    for name in names
}
_MONTH = r"([A-Za-z]{3,9})\.?"
_TIME = r"(?:,? (\d{1,2}):(\d{2})(?::(\d{2}))? ?([AaPp][Mm])?)?"
_DAY_MONTH_YEAR = re.compile(rf"^(\d{{1,2}}) {_MONTH},? (\d{{4}}){_TIME}$")
_MONTH_DAY_YEAR = re.compile(rf"^{_MONTH} (\d{{1,2}})(?:st|nd|rd|th)?,? (\d{{4}}){_TIME}$")
_NUMERIC = re.compile(r"^(\d{1,2})([./-])(\d{1,2})\2(\d{4})$")
_DOTTED = re.compile(r"^\d{1,2}\.\d{1,2}\.\d{2,4}\b")
# A relative date ("3 days ago") names no year: "23 Now, 2026" is a month abbreviation.
_YEAR = re.compile(r"\d{4}")


def _parse_common(text: str, date_order: str | None, timezone: str) -> datetime | None:
    """The handful of English layouts most shops use, without dateparser's ~1 ms per call.

    Anything that does not match exactly falls through to dateparser, so this only ever
    answers the way dateparser would, faster.
    """
    match = _DAY_MONTH_YEAR.match(text)
    if match:
        day, month, year, *clock = match.groups()
    else:
        match = _MONTH_DAY_YEAR.match(text)
        if match:
            month, day, year, *clock = match.groups()
        else:
            match = _NUMERIC.match(text)
            if not match:
                return None
            first, _sep, second, year = match.groups()
            order = (date_order or "MDY").upper()
            if order == "DMY":
                day, month = first, second
            elif order == "MDY":
                month, day = first, second
            else:
                return None
            clock = [None, None, None, None]
    number = _MONTHS.get(month.lower()) if not month.isdigit() else int(month)
    if number is None:
        return None
    hour, minute, second, meridiem = clock
    try:
        h = int(hour or 0)
        if meridiem:
            if not 1 <= h <= 12:
                return None
            h = h % 12 + (12 if meridiem.lower() == "pm" else 0)
        value = datetime(int(year), number, int(day), h, int(minute or 0), int(second or 0))
    except ValueError:
        return None
    return _localise(value, timezone)


@lru_cache(maxsize=64)
def _zone(name: str) -> tzinfo | None:
    if name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def _localise(value: datetime, timezone: str) -> datetime | None:
    if value.tzinfo is None:
        zone = _zone(timezone)
        if zone is None:
            return None
        value = value.replace(tzinfo=zone)
    try:
        return value.astimezone(UTC)
    except (OverflowError, ValueError):
        # Year 1 east of UTC or 9999 west of it: no datetime can hold the UTC instant.
        return None


def _from_epoch(value: int | float) -> datetime | None:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    seconds = value / 1000 if value >= _EPOCH_SECONDS_RANGE[1] * 100 else value
    if not _EPOCH_SECONDS_RANGE[0] <= seconds < _EPOCH_SECONDS_RANGE[1]:
        return None
    return datetime.fromtimestamp(seconds, UTC)


def _from_iso(text: str, timezone: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        # Let dateparser try it; e.g. "2026-11-12 10:00 CET".
        return None
    zone_known = value.tzinfo is not None or _zone(timezone) is not None
    return _localise(value, timezone) if zone_known else None


@lru_cache(maxsize=8192)
def _parse_absolute(text: str, date_order: str | None, timezone: str, languages: tuple[str, ...]) -> datetime | None:
    return _parse_text(text, date_order, timezone, languages, _ABSOLUTE_PARSERS)


@lru_cache(maxsize=8192)
def _is_relative(text: str, timezone: str, languages: tuple[str, ...]) -> bool:
    # Whether a string is relative does not depend on the clock, so this
    # answer is cacheable even though the resulting datetime is not; it keeps
    # repeated garbage ("N/A", "-") from hitting dateparser every time.
    return _parse_text(text, None, timezone, languages, _RELATIVE_PARSERS) is not None


def _parse_text(
    text: str,
    date_order: str | None,
    timezone: str,
    languages: tuple[str, ...],
    parsers: list[str],
) -> datetime | None:
    settings: dict[str, object] = {
        "RETURN_AS_TIMEZONE_AWARE": True,
        "TIMEZONE": timezone,
        "TO_TIMEZONE": "UTC",
        "REQUIRE_PARTS": _REQUIRE_PARTS,
        "PARSERS": parsers,
    }
    if date_order:
        settings["DATE_ORDER"] = date_order.upper()
    # Imported at the first date the fast path cannot read: most crawls never get here, and
    # the import is ~0.05 s of CPU at each process's start.
    import dateparser

    try:
        # Fixed languages: autodetection over every locale is ~100x slower.
        value = dateparser.parse(text, languages=list(languages), settings=settings)
        return value.astimezone(UTC) if value is not None else None
    except Exception:  # dateparser raises many kinds on odd input; no date is the answer
        return None
