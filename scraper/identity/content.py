"""Aliases learnt from content: two URLs whose pages yield the same item are one page.

A shop with no canonical link that links a product from two categories (``/p/7.html?ref=audio``,
``/p/7.html?ref=office``) serves one page under two URLs, and nothing in either says which is its
own. Its item says it: the same natural key from both. The URL first recorded for that item,
fleet-wide and across runs, is the page's; the other is learnt as its alias (shared and applied
from the next run as canonical aliases are, :mod:`.aliases`), and an item reaching us through the
other URL carries the recorded one. So a row's URL never changes because links came in another
order, nor because a second link to the page appeared later: only when the page's own identity
does (a canonical link, a URL the spider gives).

Only a page's sole item, whose ``url`` is the page's own, speaks for the page (a detail page). A
listing's items (several, or with another page's URL) say nothing of the listing: taking them at
their word would make two listings sharing a product one page, and one of them would never be
fetched again. A page with a canonical link has said its identity; it records nothing.

The record (``{<spider>}:items:pages``: the item's dedupe claim -> the URL) and the alias are
written by the dedupe pipeline in the very script call that claims the item
(:mod:`scraper.pipelines.dedupe`): no round trip more, and nothing a node killed a moment later
could lose (its page is not acknowledged before its items are claimed). Two nodes that see both
URLs at once agree, the record being set once.
"""

from __future__ import annotations

from typing import Any

from ..items.base import StoredItem
from .fingerprint import IdentityFingerprinter

# On an item: the URL of the page it is the sole item of (the page's identity, before the URL
# cleaner), when its url is the page's own and the page has no canonical link.
_OWN_PAGE = "_own_page"


def own_page(item: Any) -> str | None:
    """The identity of the page *item* speaks for (see the module's docstring), or None."""
    # Not getattr(): an Item's __getattr__ raises for a name it lacks, ~1 µs an item.
    found = getattr(item, "__dict__", None)
    return found.get(_OWN_PAGE) if found else None


class SoleItem:
    """A page's first item, held until the page's output shows whether it is the only one (its
    callback may yield links after it; a second item makes the page a listing)."""

    __slots__ = ("held", "items", "own")

    def __init__(self) -> None:
        self.held: StoredItem | None = None
        self.own = False
        self.items = 0

    def hold(self, item: StoredItem, own: bool) -> bool:
        """Count *item* (*own*: its url is the page's); True when it is the first, now held."""
        self.items += 1
        if self.items == 1:
            self.held, self.own = item, own
            return True
        return False

    def release(self) -> StoredItem | None:
        """The held item, unmarked: a second item came, or the callback failed (whatever it
        yielded still goes on)."""
        held, self.held = self.held, None
        return held

    def end(self, page: str) -> StoredItem | None:
        """The held item at the end of the page's output, marked as speaking for the page *page*
        (its identity) when it was the only one and its own."""
        held, self.held = self.held, None
        if held is not None and self.own and self.items == 1 and page:
            setattr(held, _OWN_PAGE, page)
        return held


class PageRecords:
    """The dedupe pipeline's side of content identity: what to record for an item, and what to do
    when its page's URL was recorded otherwise."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        fingerprinter = getattr(crawler, "request_fingerprinter", None)
        self.aliases = fingerprinter.aliases if isinstance(fingerprinter, IdentityFingerprinter) else None

    @staticmethod
    def value(item: Any) -> str:
        """The URL to record for *item* ("" when its page does not speak for it)."""
        if own_page(item) is None:
            return ""
        url = item.get("url")
        return url if isinstance(url, str) else ""

    def settle(self, item: StoredItem, recorded: str) -> None:
        """*item*'s page was recorded under *recorded*, not the URL it was reached by: the item
        carries the recorded URL (the claim's script has written the alias; it is counted here)."""
        if not recorded or recorded == item.get("url"):
            return
        item["url"] = recorded
        self.stats.inc_value("identity/urls_kept")
        page = own_page(item)
        if self.aliases is not None and page and self.aliases.note(page, recorded):
            self.stats.inc_value("identity/content_aliases_learnt")
