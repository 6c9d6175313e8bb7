"""Repair by value evidence: every kind of redesign, on the demo shop's pages and on a
WooCommerce-like page we did not write the renderer of.

Each test builds the pages of a new layout, the values the project stored (stable ones only,
``None`` for an item whose value changed with the layout), induces, and checks the induced
rules against what every page really shows, churned pages included.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from scraper.cleaning.price import read_price
from scraper.cleaning.text import clean_text
from scraper.demo_site import layout
from scraper.demo_site.catalog import Catalog, Product, format_price
from scraper.demo_site.pages import render_product
from scraper.repair import Evidence, Refusal, Repair, Rule, induce, verify
from scraper.repair.evidence import held_out

OLD_PRICE = "span.price::text"


def price(text: str) -> Decimal | None:
    """The price cleaner's amount, as the clean pipeline stores it."""
    return read_price(text, "USD").amount


def make_shop(products: int = 120) -> tuple[Catalog, list[Product]]:
    """The demo shop and its ordinary priced products (bench/repair_induce.py takes more)."""
    catalog = Catalog(products=products, broken=False)
    return catalog, [p for p in catalog.valid_products() if p.kind is None and p.price_display]


@pytest.fixture(scope="module")
def shop() -> tuple[Catalog, list[Product]]:
    return make_shop()


def chance(product: Product, part: str, share: float) -> bool:
    return zlib.crc32(f"{part}:{product.id}".encode()) % 1000 < share * 1000


def churned(product: Product, share: float) -> Product:
    """*product* repriced by the redesign when chance says so (the old value is then unstable)."""
    if not chance(product, "churn", share):
        return product
    new = product.price + Decimal("1.37")
    return replace(product, price=new, price_display=format_price(new, product.currency, product.price_style))


def html(catalog: Catalog, product: Product, jsonld: bool = False) -> str:
    text = render_product(catalog, product).body.decode()
    if not jsonld:  # the shop's JSON-LD would give every test away
        text = re.sub(r'<script type="application/ld\+json">.*?</script>', "", text, flags=re.S)
    return text


PRICE_BOX = re.compile(r'<p class="price-box">Price: <span class="price">(.*?)</span></p>\n')


def rename(text: str, product: Product) -> str:
    return text.replace('class="price"', 'class="amount"')


def wrap(text: str, product: Product) -> str:
    return PRICE_BOX.sub(
        r'<div class="pricing"><div class="price-wrap"><p class="cost">Price: <span>\1</span></p></div></div>\n', text
    )


def move(text: str, product: Product) -> str:
    box = PRICE_BOX.search(text)
    assert box
    text = PRICE_BOX.sub("", text)
    return text.replace("</main>", f'<aside class="buy-box"><strong class="now">{box.group(1)}</strong></aside></main>')


def table(text: str, product: Product) -> str:
    """The facts as a table; some pages have an extra row, so no row number is safe."""
    box = PRICE_BOX.search(text)
    assert box
    sku = re.search(r'<span class="sku">(.*?)</span>', text).group(1)
    rows = [("SKU", sku), ("Price", box.group(1))]
    if product.id % 3 == 0:
        rows.insert(0, ("Colour", "Blue"))
    cells = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    text = PRICE_BOX.sub(f'<table class="facts">{cells}</table>\n', text)
    return re.sub(r"<p>SKU: .*?</p>\n", "", text)


def related(others: list[Product]):
    def change(text: str, product: Product) -> str:
        picks = [o for o in others if o.id != product.id][product.id % 7 : product.id % 7 + 3]
        items = "".join(
            f'<li><a href="/p/{o.id}.html">{o.title}</a> <span class="price">{o.price_display}</span></li>'
            for o in picks
        )
        text = rename(text, product)
        return text.replace("</main>", f'</main>\n<section class="related"><ul>{items}</ul></section>')

    return change


def attribute(text: str, product: Product) -> str:
    """The shown price is gone; a button carries it for the cart script, and "In stock" stays."""
    return PRICE_BOX.sub(
        f'<button class="add-to-cart" data-price="{product.jsonld_price}">Add to cart</button>\n', text
    )


def meta(text: str, product: Product) -> str:
    return PRICE_BOX.sub(
        f'<div class="offer"><meta itemprop="price" content="{product.jsonld_price}">'
        '<span class="call">Ask for our price</span></div>\n',
        text,
    )


def jsonld_only(text: str, product: Product) -> str:
    return PRICE_BOX.sub("", text)


