"""A generic spider for any shop that publishes schema.org ``Product`` data.

``scrapy crawl schema_org -a url=https://shop.example/ [-a max_pages=500]`` follows links on the
start URL's site and stores every Product found in JSON-LD or microdata (read with extruct): one
row per variant of a ``ProductGroup`` (``hasVariant``, ``isVariantOf``) and per ``Offer`` that
carries its own SKU and price; an ``AggregateOffer`` gives ``price`` (``lowPrice``) and
``price_high`` (``highPrice``). Without a ``sku`` the ``gtin*``/``mpn``/``productID`` is the key.
Without ``-a url`` it crawls what ``scrapy seed schema_org <urls>`` queued; either way it only
follows links that stay on the host of the page they were found on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor

from ..cleaning import url_domain
from ..items import ProductItem
from .base import CatalogSpider

logger = logging.getLogger(__name__)


_PRODUCT_TYPES = {"Product", "ProductModel", "IndividualProduct", "ProductGroup"}
# Identifiers that name one product when it has no sku, best first.
_KEYS = ("sku", "gtin14", "gtin13", "gtin12", "gtin8", "gtin", "mpn", "productID")
# What a variant takes from its group when it does not say it itself.
_INHERITED = ("name", "brand", "description", "category", "image", "url", "releaseDate")


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value


def _name(value: Any) -> Any:
    value = _first(value)
    return value.get("name") if isinstance(value, dict) else value


def _types(obj: dict[str, Any]) -> set[str]:
    types = obj.get("@type") or obj.get("type") or []
    return {str(t).rsplit("/", 1)[-1] for t in (types if isinstance(types, list) else [types])}


def _dicts(value: Any) -> list[dict[str, Any]]:
    values = value if isinstance(value, list) else [value]
    return [v.get("properties", v) for v in values if isinstance(v, dict)]


def _term(value: Any) -> Any:
    """A schema.org enumeration member as its term: "https://schema.org/InStock" -> "InStock"."""
    value = _first(value)
    return value.rstrip("/").rsplit("/", 1)[-1] or None if isinstance(value, str) and value.strip() else None


def _key(*sources: dict[str, Any]) -> Any:
    for source in sources:
        for name in _KEYS:
            value = _first(source.get(name))
            if value not in (None, "") and not isinstance(value, (dict, list)):
                return value
    return None


def products_in(data: dict[str, list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """Every schema.org Product (or ProductGroup) in extruct's output, nested ones included."""
    stack = [obj for syntax in data.values() for obj in syntax]
    while stack:
        obj = stack.pop()
        if isinstance(obj, list):
            stack.extend(obj)
            continue
        if not isinstance(obj, dict):
            continue
        if _types(obj) & _PRODUCT_TYPES:
            yield obj.get("properties", obj)
        stack.extend(v for k, v in obj.items() if k in {"@graph", "mainEntity", "itemListElement", "item"})


def variants_of(product: dict[str, Any]) -> list[dict[str, Any]]:
    """A ProductGroup's variants (``hasVariant``) with what they inherit from the group; a
    Product that names its group (``isVariantOf``) inherits from it the same way; else itself."""
    variants = _dicts(product.get("hasVariant"))
    if variants:
        group = {k: product[k] for k in _INHERITED if k in product}
        return [{**group, **variant, "_group": product} for variant in variants]
    parents = _dicts(product.get("isVariantOf"))
    if parents:
        inherited = {k: parents[0][k] for k in _INHERITED if k in parents[0]}
        return [{**inherited, **product, "_group": parents[0]}]
    return [product]


def offers_of(product: dict[str, Any]) -> list[dict[str, Any]]:
    """The product's offers; an AggregateOffer's own list of offers counts as its offers."""
    found = []
    for offer in _dicts(product.get("offers")):
        if "AggregateOffer" in _types(offer) and _dicts(offer.get("offers")):
            found.extend(_dicts(offer.get("offers")))
        else:
            found.append(offer)
    return found


def _price(offer: dict[str, Any]) -> tuple[Any, Any]:
    """(price, currency) of an offer, from itself or its priceSpecification."""
    price, currency = offer.get("price"), offer.get("priceCurrency")
    spec = _dicts(offer.get("priceSpecification"))
    if price in (None, "") and spec:
        price, currency = spec[0].get("price"), currency or spec[0].get("priceCurrency")
    if price in (None, "") and "AggregateOffer" in _types(offer):
        price = offer.get("lowPrice")
    return price, currency


class SchemaOrgSpider(CatalogSpider):
    name = "schema_org"
    custom_settings = {"DEPTH_LIMIT": 5}
    # schema.org defines "." as the decimal mark of ``price``: "1.299" is one euro and 29.9 cents.
    decimal_separator = "."

    def __init__(self, url: str | None = None, max_pages: str | int = 1000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [url] if url else []
        self.max_pages = int(max_pages)
        self.links = LinkExtractor()
        self._pages = 0

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            yield scrapy.Request(url, callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        if not self.is_html(response):
            return
        self._pages += 1
        if not response.body.strip():
            self.crawler.stats.inc_value("schema_org/empty_pages")
            return
        import extruct  # here, not at the top: Scrapy imports every spider module at every start

        try:
            data = extruct.extract(
                response.text, base_url=response.url, syntaxes=["json-ld", "microdata"], uniform=True
            )
        except Exception as exc:  # extruct raises many kinds on broken markup; the page is still crawled
            self.crawler.stats.inc_value("schema_org/extract_errors")
            logger.warning("Could not read structured data on %s: %s", response.url, exc)
            data = {}
        for product in products_in(data):
            yield from self.product_items(product, response)
        if self._pages < self.max_pages:
            # By hostname: LinkExtractor's allow_domains compares host:port and misses ports.
            host = urlsplit(response.url).hostname
            for link in self.links.extract_links(response):
                if urlsplit(link.url).hostname == host:
                    yield response.follow(link.url, callback=self.parse)

    def product_items(self, product: dict[str, Any], response: Response) -> Iterator[ProductItem]:
        """One item per variant, and per offer that carries its own SKU and price; otherwise one
        for the product at its (lowest) price. What cannot be stored (no price, no name) still
        comes out as an item, which validation rejects with the reason."""
        for variant in variants_of(product):
            offers = offers_of(variant)
            own = [o for o in offers if _key(o) is not None and _price(o)[0] not in (None, "")]
            if len(own) > 1 or (own and _key(own[0]) != _key(variant)):
                for offer in own:
                    yield self.product_item(variant, offer, response, sku=_key(offer))
            else:
                yield self.product_item(variant, offers[0] if offers else {}, response)

    def product_item(
        self, product: dict[str, Any], offer: dict[str, Any], response: Response, sku: Any = None
    ) -> ProductItem:
        price, currency = _price(offer)
        url = _first(offer.get("url")) if sku is not None and offer.get("url") else _first(product.get("url"))
        url = response.urljoin(str(url)) if isinstance(url, str) and url.strip() else response.url
        group = product.get("_group") or {}
        return ProductItem(
            source=url_domain(response.url),
            sku=sku if sku is not None else _key(product) or (None if group else url),
            title=_name(product.get("name")),
            price=price,
            # An AggregateOffer's highest price: the range a listing shows ("from 10 to 25 €").
            price_high=offer.get("highPrice") if "AggregateOffer" in _types(offer) else None,
            currency=currency,
            url=url,
            brand=_name(product.get("brand")),
            description=product.get("description"),
            category=_name(product.get("category")),
            availability=_term(offer.get("availability")),
            image=response.urljoin(str(_name(product.get("image")))) if product.get("image") else None,
            released_at=product.get("releaseDate"),
        )
