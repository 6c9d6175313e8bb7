"""The page states a crawl node has at hand: a bounded cache, least recently used first out.

A page's state is read from the database when a page links to it, when it is queued as due, or
when it is visited, and each of those comes in bursts (a listing's links, a batch of due pages,
their visits soon after): the cache holds the recent ones so that each is read once, whatever
the number of pages the spider knows. A page the database does not know is cached too (as
``None``): a link in every page's navigation is looked up once, not on every page.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from .schedule import PageState


class PageCache:
    """Up to *size* page states by page key; ``None`` is a page known not to be in the database."""

    __slots__ = ("_entries", "size")

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._entries: OrderedDict[bytes, PageState | None] = OrderedDict()

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._entries)

    def get(self, key: bytes) -> PageState | None:
        """The cached state (None when not cached or not known: ``in`` tells them apart)."""
        entries = self._entries
        state = entries.get(key)
        if state is not None or key in entries:
            entries.move_to_end(key)
        return state

    def __getitem__(self, key: bytes) -> PageState | None:
        state = self._entries[key]
        self._entries.move_to_end(key)
        return state

    def __setitem__(self, key: bytes, state: PageState | None) -> None:
        entries = self._entries
        entries[key] = state
        entries.move_to_end(key)
        if len(entries) > self.size:
            entries.popitem(last=False)

    def values(self) -> list[PageState | None]:
        return list(self._entries.values())
