"""A product offered by a shop: the item type of the demo and the schema.org spiders."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from scrapy import Field

from .base import StoredItem


class ProductItem(StoredItem):
    table = "products"
    key = ("source", "sku")

    # Which site the product comes from; filled with the spider's name when left empty.
    source = Field(sql="text", required=True, type=str, max_length=200)
    sku = Field(sql="text", required=True, clean="text", type=str, max_length=200)
    title = Field(sql="text", required=True, clean="text", type=str, max_length=2000)
    # Four decimals hold every ISO 4217 minor unit (JPY 0, USD 2, KWD 3, CLF 4); amounts are
    # rounded to their own currency's unit when cleaned.
    price = Field(sql="numeric(20,4)", required=True, clean="price", type=Decimal, minimum=0)
    # The top of a price range (a schema.org AggregateOffer's highPrice), in the same currency.
    price_high = Field(sql="numeric(20,4)", clean="price", type=Decimal, minimum=0)
    # The ISO 4217 code; a symbol or name given here ("€", "руб.") is mapped to it when cleaned.
    currency = Field(sql="text", required=True, type=str, pattern=r"^[A-Z]{3}$")
    url = Field(sql="text", required=True, clean="url", type=str)
    brand = Field(sql="text", clean="text", type=str, max_length=500)
    # Often read with getall(): its parts are joined, where other fields take one value.
    description = Field(sql="text", clean="text", type=str, join=True)
    category = Field(sql="text", clean="text", type=str)
    # schema.org's ItemAvailability term (InStock, OutOfStock...) when the page's value names one.
    availability = Field(sql="text", clean="availability", type=str)
    image = Field(sql="text", clean="url", type=str)
    released_at = Field(sql="timestamptz", clean="date", type=datetime)
