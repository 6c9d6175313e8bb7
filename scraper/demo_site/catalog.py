"""Deterministic product catalog for the demo shop.

Every value comes from one ``random.Random(seed)`` consumed in a fixed order,
so the same arguments always produce the same site byte for byte. Repricing
is applied after generation (without touching the RNG) so a repriced catalog
differs from its base only in the repriced amounts.
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import ROUND_DOWN, Decimal
from typing import Any

__all__ = [
    "BROKEN_KINDS",
    "DEFAULT_CURRENCY",
    "ODD_KINDS",
    "Catalog",
    "Category",
    "Product",
    "format_price",
]

# Pages a correct spider must NOT store.
BROKEN_KINDS = ("no_price", "garbage_price", "missing_title", "empty")
# Pages that look wrong but carry a complete, storable product.
ODD_KINDS = ("truncated", "cp1252")
DEFAULT_CURRENCY = "USD"

_CENT = Decimal("0.01")
_REPRICE_STEP = Decimal("1.00")

_CATEGORY_NAMES = [
    "Kitchen & Dining",
    "Home Office",
    "Outdoor & Garden",
    "Audio",
    "Apparel",
    "Café & Tea",
    "Toys & Games",
    "Books",
    "Sports",
    "Beauty & Care",
    "Électronique",
    "Lighting",
    "Pets",
    "Travel",
    "Tools",
    "Baby",
]
# Latin-1 names on purpose: every generated string stays cp1252-encodable.
_BRANDS = [
    "Müller",
    "Ångström Labs",
    "Acme",
    "Nordlys",
    "Café Royal",
    "Smith & Sons",
    "Crème de la Crème",
    "Bergström",
    "Zoë & Co.",
    "Lumière",
    "Hansen",
    "Øresund Design",
    "Señor Sol",
    "Fjällräven Works",
]
_ADJECTIVES = [
    "Classic",
    "Deluxe",
    "Compact",
    "Vintage",
    "Ergonomic",
    "Smart",
    "Rustic",
    "Crème",
    "Nordic",
    "Portable",
    "Premium",
    "Organic",
    "Artisan",
    "Ultra-Light",
    "Über",
    "Café",
    "Heritage",
    "Naïve",
]
_NOUNS = [
    "Kettle",
    "Desk Lamp",
    "Backpack",
    "Armchair",
    "Headphones",
    "Mug",
    "Blender",
    "Notebook",
    "Rain Jacket",
    "Sneakers",
    "Wristwatch",
    "Speaker",
    "Coffee Grinder",
    "Tent",
    "Skillet",
    "Umbrella",
    "Brûlée Torch",
    "Crêpe Pan",
    "Duvet",
    "Yoga Mat",
]
_SUFFIXES = ["", "", " Pro", " Mini", " XL", " II", " 2.0"]
_COLOURS = ["Black", "Crème", "Forest Green", "Bordeaux", "Gris Perle", "Navy"]
_QUALITIES = [
    "durable",
    "lightweight",
    "easy to clean",
    "surprisingly quiet",
    "built to last",
    "made from recycled materials",
    "dishwasher safe",
    "hand-finished",
    "water-resistant",
    "über-comfortable",
]
_USES = [
    "everyday use",
    "weekend trips",
    "small apartments",
    "busy kitchens",
    "the home office",
    "gift giving",
    "café-style mornings",
]
# Runs between words; str.split() collapses all of them back to one space.
_GAPS = [" ", " ", " ", " ", "  ", "\n", "\n    ", " \t", "\t\n  ", "   \n"]
_GARBAGE_PRICES = ["call for price", "N/A", "Price on request", "TBA"]

_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_OFFSETS_MIN = [-480, -300, -240, 0, 60, 120, 330, 540, 600]
_FIRST_RELEASE = datetime(2019, 1, 1, tzinfo=UTC)
_RELEASE_SPAN_DAYS = 9 * 365


def _num(amount: Decimal, thousands: str, decimal: str, places: int = 2) -> str:
    text = f"{amount:,.{places}f}"
    return text.replace(",", "\0").replace(".", decimal).replace("\0", thousands)


# (renderer, whole units only). Rotated per currency so every style appears.
_PriceFormat = tuple[Callable[[Decimal], str], bool]
_PRICE_FORMATS: dict[str, list[_PriceFormat]] = {
    "USD": [
        (lambda a: "$" + _num(a, ",", "."), False),
        (lambda a: "USD " + _num(a, ",", "."), False),
    ],
    "EUR": [
        (lambda a: _num(a, ".", ",") + " €", False),
        (lambda a: _num(a, " ", ",") + " EUR", False),
        (lambda a: "€" + _num(a, ",", "."), False),
        (lambda a: "EUR " + _num(a, ".", ","), False),
    ],
    "GBP": [
        (lambda a: "£" + _num(a, ",", "."), False),
        (lambda a: "£" + _num(a, ",", ".", 0), True),
        (lambda a: "GBP " + _num(a, ",", "."), False),
    ],
    "JPY": [
        (lambda a: "¥" + _num(a, ",", ".", 0), True),
        (lambda a: "JPY " + _num(a, "", ".", 0), True),
    ],
}
_CURRENCIES = ["USD", "EUR", "GBP", "JPY"]
_CURRENCY_WEIGHTS = [40, 30, 15, 15]
FREE_DISPLAY = "Free"


def format_price(amount: Decimal, currency: str, style: int) -> str:
    """Render ``amount`` the way the site displays it for ``(currency, style)``."""
    render, _ = _PRICE_FORMATS[currency][style]
    return render(amount)


def slugify(name: str) -> str:
    """ASCII slug, so category URLs never need percent-encoding."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^a-z0-9]+", "-", ascii_name.lower()).strip("-")


