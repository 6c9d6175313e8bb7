"""Shops of the demo site in other languages and currencies, beside the default one.

``/de/`` is a German shop in euros (``1.234,56 €``, ``9. März 2026``, ``12.11.2026``) and ``/kw/``
a Kuwaiti one in dinars, three decimals (``KWD 12.500``, ``12.500 د.ك.``, dotted dates). Each
lists the catalog's first ordinary products on one page, with the default shop's markup (so the
``demo`` spider reads them) and schema.org JSON-LD (so the ``schema_org`` spider does), and
declares its language with ``<html lang>`` and ``Content-Language``: nothing in a spider says
which language or currency a section uses. Sections link only within themselves, and the
default shop does not link to them, so its own pages are unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from html import escape

from .catalog import Catalog, Product
from .pages import ORIGIN, Page

__all__ = ["SECTIONS", "Section", "SectionProduct", "render_section", "section_route"]

_PATH = re.compile(r"/([a-z]{2})/(?:p/([1-9][0-9]*)\.html)?")
_GERMAN_MONTHS = [
    "Januar",
    "Februar",
    "März",
    "April",
    "Mai",
    "Juni",
    "Juli",
    "August",
    "September",
    "Oktober",
    "November",
    "Dezember",
]


_ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
_CZECH_MONTHS = [
    "ledna",
    "února",
    "března",
    "dubna",
    "května",
    "června",
    "července",
    "srpna",
    "září",
    "října",
    "listopadu",
    "prosince",
]


def _arabic(text: str) -> str:
    """Arabic-Indic digits, with the Arabic decimal and grouping marks for "." and ","."""
    return text.replace(",", "\u066c").replace(".", "\u066b").translate(_ARABIC_INDIC)


def _group(amount: Decimal, places: int, thousands: str, decimal: str) -> str:
    text = f"{amount:,.{places}f}"
    return text.replace(",", "\0").replace(".", decimal).replace("\0", thousands)


@dataclass(frozen=True)
class SectionProduct:
    """One product as a section shows it, with the values a spider must store."""

    id: int
    sku: str
    title: str
    brand: str
    price: Decimal
    currency: str
    price_display: str
    jsonld_price: str
    released: datetime  # midnight UTC of the date shown
    released_display: str


@dataclass(frozen=True)
class Section:
    prefix: str
    language: str
    currency: str
    places: int
    name: str
    prices: tuple[Callable[[Decimal], str], ...]
    dates: tuple[Callable[[datetime], str], ...]
    size: int = 24

    def products(self, catalog: Catalog) -> list[SectionProduct]:
        ordinary = [p for p in catalog.products if p.kind is None][: self.size]
        return [self._product(p, n) for n, p in enumerate(ordinary)]

    def product(self, catalog: Catalog, product_id: int) -> SectionProduct | None:
        return next((p for p in self.products(catalog) if p.id == product_id), None)

    def _product(self, product: Product, n: int) -> SectionProduct:
        # Amounts with every digit used: thousands, and for dinars a third decimal.
        units = (product.id * 389) % 2400 + 1
        minor = (product.id * 7919) % (10**self.places)
        amount = Decimal(units) + Decimal(minor).scaleb(-self.places)
        day = product.released.date()
        released = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return SectionProduct(
            id=product.id,
            sku=f"{self.prefix.upper()}-{product.id:06d}",
            title=product.title,
            brand=product.brand,
            price=amount,
            currency=self.currency,
            price_display=self.prices[n % len(self.prices)](amount),
            jsonld_price=f"{amount:.{self.places}f}",
            released=released,
            released_display=self.dates[n % len(self.dates)](released),
        )


SECTIONS: dict[str, Section] = {
    "de": Section(
        prefix="de",
        language="de",
        currency="EUR",
        places=2,
        name="Demo-Laden",
        prices=(
            lambda a: _group(a, 2, ".", ",") + " €",
            lambda a: "EUR " + _group(a, 2, ".", ","),
            lambda a: "€ " + _group(a, 2, ".", ","),
            lambda a: _group(a, 2, "", ",") + "\u00a0EUR",
        ),
        dates=(
            lambda d: f"{d.day}. {_GERMAN_MONTHS[d.month - 1]} {d.year}",
            lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
            lambda d: f"{d.day}.{d.month}.{d.year}",
        ),
    ),
    "kw": Section(
        prefix="kw",
        language="ar-KW",
        currency="KWD",
        places=3,
        name="Demo Shop Kuwait",
        prices=(
            lambda a: "KWD " + _group(a, 3, ",", "."),
            lambda a: _group(a, 3, ",", ".") + " د.ك.\u200f",
            lambda a: "KD " + _group(a, 3, ",", "."),
            lambda a: _group(a, 3, "", ".") + " KD",
        ),
        dates=(
            lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
            lambda d: d.date().isoformat(),
        ),
    ),
    # Swiss francs grouped with CLDR's apostrophe (U+2019) and the ASCII one.
    "ch": Section(
        prefix="ch",
        language="de-CH",
        currency="CHF",
        places=2,
        name="Demo-Laden Schweiz",
        prices=(
            lambda a: "CHF " + _group(a, 2, "\u2019", "."),
            lambda a: _group(a, 2, "\u2019", ".") + " CHF",
            lambda a: "CHF " + _group(a, 2, "'", "."),
        ),
        dates=(
            lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
            lambda d: f"{d.day}. {_GERMAN_MONTHS[d.month - 1]} {d.year}",
        ),
    ),
    # Brazilian reais and day-first numeric dates (02/07/2020 is 2 July).
    "br": Section(
        prefix="br",
        language="pt-BR",
        currency="BRL",
        places=2,
        name="Loja Demo",
        prices=(
            lambda a: "R$ " + _group(a, 2, ".", ","),
            lambda a: "R$\u00a0" + _group(a, 2, ".", ","),
        ),
        dates=(lambda d: f"{d.day:02d}/{d.month:02d}/{d.year}",),
    ),
    # Czech crowns, a no-break space grouping, and "5. 6. 2019" dates.
    "cz": Section(
        prefix="cz",
        language="cs",
        currency="CZK",
        places=2,
        name="Demo obchod",
        prices=(
            lambda a: _group(a, 2, "\u00a0", ",") + "\u00a0Kč",
            lambda a: _group(a, 2, " ", ",") + " Kč",
        ),
        dates=(
            lambda d: f"{d.day}. {d.month}. {d.year}",
            lambda d: f"{d.day}. {_CZECH_MONTHS[d.month - 1]} {d.year}",
        ),
    ),
    # Egyptian pounds in Arabic-Indic digits with the Arabic marks (١٬٢٣٤٫٥٦ ج.م.).
    "eg": Section(
        prefix="eg",
        language="ar-EG",
        currency="EGP",
        places=2,
        name="متجر تجريبي",
        prices=(
            lambda a: _arabic(_group(a, 2, ",", ".")) + "\u00a0ج.م.\u200f",
            lambda a: "EGP " + _group(a, 2, ",", "."),
        ),
        dates=(lambda d: _arabic(f"{d.day}/{d.month}/{d.year}"),),
    ),
}


def section_route(catalog: Catalog, path: str) -> tuple[str, ...] | None:
    """("section", prefix, product id or "") for a section's page, None if it is none."""
    match = _PATH.fullmatch(path)
    if not match or match[1] not in SECTIONS:
        return None
    section = SECTIONS[match[1]]
    if match[2] and section.product(catalog, int(match[2])) is None:
        return None
    return ("section", match[1], match[2] or "")