def build(shop, change, *, churn: float = 0.0, jsonld: bool = False, decoy=None):
    """(evidence, truth): the new layout's pages with the stable stored values, and what each
    page really shows now."""
    catalog, products = shop
    evidence, truth = [], {}
    for product in products:
        now = churned(product, churn)
        text = change(html(catalog, now, jsonld), now)
        if decoy is not None:
            text = decoy(text, product, now)
        url = f"http://shop.test/p/{product.id}.html"
        evidence.append(Evidence(url, text, price(product.price_display) if now is product else None))
        truth[url] = price(now.price_display)
    return evidence, truth


def assert_reads_all(repair: Repair | Refusal, evidence: list[Evidence], truth: dict[str, Any]) -> None:
    assert isinstance(repair, Repair), repair
    wrong = {e.url: (repair.extract(e.html), truth[e.url]) for e in evidence if repair.extract(e.html) != truth[e.url]}
    assert wrong == {}
    assert repair.uncovered == ()
    for fitted in repair.rules:
        assert fitted.contradictions == 0 and fitted.validation.wrong == 0 and fitted.validation.ok > 0


@pytest.mark.parametrize("change", [rename, wrap, move, table, attribute, meta], ids=lambda c: c.__name__)
def test_each_layout_change_is_repaired_and_read_on_every_page(shop, change):
    evidence, truth = build(shop, change)
    assert verify([OLD_PRICE], evidence, price).ok == 0
    repair = induce("price", evidence, price, current=OLD_PRICE)
    assert_reads_all(repair, evidence, truth)
    assert not repair.unchanged and len(repair.rules) == 1


def test_attribute_repair_never_reads_in_stock_or_the_call_to_action(shop):
    evidence, _ = build(shop, meta)
    repair = induce("price", evidence, price)
    assert repair.rules[0].rule == Rule("//meta[@itemprop='price']", "@content")


def test_the_label_survives_a_dl_becoming_a_table(shop):
    evidence, truth = build(shop, table)
    rule = induce("price", evidence, price).rules[0].rule
    assert rule.positional <= 1 and "Price" in rule.path, rule


def test_jsonld_only(shop):
    evidence, truth = build(shop, jsonld_only, jsonld=True)
    repair = induce("price", evidence, price, current=OLD_PRICE)
    assert_reads_all(repair, evidence, truth)
    assert str(repair.rules[0].rule) == "jsonld:Product/offers.price"


def test_related_products_decoy_under_the_old_class_is_never_picked(shop):
    evidence, truth = build(shop, related(shop[1]))
    assert verify([OLD_PRICE], evidence, price).multiple == len(evidence)
    repair = induce("price", evidence, price, current=OLD_PRICE)
    assert_reads_all(repair, evidence, truth)
    assert "amount" in repair.rules[0].rule.path


def was_now(on_sale: float):
    """Where the price was, the old class now holds a struck-out price: the regular price of an
    item on sale (its stable stored value is the sale price), else the value stored before."""

    def decoy(text: str, product: Product, now: Product) -> str:
        was = product.price_display
        if now is product and chance(product, "sale", on_sale):
            was = format_price(product.price * Decimal("1.25"), product.currency, product.price_style)
        return PRICE_BOX.sub(
            f'<p class="price-box">Was <s class="price">{was}</s> now <span class="now">{now.price_display}</span></p>\n',
            text,
        )

    return decoy


def test_heavy_churn_old_price_decoy_that_contradicts_a_sale_is_never_picked(shop):
    evidence, truth = build(shop, lambda t, p: t, churn=0.6, decoy=was_now(on_sale=0.3))
    assert sum(e.known is None for e in evidence) > 0.5 * len(evidence)
    repair = induce("price", evidence, price, current=OLD_PRICE)
    assert_reads_all(repair, evidence, truth)
    assert repair.rules[0].unknown > 0.5 * len(evidence)
    assert "now" in repair.rules[0].rule.path


def test_old_price_decoy_that_fits_every_stable_value_is_ambiguous_not_guessed(shop):
    evidence, _ = build(shop, lambda t, p: t, churn=0.6, decoy=was_now(on_sale=0.0))
    refusal = induce("price", evidence, price, current=OLD_PRICE)
    assert isinstance(refusal, Refusal) and refusal.reason == "ambiguous", refusal


