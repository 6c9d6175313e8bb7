"""A change clock for the demo shop: day by day, each product's page changes at its own rate.

What a recurring crawl meets: a few products change every day, a quarter about weekly, half about
monthly, the rest never. A change is a new price (the old one plus one unit per change so far),
so a crawl that captured it stores a value that can be checked against the day's truth. Each
product page then carries validators (``ETag``, ``Last-Modified``) and answers ``304`` to a
conditional request that still matches; the shop's sitemap gives each product's ``lastmod``
(``without_lastmod`` of them get none, as some shops do) and a ``changefreq``.

Day 0 is the shop as first crawled; changes happen on days 1, 2, ...: each at ``start`` plus
that many days, minus an hour, so a crawl run on day *d* (at ``start`` + *d* days or later) sees
every change of day *d*. Deterministic for a seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from .catalog import _REPRICE_STEP, Catalog, Product, format_price

#: (name, share of products, chance of a change per day, sitemap changefreq)
RATES = (
    ("daily", 0.03, 1.0, "daily"),
    ("weekly", 0.25, 1 / 7, "weekly"),
    ("monthly", 0.50, 1 / 30, "monthly"),
    ("never", 0.22, 0.0, "yearly"),
)
#: How far ahead change days are drawn.
HORIZON = 120
#: A product never changed since day 0 was last modified this long before ``start``.
FIRST_MODIFIED = timedelta(days=90)


@dataclass(frozen=True)
class Versioned:
    """One product as the shop serves it on a day."""

    product: Product
    version: int
    modified: datetime

    @property
    def etag(self) -> str:
        return f'"{self.product.id}-{self.version}"'

    @property
    def last_modified(self) -> str:
        return format_datetime(self.modified, usegmt=True)


class ChangeClock:
    def __init__(
        self,
        catalog: Catalog,
        start: datetime | None = None,
        seed: int = 7,
        without_lastmod: float = 0.0,
        lying_lastmod: bool = False,
    ) -> None:
        self.start = (start or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
        self.day = 0
        # A sitemap regenerated each day with that day as every entry's lastmod, as some shop
        # systems write it: true for the pages that changed, false for all the others.
        self.lying_lastmod = lying_lastmod
        rng = random.Random(seed)
        self.rate: dict[int, str] = {}
        self.changefreq: dict[int, str] = {}
        self.change_days: dict[int, tuple[int, ...]] = {}
        self.no_lastmod: set[int] = set()
        for product in catalog.products:
            if not (product.is_valid and not product.is_free and product.price is not None):
                continue  # a page that never shows a price has nothing to change
            pick, total = rng.random(), 0.0
            name, chance, freq = RATES[-1][0], 0.0, RATES[-1][3]
            for rate_name, share, rate_chance, rate_freq in RATES:
                total += share
                if pick < total:
                    name, chance, freq = rate_name, rate_chance, rate_freq
                    break
            self.rate[product.id] = name
            self.changefreq[product.id] = freq
            self.change_days[product.id] = tuple(d for d in range(1, HORIZON + 1) if rng.random() < chance)
            if rng.random() < without_lastmod:
                self.no_lastmod.add(product.id)

    def version(self, product_id: int, day: int | None = None) -> int:
        day = self.day if day is None else day
        return sum(1 for d in self.change_days.get(product_id, ()) if d <= day)

    def changed_on(self, day: int) -> list[int]:
        """The products whose page changed on *day*."""
        return sorted(pid for pid, days in self.change_days.items() if day in days)

    def modified(self, product_id: int, day: int | None = None) -> datetime:
        day = self.day if day is None else day
        days = [d for d in self.change_days.get(product_id, ()) if d <= day]
        if not days:
            return self.start - FIRST_MODIFIED
        return self.start + timedelta(days=days[-1], hours=-1)

    def sitemap_lastmod(self, product_id: int) -> datetime:
        if self.lying_lastmod:
            return self.start + timedelta(days=self.day, hours=-1)
        return self.modified(product_id)

    def serve(self, product: Product, day: int | None = None) -> Versioned:
        """The product as served on *day*: its price moved once per change so far."""
        version = self.version(product.id, day)
        if version and product.price is not None and product.currency is not None:
            price = product.price + _REPRICE_STEP * version
            product = replace(
                product, price=price, price_display=format_price(price, product.currency, product.price_style)
            )
        return Versioned(product, version, self.modified(product.id, day))

    def price(self, product: Product, day: int | None = None) -> object:
        return self.serve(product, day).product.price
