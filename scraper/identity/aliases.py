"""Aliases the fleet learns: URL -> the URL of the page it is.

Two ways teach one. A page's canonical link (``<link rel="canonical">``, same host) says which
URL is its own (:mod:`.canonical`). A page with no canonical link says nothing, but what it yields
does: two URLs whose pages yield the same item are one page, and the URL first recorded for that
item is the page's (:mod:`.content`). No rule can tell either before the pages are fetched, so
the first run fetches each alias once and records it (``{<spider>}:aliases`` in Redis, shared by
the fleet and kept across runs); from the next run on every alias has its page's fingerprint,
and the page is fetched once per run. An alias is not applied in the run that learnt it: the
seen-set holds the fingerprint the alias had when it was fetched, and a fingerprint that changed
mid-run would fetch the page again at its next link. Each entry says the run that learnt it
(``"<run> <page URL>"``), so a node joining a run loads only what earlier runs learnt. A
developer command keeps nothing.
"""

from __future__ import annotations

from typing import Any

#: Aliases a node keeps in memory (and Redis holds for the spider) at most.
MAX_ALIASES = 1_000_000
# A chain (A -> B learnt from content, B -> C from a canonical link later) resolves in one step
# once loaded; past this many hops it is a loop, and left as it is.
_MAX_HOPS = 8


class Aliases:
    def __init__(self) -> None:
        self._known: dict[str, str] = {}  # applied to fingerprints
        self._noted: set[str] = set()  # learnt in this run: applied from the next one

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

    def note(self, alias: str, canonical: str) -> bool:
        """*alias* -> *canonical*, seen in this run: True if neither known nor noted yet (so worth
        recording for the next runs); not applied to this run's fingerprints."""
        if alias == canonical or alias in self._noted or self._known.get(alias) == canonical:
            return False
        if len(self._noted) >= MAX_ALIASES:
            return False
        self._noted.add(alias)
        return True

    def load(self, server: Any, key: str, run_id: int | None) -> int:
        """Take in what the fleet learnt in runs before *run_id*; returns how many."""
        count = 0
        current = None if run_id is None else str(run_id)
        for alias, value in server.hscan_iter(key, count=1000):
            alias = alias.decode() if isinstance(alias, bytes) else alias
            value = value.decode() if isinstance(value, bytes) else value
            learnt_in, _, canonical = value.partition(" ")
            if current is not None and learnt_in == current:
                continue  # this run's own: applied from the next run
            if self.learn(alias, canonical or learnt_in):
                count += 1
        self._flatten()
        return count

    def _flatten(self) -> None:
        # resolve() is one dict lookup on every link: a chain is followed once here, not there.
        known = self._known
        for alias, target in known.items():
            hops = 0
            while target in known and hops < _MAX_HOPS:
                target, hops = known[target], hops + 1
            if hops and target != alias and target not in known:
                known[alias] = target