def test_heavy_churn_behind_a_wrapper_reads_the_new_values(shop):
    evidence, truth = build(shop, wrap, churn=0.6)
    repair = induce("price", evidence, price)
    assert_reads_all(repair, evidence, truth)  # the churned pages included: their new value


def half(text: str, product: Product) -> str:
    """A partial rollout: half the pages have the facts table, the others only a class rename."""
    return table(text, product) if chance(product, "rollout", 0.5) else rename(text, product)


def test_partial_rollout_gets_a_rule_per_template_each_validated(shop):
    evidence, truth = build(shop, half)
    repair = induce("price", evidence, price, current=OLD_PRICE)
    assert_reads_all(repair, evidence, truth)
    assert len(repair.rules) == 2
    first, second = repair.rules
    assert set(first.pages).isdisjoint(second.pages)
    assert len(first.pages) + len(second.pages) == len(evidence)


def drill(shop, share: float, parts: tuple[str, ...]) -> tuple[list[Evidence], dict[str, Any]]:
    """The demo shop's own broken-layout drill (``--break-layout``), JSON-LD left in."""
    catalog, products = shop
    evidence, truth = [], {}
    for product in products:
        shown = layout.bundled(product, share, parts)
        page = layout.apply(render_product(catalog, shown), shown, share, parts)
        url = f"http://shop.test/p/{product.id}.html"
        evidence.append(Evidence(url, page.body, price(product.price_display)))
        truth[url] = price(shown.price_display)
    return evidence, truth


def test_the_shops_own_rename_drill_is_repaired_with_its_jsonld_in_place(shop):
    evidence, truth = drill(shop, 0.5, ("price",))
    assert 0.3 < verify([OLD_PRICE], evidence, price).coverage < 0.7
    repair = induce("price", evidence, price, current=OLD_PRICE)
    assert_reads_all(repair, evidence, truth)
    assert len(repair.rules) == 1  # one rule reads both templates: the renamed class is not in it


def test_a_redesign_that_changes_values_not_places_is_refused(shop):
    """The bundle drill: a third of the pages show a pack's price where the unit price was, in
    the HTML and the JSON-LD alike. No rule reads the stored values there: nothing is repaired."""
    evidence, _ = drill(shop, 0.34, ("bundle",))
    assert verify([OLD_PRICE], evidence, price).wrong > 0
    refusal = induce("price", evidence, price, current=OLD_PRICE)
    assert isinstance(refusal, Refusal) and refusal.reason == "contradiction", refusal


def test_a_rule_that_misreads_pages_it_did_not_learn_from_is_refused(shop):
    evidence, _ = build(shop, rename)
    kept = held_out([e.url for e in evidence], 0.3)
    tripled = [
        replace(e, html=re.sub(r'(<span class="amount">)', r"\1 3 x ", e.html)) if e.url in kept else e
        for e in evidence
    ]
    refusal = induce("price", tripled, price)
    assert isinstance(refusal, Refusal) and refusal.reason == "validation failed", refusal


def test_no_change_keeps_the_current_rule(shop):
    evidence, _ = build(shop, lambda t, p: t)
    repair = induce("price", evidence, price, current=OLD_PRICE)
    assert isinstance(repair, Repair) and repair.unchanged
    assert repair.rules[0].rule == Rule.parse(OLD_PRICE) and repair.rules[0].validation.coverage == 1.0


def test_low_variety_is_no_evidence(shop):
    catalog, products = shop
    pages = [Evidence(f"http://shop.test/{p.id}", html(catalog, p), "In stock") for p in products]
    refusal = induce("availability", pages, clean_text)
    assert isinstance(refusal, Refusal) and refusal.reason == "low variety"
    two = [replace(e, known=price(p.price_display) if p.id % 2 else None) for e, p in zip(pages, products)]
    same = [replace(e, known=Decimal("10")) for e in two[:40]] + [replace(e, known=Decimal("20")) for e in two[40:]]
    assert induce("price", same, price).reason == "low variety"


def test_too_few_pages(shop):
    evidence, _ = build(shop, rename)
    assert induce("price", evidence[:4], price).reason == "too few pages"


def test_text_field_title_after_a_rename(shop):
    catalog, products = shop
    pages = [
        Evidence(
            f"http://shop.test/{p.id}",
            re.sub(r'<h1 class="title">(.*?)</h1>', r'<h2 class="name">\1</h2>', html(catalog, p)),
            p.title,
        )
        for p in products
    ]
    repair = induce("title", pages, clean_text)
    assert isinstance(repair, Repair)
    assert all(repair.extract(e.html) == e.known for e in pages)


