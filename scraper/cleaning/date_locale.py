"""What a page's locale says about reading its dates: the numeric field order and the calendar.

The order comes from CLDR's short date pattern of the locale (``dd/MM/y`` for pt-BR: DMY;
``y/MM/dd`` for ja: YMD), so a day-first ``02/07/2020`` is not read month first. The calendar
comes from CLDR's calendar preference of the locale's territory: Thailand writes Buddhist-era
years (2569 = 2026), Iran and Afghanistan the Solar Hijri calendar. A Buddhist year is converted;
a Solar Hijri date is refused (months do not map onto Gregorian ones by a fixed offset), and so
is a two-digit year in either calendar: none of them is ever stored as a Gregorian year.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
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


@dataclass(frozen=True)
class LocaleDates:
    locale: str
    order: str | None  # "DMY", "MDY", "YMD", or None when CLDR's pattern says none of these
    calendar: str | None  # None: Gregorian
    relative: bool  # whether relative words ("now", "today") are read in this locale's language

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
    if locale is not None:
        pattern = get_date_format("short", locale=locale).pattern
        letters = [ch for ch in re.sub(r"'[^']*'", "", pattern) if ch in "yMdLG"]
        positions = {}
        for index, ch in enumerate(letters):
            positions.setdefault({"L": "M"}.get(ch, ch), index)
        if {"y", "M", "d"} <= positions.keys():
            order = "".join(sorted("yMd", key=positions.__getitem__)).upper()
            order = order if order in ("DMY", "MDY", "YMD") else None
    calendar = _CALENDARS.get(territory_of(tag) or "")
    known = date_languages(None, tag) or ()
    return LocaleDates(str(locale) if locale else tag, order, calendar, language in known)


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
