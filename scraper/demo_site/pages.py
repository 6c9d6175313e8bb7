"""HTML rendering for the demo shop.

Pages are rendered once per catalog version with ``ORIGIN`` standing in for
"http://host:port": absolute URLs depend on the request's Host header, and a
byte replace at send time is far cheaper than re-rendering.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING, Any

from .catalog import Catalog, Product

if TYPE_CHECKING:
    from .changes import ChangeClock

__all__ = [
    "ORIGIN",
    "Page",
    "render_home",
    "render_listing",
    "render_not_found",
    "render_product",
    "render_robots",
    "render_sitemap",
]

ORIGIN = "__DEMO_SITE_ORIGIN__"
_ORIGIN_BYTES = ORIGIN.encode("ascii")
_HTML_UTF8 = "text/html; charset=utf-8"
_SITE_NAME = "Demo Shop"


@dataclass(frozen=True)
class Page:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    gzipped: bool = False  # sent gzipped, as a file (a sitemap.xml.gz), once its origin is in
    templated: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "templated", _ORIGIN_BYTES in self.body)

    def body_for(self, origin: str) -> bytes:
        """Body with absolute URLs pointing at ``origin`` ("http://host:port")."""
        body = self.body.replace(_ORIGIN_BYTES, origin.encode("ascii")) if self.templated else self.body
        return gzip.compress(body, mtime=0) if self.gzipped else body


def _e(text: str) -> str:
    return escape(text, quote=True)


def _document(title: str, canonical: str | None, body: str, charset: str = "utf-8") -> str:
    if charset == "utf-8":
        meta = '<meta charset="utf-8">'
    else:
        meta = f'<meta http-equiv="Content-Type" content="text/html; charset={charset}">'
    link = f'<link rel="canonical" href="{canonical}">\n' if canonical else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n'
        f"{meta}\n"
        f"<title>{_e(title)}</title>\n"
        f"{link}"
        "</head>\n<body>\n"
        f"{body}"
        "</body>\n</html>\n"
    )


def _header(catalog: Catalog) -> str:
    # Every page repeats the full category nav, so crawlers meet the same
    # links over and over, as on real shops.
    links = "\n".join(f'  <a class="category" href="/c/{c.slug}/">{_e(c.name)}</a>' for c in catalog.categories)
    return (
        '<header class="site-header">\n'
        f'<a class="home" href="/">{_SITE_NAME}</a>\n'
        '<nav class="categories">\n'
        f"{links}\n"
        "</nav>\n</header>\n"
    )


def _footer() -> str:
    return f'<footer class="site-footer">\n<a href="/">Home</a> · © {_SITE_NAME}\n</footer>\n'


def _html_page(text: str, charset: str = "utf-8") -> Page:
    if charset == "utf-8":
        return Page(200, _HTML_UTF8, text.encode("utf-8"))
    # xmlcharrefreplace keeps the page valid should a name ever fall outside
    # the legacy charset.
    body = text.encode(charset, errors="xmlcharrefreplace")
    return Page(200, f"text/html; charset={charset}", body)


def render_home(catalog: Catalog) -> Page:
    body = (
        f"{_header(catalog)}"
        '<main class="home">\n'
        f"<h1>Welcome to {_SITE_NAME}</h1>\n"
        f"<p>{len(catalog.products)} products in "
        f"{len(catalog.categories)} categories.</p>\n"
        "</main>\n"
        f"{_footer()}"
    )
    return _html_page(_document(_SITE_NAME, f"{ORIGIN}/", body))


def render_listing(catalog: Catalog, slug: str, page: int) -> Page | None:
    """Listing page ``page`` (1-based) of a category, None if it does not exist."""
    category = catalog.category(slug)
    last = catalog.listing_page_count(slug)
    if category is None or not 1 <= page <= last:
        return None
    items = "\n".join(_listing_item(slug, p) for p in catalog.listing(slug, page))
    if not items:
        items = '<li class="empty">No products yet.</li>'
    body = (
        f"{_header(catalog)}"
        '<nav class="breadcrumb"><a href="/">Home</a> › '
        f"<span>{_e(category.name)}</span></nav>\n"
        '<main class="listing">\n'
        f'<h1 class="category-title">{_e(category.name)}</h1>\n'
        f'<ul class="products">\n{items}\n</ul>\n'
        f"{_pagination(slug, page, last)}"
        "</main>\n"
        f"{_footer()}"
    )
    path = catalog.listing_path(slug, page)
    title = f"{category.name} – page {page} | {_SITE_NAME}"
    return _html_page(_document(title, f"{ORIGIN}{_e(path)}", body))


def _listing_item(slug: str, product: Product) -> str:
    price = ""
    if product.price_display is not None:
        price = f' <span class="list-price">{_e(product.price_display)}</span>'
    return (
        f'<li class="product"><a class="product-link" href="/c/{slug}/p/{product.id}.html">'
        f"{_e(product.title)}</a>{price}</li>"
    )


def _pagination(slug: str, page: int, last: int) -> str:
    if last == 1:
        return ""

    def href(n: int) -> str:
        return _e(Catalog.listing_path(slug, n))

    parts = []
    if page > 1:
        parts.append(f'<a class="prev" rel="prev" href="{href(page - 1)}">Previous</a>')
    for n in range(1, last + 1):
        if n == page:
            parts.append(f'<span class="page current">{n}</span>')
        else:
            parts.append(f'<a class="page" href="{href(n)}">{n}</a>')
    if page < last:
        parts.append(f'<a class="next" rel="next" href="{href(page + 1)}">Next</a>')
    return '<nav class="pagination">\n' + "\n".join(parts) + "\n</nav>\n"


def render_product(catalog: Catalog, product: Product) -> Page:
    """The product page; identical for every URL the product is reachable at."""
    if product.kind == "empty":
        return Page(200, "text/html", b"")
    charset = "windows-1252" if product.kind == "cp1252" else "utf-8"
    text = _document(
        _SITE_NAME if product.kind == "missing_title" else f"{product.title} | {_SITE_NAME}",
        f"{ORIGIN}{product.canonical_path}",
        _product_body(catalog, product),
        charset=charset,
    )
    if product.kind == "truncated":
        # Cut inside the description's start tag: everything a spider needs
        # (title, sku, price) precedes it, the JSON-LD and closing tags do not.
        marker = '<div class="description"'
        text = text[: text.index(marker) + len('<div class="desc')]
    return _html_page(text, charset)


def _product_body(catalog: Catalog, product: Product) -> str:
    category = catalog.category(product.home_category)
    assert category is not None
    has_title = product.kind != "missing_title"
    crumbs = (
        '<nav class="breadcrumb"><a href="/">Home</a> › '
        f'<a href="/c/{category.slug}/">{_e(category.name)}</a>'
        + (f" › <span>{_e(product.title)}</span>" if has_title else "")
        + "</nav>\n"
    )
    title = f'<h1 class="title">{_e(product.title)}</h1>\n' if has_title else ""
    price = ""
    if product.price_display is not None:
        price = f'<p class="price-box">Price: <span class="price">{_e(product.price_display)}</span></p>\n'
    alt = _e(product.title) if has_title else ""
    return (
        f"{_header(catalog)}"
        f"{crumbs}"
        '<main class="product-detail">\n'
        f"{title}"
        f'<p>SKU: <span class="sku">{product.sku}</span></p>\n'
        f'<p>Brand: <span class="brand">{_e(product.brand)}</span></p>\n'
        f"{price}"
        '<p><span class="availability">In stock</span></p>\n'
        f'<p>Released: <time class="released">{_e(product.released_display)}</time></p>\n'
        f'<img class="main" src="/img/{product.id}.jpg" alt="{alt}">\n'
        f'<div class="description">{_e(product.description_raw)}</div>\n'
        "</main>\n"
        f'<p class="more">More in <a href="/c/{category.slug}/">{_e(category.name)}</a></p>\n'
        f"{_footer()}"
        f'<script type="application/ld+json">{_jsonld(product)}</script>\n'
    )


def _jsonld(product: Product) -> str:
    canonical = f"{ORIGIN}{product.canonical_path}"
    data: dict[str, Any] = {"@context": "https://schema.org", "@type": "Product"}
    if product.kind != "missing_title":
        data["name"] = product.title
    data.update(
        sku=product.sku,
        brand={"@type": "Brand", "name": product.brand},
        description=product.description,
        image=f"{ORIGIN}/img/{product.id}.jpg",
        url=canonical,
        releaseDate=product.released.isoformat(),
    )
    if product.kind == "garbage_price":
        data["offers"] = {
            "@type": "Offer",
            "price": product.price_display,
            "availability": "https://schema.org/InStock",
        }
    elif product.price is not None:
        data["offers"] = {
            "@type": "Offer",
            "price": product.jsonld_price,
            "priceCurrency": product.currency,
            "availability": "https://schema.org/InStock",
            "url": canonical,
        }
    # "</" inside a script element would end it early; "<\/" is the same JSON.
    return json.dumps(data, ensure_ascii=False).replace("</", "<\\/")


def render_robots(crawl_delay: float = 0.0) -> Page:
    body = "User-agent: *\nAllow: /\n" + (f"Crawl-delay: {crawl_delay:g}\n" if crawl_delay else "")
    return Page(200, "text/plain; charset=utf-8", body.encode())


def render_sitemap(catalog: Catalog, changes: ChangeClock | None = None) -> Page:
    """Every valid product's canonical URL; with a change clock, its ``lastmod`` (unless the
    product is one of those the clock keeps without) and ``changefreq``."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">']
    for product in catalog.valid_products():
        entry = f"<url><loc>{ORIGIN}{product.canonical_path}</loc>"
        if changes is not None and product.id in changes.rate:
            if product.id not in changes.no_lastmod:
                entry += f"<lastmod>{changes.sitemap_lastmod(product.id).isoformat()}</lastmod>"
            entry += f"<changefreq>{changes.changefreq[product.id]}</changefreq>"
        lines.append(entry + "</url>")
    lines.append("</urlset>\n")
    return Page(200, "application/xml", "\n".join(lines).encode("utf-8"))


def render_not_found() -> Page:
    body = '<main class="error">\n<h1>Page not found</h1>\n<p><a href="/">Back to the shop</a></p>\n</main>\n'
    page = _html_page(_document(f"Not found | {_SITE_NAME}", None, body))
    return Page(404, page.content_type, page.body)