@dataclass(frozen=True)
class Category:
    slug: str
    name: str


@dataclass(frozen=True)
class Product:
    """One product. ``kind`` is None for ordinary pages, else a BROKEN/ODD kind.

    ``title``, ``price`` etc. are always the generated values, even when the
    page omits or garbles them: listing pages still show the title of a
    ``missing_title`` product, for instance.
    """

    id: int
    sku: str
    title: str
    brand: str
    description: str  # whitespace-normalised
    description_raw: str  # as written into the HTML, irregular whitespace
    categories: tuple[str, ...]  # slugs, home category first
    price: Decimal | None
    currency: str | None
    price_display: str | None
    price_style: int  # index into the currency's display formats, -1 if none
    released: datetime  # timezone-aware, UTC
    released_display: str
    released_date_only: bool
    kind: str | None = None

    @property
    def home_category(self) -> str:
        return self.categories[0]

    @property
    def is_valid(self) -> bool:
        return self.kind not in BROKEN_KINDS

    @property
    def is_free(self) -> bool:
        return self.price_display == FREE_DISPLAY

    @property
    def paths(self) -> list[str]:
        """Listing-linked URL paths, one per category the product is listed in."""
        return [f"/c/{slug}/p/{self.id}.html" for slug in self.categories]

    @property
    def canonical_path(self) -> str:
        return f"/p/{self.id}.html"

    @property
    def jsonld_price(self) -> str | None:
        """schema.org price: dot decimal, no grouping, whole yen."""
        if self.price is None:
            return None
        if self.currency == "JPY":
            return str(self.price.quantize(Decimal(1)))
        return f"{self.price:.2f}"


