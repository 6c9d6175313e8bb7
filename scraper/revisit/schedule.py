"""When a page is due again: its own change history first, a sitemap's word where it is trusted.

The interval adapts as Nutch's adaptive fetch schedule does: halved when a visit found the page
changed, grown by ``REVISIT_GROWTH`` when it did not, always between ``REVISIT_MIN_INTERVAL`` and
``REVISIT_MAX_INTERVAL``; a page's first interval is its sitemap ``changefreq`` when it has one,
else ``REVISIT_INITIAL_INTERVAL``. Times are epoch seconds of the crawling host's clock, taken
once per run (the run's start), so every page of a daily run is due again on the next day's run
whatever minute it was fetched at; a skew of minutes is nothing against intervals of hours.

A sitemap ``lastmod`` newer than the page's last visit makes it due now; one not newer leaves it
alone until the maximum interval has passed (a check that the sitemap still tells the truth).
A page whose ``lastmod`` said "changed" ``REVISIT_HINT_MISSES`` times when it had not is no
longer taken at its sitemap's word: its own history decides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from ..config import get_float, get_int

DAY = 86_400.0
#: sitemaps.org's changefreq values, in seconds (``always``: the minimum; ``never``: the maximum).
CHANGEFREQ = {
    "always": 0.0,
    "hourly": 3_600.0,
    "daily": DAY,
    "weekly": 7 * DAY,
    "monthly": 30 * DAY,
    "yearly": 365 * DAY,
    "never": float("inf"),
}
LISTING = "listing"
ITEMS = "items"
GONE = "gone"
_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class Schedule:
    minimum: float
    maximum: float
    initial: float
    growth: float
    listing: float
    hint_misses: int

    @classmethod
    def from_settings(cls, settings: object) -> Schedule:
        minimum = get_float(settings, "REVISIT_MIN_INTERVAL", minimum=0)
        maximum = max(minimum, get_float(settings, "REVISIT_MAX_INTERVAL", minimum=0))
        return cls(
            minimum=minimum,
            maximum=maximum,
            initial=min(maximum, max(minimum, get_float(settings, "REVISIT_INITIAL_INTERVAL", minimum=0))),
            growth=get_float(settings, "REVISIT_GROWTH", minimum=1.0),
            listing=get_float(settings, "REVISIT_LISTING_INTERVAL", minimum=0),
            hint_misses=get_int(settings, "REVISIT_HINT_MISSES", minimum=1),
        )

    def clamp(self, seconds: float) -> float:
        return min(self.maximum, max(self.minimum, seconds))

    def first_interval(self, changefreq: str | None) -> float:
        hinted = CHANGEFREQ.get((changefreq or "").strip().lower())
        return self.clamp(self.initial if hinted is None else hinted)

    def next_interval(self, interval: float, changed: bool) -> float:
        return self.clamp(interval / 2 if changed else interval * self.growth)


@dataclass(slots=True)
class PageState:
    """What the spider knows of one page (one row of the ``pages`` table)."""

    url: str
    kind: str
    fetched_at: float  # the start of the run that last fetched it
    interval: float
    next_due: float
    callback: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    content_hash: str | None = None
    items: list | None = None  # [[table, [key values]], ...] as stored at the last visit
    changed_at: float | None = None
    lastmod: float | None = None  # the latest sitemap lastmod seen for it
    visits: int = 0
    changes: int = 0
    not_modified: int = 0
    hint_misses: int = 0

    def trusts_hints(self, schedule: Schedule) -> bool:
        return self.hint_misses < schedule.hint_misses


def is_due(state: PageState, now: float, schedule: Schedule, lastmod: float | None = None) -> bool:
    """Whether a revisit run at *now* fetches the page (*lastmod*: its sitemap's, if any)."""
    if state.kind == LISTING:
        return now >= state.fetched_at + schedule.listing
    if state.content_hash is None:
        return True  # what it holds is unknown (its rows went missing): read it again
    lastmod = lastmod if lastmod is not None else state.lastmod
    if lastmod is not None and state.trusts_hints(schedule):
        return lastmod > state.fetched_at or now >= state.fetched_at + schedule.maximum
    return now >= state.next_due


def due_without_sitemap(state: PageState, now: float, schedule: Schedule) -> bool:
    """Whether a revisit run queues the page by itself at its start. A page the sitemap speaks for
    is left to the sitemap (read during the run), but for the maximum interval's check."""
    if state.kind == LISTING:
        return False  # reached from the spider's own start, at the listing rate
    if state.content_hash is None:
        return True
    if state.lastmod is not None and state.trusts_hints(schedule):
        return now >= state.fetched_at + schedule.maximum
    return now >= state.next_due


def parse_lastmod(text: str | None) -> float | None:
    """A sitemap ``lastmod`` (W3C datetime) in epoch seconds, or None when unreadable. A date
    alone means "some time that day": read as the day's end, so a change later that day than our
    visit still makes the page due."""
    if not text:
        return None
    text = text.strip()
    try:
        if _DATE_ONLY.fullmatch(text):
            return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() + DAY - 1
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
