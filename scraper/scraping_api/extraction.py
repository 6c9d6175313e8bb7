"""Structured extraction by the scraping API, turned into our items.

AlterLab extracts data from a page when the call names an ``extraction_schema`` (a JSON schema),
an ``extraction_profile`` (``product``, ``article``...) or an ``extraction_prompt``; the answer's
``extraction_result`` reaches the spider in ``response.meta["scraping_api_extraction"]``. From
there the result becomes ordinary items that go through the same clean, validate, dedupe and
store pipelines as items a spider built with selectors.

    class Shop(scrapy.Spider):
        scraping_api = {"extraction_schema": extraction_schema(ProductItem)}

        def parse(self, response):
            yield from items_from_extraction(response, ProductItem)
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from scrapy.http import Response

from ..cleaning import url_domain
from ..items.base import StoredItem
from .middleware import EXTRACTION_META

_JSON_TYPES = {str: "string", Decimal: "number", int: "integer", float: "number", bool: "boolean", datetime: "string"}
# What extraction profiles call the fields our item types name differently.
ALIASES = {
    "title": ("name", "title", "product_name"),
    "image": ("image", "image_url", "images"),
    "released_at": ("release_date", "releaseDate", "released_at", "date_published"),
}
# Fields the pipeline fills itself: never asked of the API.
OWN_FIELDS = frozenset({"source"})


def extraction_schema(item_cls: type[StoredItem]) -> dict[str, Any]:
    """A JSON schema built from the item type's declared fields (types, required ones)."""
    properties: dict[str, Any] = {}
    for name, meta in item_cls.fields.items():
        if name in OWN_FIELDS or not meta.get("sql"):
            continue
        kind = _JSON_TYPES.get(meta.get("type"), "string")
        prop: dict[str, Any] = {"type": [kind, "string", "null"] if kind == "number" else [kind, "null"]}
        if meta.get("type") is datetime:
            prop["format"] = "date-time"
        properties[name] = prop
    required = [n for n, m in item_cls.fields.items() if m.get("required") and n in properties]
    return {"type": "object", "properties": properties, "required": required}


def extraction_of(response: Response) -> Any:
    """The API's extraction result for this response (taken out of the meta, so a request
    re-queued later does not carry it into the shared queue), or None."""
    return response.meta.pop(EXTRACTION_META, None)


def _records(result: Any) -> list[dict[str, Any]]:
    if isinstance(result, list):
        return [r for r in result if isinstance(r, dict)]
    if isinstance(result, dict):
        for key in ("products", "items", "results"):
            if isinstance(result.get(key), list):
                return [r for r in result[key] if isinstance(r, dict)]
        return [result]
    return []


def _value(record: dict[str, Any], name: str) -> Any:
    for key in ALIASES.get(name, (name,)):
        value = record.get(key)
        if isinstance(value, list) and name == "image":
            value = value[0] if value else None
        if isinstance(value, dict):  # {"name": ...} as schema.org nests brands and offers
            value = value.get("name") or value.get("value") or value.get("url")
        if value not in (None, ""):
            return value
    return None


def items_from_extraction(
    response: Response, item_cls: type[StoredItem], result: Any = None, require: tuple[str, ...] = ("price", "sku")
) -> Iterator[StoredItem]:
    """One item per extracted record that names at least one of *require* (a listing page
    extracted with a product profile names neither and yields nothing). Missing ``sku``-like
    keys fall back to the page URL; ``source`` is the page's site, as the other spiders set it."""
    if result is None:
        result = extraction_of(response)
    for record in _records(result):
        if not any(_value(record, name) not in (None, "") for name in require):
            continue
        item = item_cls()
        for name in item_cls.fields:
            value = _value(record, name)
            if value is not None:
                item[name] = value
        if "url" in item_cls.fields:
            item["url"] = response.urljoin(str(item.get("url") or response.url))
        for name in item_cls.key:
            if name == "source" and "source" in item_cls.fields:
                item.setdefault("source", url_domain(response.url))
            elif not item.get(name):
                item[name] = response.url
        yield item
