"""What a page's locale says about reading its dates: the numeric field order and the calendar.

The order comes from CLDR's short date pattern of the locale (``dd/MM/y`` for pt-BR: DMY;
``y/MM/dd`` for ja: YMD), so a day-first ``02/07/2020`` is not read month first. A numeric date
whose separators or field order the locale's short and medium patterns do not write (``2.7.2026``
on an sv-FI page, whose CLDR pattern is ``y-MM-dd``) was not written by that locale's rules: it is
read only if one reading of it is a date (``23.7.2026``), and refused with the readings when
several are (2 July or 7 February). The calendar
comes from CLDR's calendar preference of the locale's territory: Thailand writes Buddhist-era
years (2569 = 2026), Iran and Afghanistan the Solar Hijri calendar. A Buddhist year is converted;
a Solar Hijri date is refused (months do not map onto Gregorian ones by a fixed offset), and so
is a two-digit year in either calendar: none of them is ever stored as a Gregorian year.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import lru_cache

from .language import date_languages, parse_locale
from .numbers import ascii_digits

__all__ = ["LocaleDates", "locale_reading"]

# CLDR supplemental calendarPreferenceData, the territories whose first calendar is not the
# Gregorian one and whose shops write it (the Islamic calendars of others come second there).
_CALENDARS = {"TH": "buddhist", "IR": "persian", "AF": "persian"}
_BUDDHIST_OFFSET = 543
# Bidirectional marks CLDR puts into Arabic and Hebrew patterns (ar-EG ``d‏/M‏/y``): no meaning.
_MARKS = re.compile("[\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]")
_FOUR_DIGITS = re.compile(r"\d{4}")
# A numeric date at the start of a text (a time may follow): three digit groups, each two
# separated by one of . / - or by spaces alone ("2 07 2026"), as CLDR's numeric patterns write.
_NUMERIC_DATE = re.compile(r"(\d{1,4})(?:\s*([./-])\s*|\s+)(\d{1,2})(?:\s*([./-])\s*|\s+)(\d{1,4})\.?(?![\d./-])")
# The orders CLDR's numeric patterns use (none writes year, day, month).
_ORDERS = ("DMY", "MDY", "YMD")
_PATTERN_FIELD = re.compile(r"'[^']*'|y+|[ML]+|d+|[A-Za-z]")
# Texts one locale remembers its answer for: a site repeats a few dates, a long crawl meets many.
_ORDERS_KEPT = 4096
_LAYOUT_SPACE = re.compile(r"[\s\u200e\u200f\u061c\u202a-\u202e\u2066-\u2069]")


@dataclass(frozen=True)
class LocaleDates:
    locale: str
    order: str | None  # "DMY", "MDY", "YMD", or None when CLDR's pattern says none of these
    calendar: str | None  # None: Gregorian
    relative: bool  # whether relative words ("now", "today") are read in this locale's language
    # (order, first separator, second separator) of each numeric short or medium CLDR pattern,
    # None when CLDR does not know the locale (nothing to hold a text against).
    layouts: frozenset[tuple[str, str, str]] | None = None
    patterns: str = ""  # those patterns as CLDR writes them, for the reason of a refusal
    # Text -> numeric_order's answer: listing pages repeat a few date strings thousands of times.
    _orders: dict[str, tuple[str | None, str | None]] = field(default_factory=dict, compare=False, repr=False)

    def numeric_order(self, text: str) -> tuple[str | None, str | None]:
        """``(order, problem)``: the field order to read *text* (prepared) in, or why none is.

        A text that is no numeric date, or that no order reads as a date, keeps the locale's
        order; one the locale's layouts read is read by them; one they do not read is read in
        the one order that makes it a date, or refused when several make different dates.
        """
        found = self._orders.get(text)
        if found is not None:
            return found
        match = _NUMERIC_DATE.match(text) if self.layouts is not None else None
        found = (self.order, None) if match is None else self._fit(match.groups(), match.group())
        if len(self._orders) >= _ORDERS_KEPT:
            self._orders.clear()
        self._orders[text] = found
        return found

    def _fit(self, groups: tuple[str | None, ...], text: str) -> tuple[str | None, str | None]:
        first, separator, second, other, third = groups
        digits = (first or "", second or "", third or "")
        written = (separator or " ", other or " ")
        own = tuple(order for order, *separators in self.layouts or () if tuple(separators) == written)
        found = _readings(digits, own) or _readings(digits, _ORDERS)
        if not found:
            return self.order, None  # no date in any order: read as before, to no date
        if len(found) == 1:
            return next(iter(found.values())), None
        shown = " or ".join(
            f"{year:0{len(digits[order.index('Y')])}d}-{month:02d}-{day:02d} ({order})"
            for (year, month, day), order in found.items()
        )
        return None, (
            f"{text!r} does not fit the numeric dates of locale {self.locale} ({self.patterns or 'none'}) "
            f"and reads as {shown}: set date_order (the spider's, or the page's meta 'date_order') "
            "or declare the locale the page writes in (meta 'locale')"
        )

    def prepare(self, text: str) -> str:
        """*text* with ASCII digits and without bidirectional marks."""
        if text.isascii():
            return text
        return ascii_digits(_MARKS.sub("", text)).strip()

    def to_gregorian(self, found: datetime, text: str) -> datetime | None:
        """The Gregorian reading of what dateparser read as Gregorian, or None if there is none.

        A date written with words is confirmed by CLDR's month names: dateparser skips a word it
        does not know and builds a date from the numbers left ("M07 2, 2026" -> 7 February), so
        the month it found must be the one month the text names, by the locale, or in English
        where the text names no month of the locale at all.
        """
        if not text.isdigit() and not _names_month(self.locale, text, found.month):
            return None
        if self.calendar is None:
            return found
        years = [int(y) for y in _FOUR_DIGITS.findall(text)]
        if not years:
            return None  # a two-digit year of another calendar: which century is not written
        if self.calendar == "buddhist" and found.year >= 2400:
            try:
                return found.replace(year=found.year - _BUDDHIST_OFFSET)
            except ValueError:  # 29 February of a year that is no leap year in the other era
                return None
        if found.year < 1700:
            return None  # a Solar Hijri year (1405): not convertible by an offset
        return found


@lru_cache(maxsize=512)
def locale_reading(tag: str) -> LocaleDates:
    from babel.dates import get_date_format

    from .currency import territory_of

    language = re.split(r"[-_]", tag.strip())[0].lower()
    locale = parse_locale(tag)
    order = None
    layouts = None
    patterns = []
    if locale is not None:
        pattern = get_date_format("short", locale=locale).pattern
        letters = [ch for ch in re.sub(r"'[^']*'", "", pattern) if ch in "yMdLG"]
        positions = {}
        for index, ch in enumerate(letters):
            positions.setdefault({"L": "M"}.get(ch, ch), index)
        if {"y", "M", "d"} <= positions.keys():
            order = "".join(sorted("yMd", key=positions.__getitem__)).upper()
            order = order if order in _ORDERS else None
        layouts = set()
        for width in ("short", "medium"):
            pattern = get_date_format(width, locale=locale).pattern
            layout = _numeric_layout(pattern)
            if layout is not None:
                layouts.add(layout)
                patterns.append(pattern)
        layouts = frozenset(layouts)
    calendar = _CALENDARS.get(territory_of(tag) or "")
    known = date_languages(None, tag) or ()
    return LocaleDates(
        str(locale) if locale else tag,
        order,
        calendar,
        language in known,
        layouts,
        ", ".join(dict.fromkeys(_MARKS.sub("", p) for p in patterns)),
    )


def _numeric_layout(pattern: str) -> tuple[str, str, str] | None:
    """``(order, separator, separator)`` of a CLDR date pattern written in digits alone, else None.

    Spaces and bidirectional marks around a separator are no part of it (``d. M. y`` writes
    ``.``); a separator of spaces alone is one space.
    """
    fields: list[tuple[str, int, int]] = []
    for token in _PATTERN_FIELD.finditer(pattern):
        text = token.group()
        if text.startswith("'"):
            continue
        if text[0] not in "yMLd" or (text[0] in "ML" and len(text) > 2):
            return None  # a month name, a weekday, an era: not a numeric layout
        fields.append(({"L": "M"}.get(text[0], text[0]).upper(), token.start(), token.end()))
    order = "".join(field for field, _start, _end in fields)
    if order not in _ORDERS:
        return None
    separators = [
        _LAYOUT_SPACE.sub("", pattern[before[2] : after[1]].replace("'", "")) or " "
        for before, after in zip(fields, fields[1:], strict=False)
    ]
    return order, separators[0], separators[1]


def _readings(groups: tuple[str, str, str], orders: tuple[str, ...]) -> dict[tuple[int, int, int], str]:
    """The dates three digit groups make in each of *orders*: (year as written, month, day) -> order."""
    found: dict[tuple[int, int, int], str] = {}
    for order in orders:
        fields = dict(zip(order, groups, strict=True))
        year, month, day = fields["Y"], fields["M"], fields["D"]
        if len(year) not in (2, 4) or len(month) > 2 or len(day) > 2:
            continue
        try:
            # A two-digit year is a date in some century; 2000 stands for every one of them.
            date(int(year) + (2000 if len(year) == 2 else 0), int(month), int(day))
        except ValueError:
            continue
        found.setdefault((int(year), int(month), int(day)), order)
    return found


_LETTERS = re.compile(r"[^\W\d_]")
# Words a numeric date may carry that name no month: ISO's T and Z, a clock's AM/PM, offsets.
_NO_MONTH = re.compile(r"\b(?:am|pm|utc|gmt)\b|(?<=\d)[tz](?=\d|$)", re.IGNORECASE)


def _has_letters(text: str) -> bool:
    return _LETTERS.search(_NO_MONTH.sub("", text)) is not None


@lru_cache(maxsize=64)
def _month_names(tag: str) -> dict[int, frozenset[str]]:
    names: dict[int, set[str]] = {month: set() for month in range(1, 13)}
    locale = parse_locale(tag)
    if locale is None:  # an unknown tag: English names alone confirm
        return {month: frozenset() for month in names}
    for context in ("format", "stand-alone"):
        for width in ("wide", "abbreviated"):
            for month, name in locale.months[context][width].items():
                if month in names and name:
                    names[month].add(name.casefold().strip("."))
    return {month: frozenset(found) for month, found in names.items()}


@lru_cache(maxsize=4096)
def _names_month(tag: str, text: str, month: int) -> bool:
    """Whether *text*, if it has words, names *month* and no other (see LocaleDates.to_gregorian)."""
    if not _has_letters(text):
        return True
    folded = text.casefold()
    for names in (_month_names(tag), _month_names("en")):
        found = [(number, name) for number, words in names.items() for name in words if name in folded]
        # "juni" also contains "jun": a name inside a longer name found for another month is not one.
        named = {number for number, name in found if not any(name != other and name in other for _n, other in found)}
        if named:
            # One month, the one read; a name CLDR gives to two months (st "Jan") decides nothing.
            return named == {month}
    return False