def _document(section: Section, title: str, canonical: str, body: str) -> Page:
    text = (
        "<!DOCTYPE html>\n"
        f'<html lang="{section.language}">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n"
        f'<link rel="canonical" href="{canonical}">\n'
        f"</head>\n<body>\n{body}</body>\n</html>\n"
    )
    return Page(200, "text/html; charset=utf-8", text.encode("utf-8"), (("Content-Language", section.language),))


def render_section(catalog: Catalog, prefix: str, product_id: str) -> Page:
    section = SECTIONS[prefix]
    home = f"/{prefix}/"
    nav = f'<nav class="categories"><a class="category" href="{home}">{escape(section.name)}</a></nav>\n'
    if not product_id:
        items = "\n".join(
            f'<li class="product"><a class="product-link" href="{home}p/{p.id}.html">{escape(p.title)}</a>'
            f' <span class="list-price">{escape(p.price_display)}</span></li>'
            for p in section.products(catalog)
        )
        body = f'{nav}<main class="listing">\n<h1>{escape(section.name)}</h1>\n<ul class="products">\n{items}\n</ul>\n</main>\n'
        return _document(section, section.name, f"{ORIGIN}{home}", body)
    product = section.product(catalog, int(product_id))
    assert product is not None
    canonical = f"{ORIGIN}{home}p/{product.id}.html"
    data = {
        "@context": "https://schema.org",
        "@type": "Product",
        "name": product.title,
        "sku": product.sku,
        "brand": {"@type": "Brand", "name": product.brand},
        "url": canonical,
        "releaseDate": product.released.date().isoformat(),
        "offers": {
            "@type": "Offer",
            "price": product.jsonld_price,
            "priceCurrency": product.currency,
            "availability": "https://schema.org/InStock",
        },
    }
    body = (
        f"{nav}"
        f'<nav class="breadcrumb"><a href="{home}">{escape(section.name)}</a></nav>\n'
        '<main class="product-detail">\n'
        f'<h1 class="title">{escape(product.title)}</h1>\n'
        f'<p><span class="sku">{product.sku}</span></p>\n'
        f'<p><span class="brand">{escape(product.brand)}</span></p>\n'
        f'<p class="price-box"><span class="price">{escape(product.price_display)}</span></p>\n'
        f'<p><time class="released">{escape(product.released_display)}</time></p>\n'
        "</main>\n"
        f'<script type="application/ld+json">{json.dumps(data, ensure_ascii=False)}</script>\n'
    )
    return _document(section, product.title, canonical, body)
