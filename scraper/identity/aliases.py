"""Aliases a page's canonical link teaches: URL -> the URL of the page it is.

A product listed in two categories is reached at two paths; its page says which is its own
(``<link rel="canonical">``, same host). No rule can tell that before the page is fetched, so the
first run fetches each alias once and records it (``{<spider>}:aliases`` in Redis, shared by the
fleet and kept across runs); from then on every alias has the canonical page's fingerprint, and
the page is fetched once per run. A developer command keeps what it learns in memory only.
"""

from __future__ import annotations

from typing import Any

#: Aliases a node keeps in memory (and Redis holds for the spider) at most.
MAX_ALIASES = 1_000_000


class Aliases:
    def __init__(self) -> None:
        self._known: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._known)

    def resolve(self, url: str) -> str:
        return self._known.get(url, url) if self._known else url

    def learn(self, alias: str, canonical: str) -> bool:
        """Record *alias* -> *canonical*; True if it was not known (so worth sharing)."""
        if alias == canonical or self._known.get(alias) == canonical or len(self._known) >= MAX_ALIASES:
            return False
        # A canonical page is never itself an alias (a site that points A -> B and B -> A).
        if self._known.get(canonical) == alias:
            return False
        self._known[alias] = canonical
        return True

    def load(self, server: Any, key: str) -> int:
        """Take in what the fleet learnt in earlier runs; returns how many."""
        count = 0
        for alias, canonical in server.hscan_iter(key, count=1000):
            alias = alias.decode() if isinstance(alias, bytes) else alias
            canonical = canonical.decode() if isinstance(canonical, bytes) else canonical
            if self.learn(alias, canonical):
                count += 1
        return count
