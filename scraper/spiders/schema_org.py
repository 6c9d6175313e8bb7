"""A generic spider for any shop that publishes schema.org ``Product`` data.

``scrapy crawl schema_org -a url=https://shop.example/ [-a max_pages=500]`` follows links on the
start URL's site and stores every Product found in JSON-LD or microdata (read with extruct).
Without ``-a url`` it crawls what ``scrapy seed schema_org <urls>`` queued; either way it only
follows links that stay on the host of the page they were found on.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Iterator
from urllib.parse import urlsplit

import extruct
import scrapy
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor

from ..cleaning import url_domain
from ..items import ProductItem
from .base import CatalogSpider

logger = logging.getLogger(__name__)


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value


def _name(value: Any) -> Any:
    value = _first(value)
    return value.get("name") if isinstance(value, dict) else value


def products_in(data: dict[str, list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """Every schema.org Product in extruct's output, including those nested in @graph."""
    stack = [obj for syntax in data.values() for obj in syntax]
    while stack:
        obj = stack.pop()
        if isinstance(obj, list):
            stack.extend(obj)
            continue
        if not isinstance(obj, dict):
            continue
        types = obj.get("@type") or obj.get("type") or []
        types = types if isinstance(types, list) else [types]
        if any(str(t).rsplit("/", 1)[-1] in {"Product", "ProductModel", "IndividualProduct"} for t in types):
            yield obj.get("properties", obj)
        stack.extend(v for k, v in obj.items() if k in {"@graph", "mainEntity", "itemListElement", "item"})


class SchemaOrgSpider(CatalogSpider):
    name = "schema_org"
    custom_settings = {"DEPTH_LIMIT": 5}

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
        try:
            data = extruct.extract(
                response.text, base_url=response.url, syntaxes=["json-ld", "microdata"], uniform=True
            )
        except Exception as exc:  # extruct raises many kinds on broken markup; the page is still crawled
            self.crawler.stats.inc_value("schema_org/extract_errors")
            logger.warning("Could not read structured data on %s: %s", response.url, exc)
            data = {}
        for product in products_in(data):
            yield self.product_item(product, response)
        if self._pages < self.max_pages:
            # By hostname: LinkExtractor's allow_domains compares host:port and misses ports.
            host = urlsplit(response.url).hostname
            for link in self.links.extract_links(response):
                if urlsplit(link.url).hostname == host:
                    yield response.follow(link.url, callback=self.parse)

    def product_item(self, product: dict[str, Any], response: Response) -> ProductItem:
        offer = _first(product.get("offers")) or {}
        if isinstance(offer, dict) and offer.get("@type") == "AggregateOffer":
            price = offer.get("lowPrice") or offer.get("price")
        else:
            price = offer.get("price") if isinstance(offer, dict) else None
        url = product.get("url") or response.url
        return ProductItem(
            source=url_domain(response.url),
            sku=product.get("sku") or product.get("gtin13") or product.get("gtin") or product.get("mpn")
            or product.get("productID") or response.urljoin(str(_first(url))),
            title=_name(product.get("name")),
            price=price,
            currency=offer.get("priceCurrency") if isinstance(offer, dict) else None,
            url=response.urljoin(str(_first(url))),
            brand=_name(product.get("brand")),
            description=product.get("description"),
            category=_name(product.get("category")),
            availability=str(offer.get("availability") or "").rsplit("/", 1)[-1] or None
            if isinstance(offer, dict) else None,
            image=response.urljoin(str(_name(product.get("image")))) if product.get("image") else None,
            released_at=product.get("releaseDate"),
        )
