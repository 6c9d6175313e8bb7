"""An item type of the tests' own, stored like any project's (the storage tests and their users)."""

from __future__ import annotations

from decimal import Decimal

from scrapy import Field

from scraper.items.base import StoredItem
from scraper.storage.upsert import Row


class Gadget(StoredItem):
    table = "gadgets"
    key = ("shop", "code")
    shop = Field(sql="text")
    code = Field(sql="text")
    name = Field(sql="text")
    price = Field(sql="numeric(8,2)")
    seen = Field(sql="timestamptz")


COLUMNS = list(Gadget.columns())


def row(code: str, name: str, price: str = "1.00") -> Row:
    values = {"shop": "s", "code": code, "name": name, "price": Decimal(price), "seen": None}
    return Row(key=("s", code), values=values)
