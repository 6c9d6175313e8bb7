"""What a repair may learn from: pages whose stored value is known and stable.

A page with ``known=None`` is no evidence (its value changed, or was never stable): the rule
must still select exactly one node there, but what that node says is never checked against
anything, and never learned from.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Evidence", "Reader"]


@dataclass(frozen=True)
class Evidence:
    """One page: its URL, its HTML, and the field's stable stored value (cleaned), or None."""

    url: str
    html: str | bytes
    known: Any = None


class Reader:
    """The project's own cleaner for a field, remembered per raw string: the same texts (a
    category link, a label) recur on every page, and a cleaner that fails reads nothing."""

    def __init__(self, clean: Callable[[str], Any]) -> None:
        self.clean = clean
        self._seen: dict[str, Any] = {}

    def __call__(self, raw: str) -> Any:
        try:
            return self._seen[raw]
        except KeyError:
            pass
        try:
            value = self.clean(raw) if raw.strip() else None
        except Exception:  # text the cleaner cannot take is text that holds no value
            value = None
        if len(self._seen) < 200_000:
            self._seen[raw] = value
        return value


def held_out(urls: Sequence[str], share: float) -> set[str]:
    """The URLs kept apart for validation: a fixed share, chosen by a hash of the URL so the
    same evidence always splits the same way, and independently of the order it came in."""
    count = round(len(urls) * share)
    if share > 0 and len(urls) >= 2:
        count = min(max(count, 1), len(urls) - 1)
    ranked = sorted(urls, key=lambda url: (zlib.crc32(url.encode("utf-8", "replace")), url))
    return set(ranked[:count])


def variety(values: Sequence[Any]) -> tuple[int, float]:
    """How many distinct values, and the share of the most common one."""
    counts = Counter(values)
    if not counts:
        return 0, 1.0
    return len(counts), counts.most_common(1)[0][1] / len(values)