# A WooCommerce single-product page, as the Storefront theme prints it: the price in
# p.price > span.amount > bdi, a sale as del/ins with screen-reader text, and related products
# showing the same markup inside li.product.
WOO = """<!DOCTYPE html><html lang="en-US"><head><meta charset="UTF-8">
<title>{name} &#8211; Acme Store</title></head>
<body class="product-template-default single single-product postid-{id} woocommerce">
<div id="page" class="hfeed site"><div id="content" class="site-content"><div class="col-full">
<div id="primary" class="content-area"><main id="main" class="site-main" role="main">
<div id="product-{id}" class="product type-product post-{id} status-publish instock has-post-title">
<div class="woocommerce-product-gallery images"><img src="/wp-content/uploads/{id}.jpg" alt=""></div>
<div class="summary entry-summary">
<h1 class="product_title entry-title">{name}</h1>
{price}
<div class="woocommerce-product-details__short-description"><p>{name}: made to last.</p></div>
<p class="stock in-stock">In stock</p>
<form class="cart" method="post"><button type="submit" name="add-to-cart" value="{id}"
 class="single_add_to_cart_button button alt">Add to cart</button></form>
<div class="product_meta"><span class="sku_wrapper">SKU: <span class="sku">AC-{id}</span></span></div>
</div>
<section class="related products"><h2>Related products</h2><ul class="products columns-4">{related}</ul></section>
</div></main></div></div></div></div></body></html>"""

AMOUNT = (
    '<span class="woocommerce-Price-amount amount"><bdi>'
    '<span class="woocommerce-Price-currencySymbol">&#36;</span>{0}</bdi></span>'
)


def woo_price(value: str, regular: str | None, css: str) -> str:
    if regular is None:
        return f'<p class="{css}">{AMOUNT.format(value)}</p>'
    return (
        f'<p class="{css}"><del aria-hidden="true">{AMOUNT.format(regular)}</del> '
        f'<span class="screen-reader-text">Original price was: &#36;{regular}.</span>'
        f'<ins aria-hidden="true">{AMOUNT.format(value)}</ins>'
        f'<span class="screen-reader-text">Current price is: &#36;{value}.</span></p>'
    )


def woo_pages(count: int, css: str) -> tuple[list[Evidence], dict[str, Any]]:
    evidence, truth = [], {}
    for n in range(count):
        value = f"{10 + (n * 7919) % 500}.{n % 100:02d}"
        regular = f"{int(value.split('.')[0]) + 5}.00" if n % 4 == 0 else None
        related = "".join(
            f'<li class="product"><a href="/product/{m}/"><h2 class="woocommerce-loop-product__title">Item {m}</h2>'
            f'<span class="price">{AMOUNT.format(f"{m}.99")}</span></a></li>'
            for m in (n + 1, n + 2, n + 3)
        )
        page = WOO.format(id=100 + n, name=f"Item {n}", price=woo_price(value, regular, css), related=related)
        url = f"https://acme.test/product/item-{n}/"
        # Every fifth value changed with the theme update: no evidence there.
        evidence.append(Evidence(url, page, None if n % 5 == 0 else Decimal(value)))
        truth[url] = Decimal(value)
    return evidence, truth


def test_woocommerce_theme_update_reads_sale_and_regular_prices_never_the_struck_or_related_one():
    before, _ = woo_pages(60, "price")
    old = "p.price > span.amount bdi::text"
    assert verify([old], before, price).coverage > 0.7  # the old rule read all but the sales
    evidence, truth = woo_pages(60, "product-price")
    assert verify([old], evidence, price).ok == 0
    repair = induce("price", evidence, price, current=old)
    assert_reads_all(repair, evidence, truth)
    assert all("del" not in f.rule.path and "related" not in f.rule.path for f in repair.rules)


@pytest.mark.parametrize(
    "spec, read",
    [
        ("span.price::text", "own"),
        ("meta[itemprop=price]::attr(content)", "@content"),
        ("p.price-box", "text"),
        ("//span[@class='price']/text()", "own"),
        ("//button/@data-price", "@data-price"),
        ("jsonld:Product/offers.price", "jsonld"),
    ],
)
def test_rules_read_the_forms_spiders_write_and_round_trip(spec, read):
    rule = Rule.parse(spec)
    assert rule.read == read and Rule.parse(str(rule)) == rule