class Catalog:
    """A deterministic shop: categories, products and the URL paths they live at."""

    def __init__(
        self,
        products: int = 200,
        categories: int = 8,
        per_page: int = 20,
        seed: int = 42,
        reprice: int = 0,
        removed: tuple[int, ...] = (),
        broken: bool = True,
    ) -> None:
        if products < 1 or categories < 1 or per_page < 1 or reprice < 0:
            raise ValueError("products, categories and per_page must be >= 1, reprice >= 0")
        self.product_count = products
        self.category_count = categories
        self.per_page = per_page
        self.seed = seed
        self.reprice = reprice
        # False: no broken page at all (a shop whose runs have no rejects).
        self.broken = broken
        self.categories, base = _generate(products, categories, seed, broken)
        self.products, self.repriced_ids = _apply_reprice(base, reprice)
        # Products taken off the shop: no page, no listing entry (what a shop does with a
        # discontinued product).
        self.removed = tuple(sorted(set(removed)))
        self.products = [p for p in self.products if p.id not in self.removed]
        self._by_id = {p.id: p for p in self.products}
        self._by_slug = {c.slug: c for c in self.categories}
        self._listed: dict[str, list[Product]] = {c.slug: [] for c in self.categories}
        for product in self.products:
            for slug in product.categories:
                self._listed[slug].append(product)

    def __repr__(self) -> str:
        return (
            f"Catalog(products={self.product_count}, categories={self.category_count}, "
            f"per_page={self.per_page}, seed={self.seed}, reprice={self.reprice})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Catalog):
            return NotImplemented
        return (
            self.per_page == other.per_page and self.categories == other.categories and self.products == other.products
        )

    __hash__ = None  # type: ignore[assignment]

    def with_reprice(self, count: int) -> Catalog:
        """Same catalog with ``count`` (absolute, not cumulative) products repriced."""
        return Catalog(
            self.product_count, self.category_count, self.per_page, self.seed, count, self.removed, self.broken
        )

    def with_removed(self, ids: tuple[int, ...]) -> Catalog:
        """Same catalog without the products *ids* (absolute, not cumulative)."""
        return Catalog(
            self.product_count, self.category_count, self.per_page, self.seed, self.reprice, ids, self.broken
        )

    # -- lookups -----------------------------------------------------------

    def product(self, product_id: int) -> Product | None:
        return self._by_id.get(product_id)

    def category(self, slug: str) -> Category | None:
        return self._by_slug.get(slug)

    def products_in(self, slug: str) -> list[Product]:
        """Products listed in a category (home or secondary), by id."""
        return list(self._listed.get(slug, []))

    def listing_page_count(self, slug: str) -> int:
        listed = len(self._listed.get(slug, []))
        return max(1, -(-listed // self.per_page))

    def listing(self, slug: str, page: int) -> list[Product]:
        start = (page - 1) * self.per_page
        return self._listed.get(slug, [])[start : start + self.per_page]

    @staticmethod
    def listing_path(slug: str, page: int = 1) -> str:
        return f"/c/{slug}/" if page == 1 else f"/c/{slug}/?page={page}"

    def valid_products(self) -> list[Product]:
        """Products a correct spider should store (includes the odd-but-valid kinds)."""
        return [p for p in self.products if p.is_valid]

    def broken_products(self) -> list[Product]:
        """Products a correct spider should drop; see ``Product.kind``."""
        return [p for p in self.products if not p.is_valid]

    def ids_by_kind(self, kind: str) -> list[int]:
        return [p.id for p in self.products if p.kind == kind]

    @property
    def kinds(self) -> dict[int, str]:
        """Every non-ordinary product id -> its kind (broken and odd)."""
        return {p.id: p.kind for p in self.products if p.kind is not None}

    def multi_category_products(self) -> list[Product]:
        return [p for p in self.products if len(p.categories) > 1]

    def pages(self) -> list[str]:
        """Every crawlable path: home, each listing page, each listed product URL."""
        paths = ["/"]
        for cat in self.categories:
            for page in range(1, self.listing_page_count(cat.slug) + 1):
                paths.append(self.listing_path(cat.slug, page))
        for cat in self.categories:
            for product in self._listed[cat.slug]:
                paths.append(f"/c/{cat.slug}/p/{product.id}.html")
        return paths

    @property
    def page_count(self) -> int:
        return 1 + sum(self.listing_page_count(c.slug) + len(self._listed[c.slug]) for c in self.categories)

    def summary(self) -> dict[str, Any]:
        return {
            "products": len(self.products),
            "categories": [c.slug for c in self.categories],
            "per_page": self.per_page,
            "seed": self.seed,
            "reprice": self.reprice,
            "repriced": list(self.repriced_ids),
            "pages": self.page_count,
            "valid": [p.id for p in self.valid_products()],
            "kinds": {str(pid): kind for pid, kind in self.kinds.items()},
        }


# -- generation -----------------------------------------------------------


def _generate(n: int, n_categories: int, seed: int, broken: bool = True) -> tuple[list[Category], list[Product]]:
    # The order of RNG calls below is part of the determinism contract:
    # reordering them changes every generated site.
    rng = random.Random(seed)
    categories = _make_categories(rng, n_categories)
    kinds = _assign_kinds(rng, n)
    if not broken:
        kinds = {pid: kind for pid, kind in kinds.items() if kind not in BROKEN_KINDS}
    ordinary = [pid for pid in range(1, n + 1) if pid not in kinds]
    free_count = 0 if n < 10 else (1 if n < 100 else 2)
    free_ids = set(rng.sample(ordinary, min(free_count, len(ordinary))))
    homes = _assign_homes(rng, n, len(categories))

    counters = dict.fromkeys(_CURRENCIES, 0)
    garbage_seen = 0
    products: list[Product] = []
    for pid in range(1, n + 1):
        kind = kinds.get(pid)
        title = _make_title(rng)
        brand = rng.choice(_BRANDS)
        description = _make_description(rng, title, brand)
        price, currency, display, style = _make_price(rng, counters)
        released, released_display, date_only = _make_release(rng, pid)
        slugs: tuple[str, ...] = (categories[homes[pid - 1]].slug,)
        if len(categories) > 1 and rng.random() < 0.1:
            slugs += (_other_category(rng, categories, slugs[0]),)

        if pid in free_ids:
            price, currency, display, style = Decimal("0.00"), DEFAULT_CURRENCY, FREE_DISPLAY, -1
        if kind == "no_price":
            price, currency, display, style = None, None, None, -1
        elif kind == "garbage_price":
            display = _GARBAGE_PRICES[garbage_seen % len(_GARBAGE_PRICES)]
            garbage_seen += 1
            price, currency, style = None, None, -1
        elif kind == "cp1252":
            # Force the characters that break when decoded with the wrong charset.
            title = "Crème Brûlée Torch – Édition Café"
            brand = "Müller & Söhne"
            description = (
                f"The {title} by {brand} is hand-finished. Prix spécial : "
                "livraison offerte dès 50 €, garantie « Ångström » incluse."
            )
            currency, style = "EUR", 0
            display = format_price(price, currency, style)

        products.append(
            Product(
                id=pid,
                sku=f"DS-{pid:06d}",
                title=title,
                brand=brand,
                description=description,
                description_raw=_roughen(rng, description),
                categories=slugs,
                price=price,
                currency=currency,
                price_display=display,
                price_style=style,
                released=released,
                released_display=released_display,
                released_date_only=date_only,
                kind=kind,
            )
        )
    _ensure_multi_category(rng, products, categories)
    return categories, products


def _make_categories(rng: random.Random, count: int) -> list[Category]:
    names = rng.sample(_CATEGORY_NAMES, min(count, len(_CATEGORY_NAMES)))
    names += [f"Category {i}" for i in range(len(names) + 1, count + 1)]
    return [Category(slugify(name), name) for name in names]


def _assign_kinds(rng: random.Random, n: int) -> dict[int, str]:
    broken_cycle = ("no_price", "garbage_price", "missing_title")
    # Priority order: tiny catalogs get the most important kinds first.
    wanted = [*broken_cycle, "empty", "truncated", "cp1252"]
    extra = max(3, round(n / 40)) - 3
    wanted += [broken_cycle[i % 3] for i in range(extra)]
    # Keep at least half of a tiny catalog ordinary.
    wanted = wanted[: n // 2]
    ids = rng.sample(range(1, n + 1), len(wanted))
    return dict(zip(ids, wanted))


def _assign_homes(rng: random.Random, n: int, n_categories: int) -> list[int]:
    # Round-robin first so no category is empty, then uneven weights so the
    # categories paginate differently, as on a real shop.
    weights = [rng.randint(1, 4) for _ in range(n_categories)]
    homes = list(range(min(n, n_categories)))
    homes += rng.choices(range(n_categories), weights=weights, k=n - len(homes))
    rng.shuffle(homes)
    return homes


def _other_category(rng: random.Random, categories: list[Category], home: str) -> str:
    return rng.choice([c.slug for c in categories if c.slug != home])


def _ensure_multi_category(rng: random.Random, products: list[Product], categories: list[Category]) -> None:
    # Tests rely on at least one product reachable through two listing URLs.
    if len(categories) < 2 or any(len(p.categories) > 1 for p in products):
        return
    for i, product in enumerate(products):
        if product.kind is None:
            extra = _other_category(rng, categories, product.home_category)
            products[i] = replace(product, categories=(product.home_category, extra))
            return


def _make_title(rng: random.Random) -> str:
    title = f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}{rng.choice(_SUFFIXES)}"
    if rng.random() < 0.4:
        title += f" ({rng.choice(_COLOURS)})"
    return title


def _make_description(rng: random.Random, title: str, brand: str) -> str:
    q1, q2 = rng.sample(_QUALITIES, 2)
    text = f"The {title} by {brand} is {q1} and {q2}."
    if rng.random() < 0.6:
        text += f" Perfect for {rng.choice(_USES)}."
    return text


def _roughen(rng: random.Random, text: str) -> str:
    words = text.split(" ")
    out = [rng.choice(["\n      ", "\n", "  ", ""])]
    for i, word in enumerate(words):
        if i:
            out.append(rng.choice(_GAPS))
        out.append(word)
    out.append(rng.choice(["\n    ", "\n", " ", ""]))
    return "".join(out)


def _make_price(rng: random.Random, counters: dict[str, int]) -> tuple[Decimal, str, str, int]:
    currency = rng.choices(_CURRENCIES, weights=_CURRENCY_WEIGHTS)[0]
    high = rng.random() < 0.12
    if currency == "JPY":
        amount = Decimal(rng.randint(1000, 5000) if high else rng.randint(50, 999))
    else:
        cents = rng.randint(100_000, 500_000) if high else rng.randint(100, 30_000)
        amount = Decimal(cents).scaleb(-2)
    formats = _PRICE_FORMATS[currency]
    style = counters[currency] % len(formats)
    counters[currency] += 1
    if formats[style][1]:
        amount = max(Decimal(1), amount.quantize(Decimal(1), rounding=ROUND_DOWN))
    amount = amount.quantize(_CENT)
    return amount, currency, format_price(amount, currency, style), style


def _make_release(rng: random.Random, pid: int) -> tuple[datetime, str, bool]:
    day = _FIRST_RELEASE + timedelta(days=rng.randrange(_RELEASE_SPAN_DAYS))
    moment = day + timedelta(hours=rng.randrange(24), minutes=rng.randrange(60))
    offset = timezone(timedelta(minutes=rng.choice(_OFFSETS_MIN)))
    style = (pid - 1) % 6
    month = _MONTHS[day.month - 1]
    if style == 0:
        return day, f"{day.day} {month[:3]} {day.year}", True
    if style == 1:
        # The displayed wall time is local to the offset; the instant stays put.
        return moment, moment.astimezone(offset).isoformat(), False
    if style == 2:
        return day, f"{month} {day.day}, {day.year}", True
    if style == 3:
        return day, day.strftime("%Y-%m-%d"), True
    if style == 4:
        return day, day.strftime("%d.%m.%Y"), True
    hour12 = moment.hour % 12 or 12
    ampm = "AM" if moment.hour < 12 else "PM"
    text = f"{month[:3]} {moment.day}, {moment.year} {hour12}:{moment.minute:02d} {ampm}"
    return moment, text, False


def _apply_reprice(products: list[Product], count: int) -> tuple[list[Product], tuple[int, ...]]:
    changed: list[int] = []
    out: list[Product] = []
    for product in products:
        if len(changed) < count and _repriceable(product):
            assert product.price is not None and product.currency is not None
            price = product.price + _REPRICE_STEP
            display = format_price(price, product.currency, product.price_style)
            product = replace(product, price=price, price_display=display)
            changed.append(product.id)
        out.append(product)
    return out, tuple(changed)


def _repriceable(product: Product) -> bool:
    return product.is_valid and not product.is_free and product.price is not None
