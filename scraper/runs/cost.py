"""What a run's changes cost: rows new or updated, and pages fetched and scraping-API credits
spent per change. One reckoning for the crawl summary's ``Cost:`` line and ``scrapy runs``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    changes: int
    pages_per_change: float | None  # None without a change
    credits_per_change: float | None  # None without a change or without credits


def cost(new: float, updated: float, pages: float, credits: float) -> Cost:
    changes = int(new or 0) + int(updated or 0)
    return Cost(
        changes,
        pages / changes if changes else None,
        credits / changes if changes and credits else None,
    )
