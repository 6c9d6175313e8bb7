"""An item type of the tests' own, stored like any project's (the storage tests and their users)."""

from __future__ import annotations

from decimal import Decimal

from scrapy import Field

from scraper.items.base import StoredItem
from scraper.storage import history
from scraper.storage.upsert import Row, TableUpserter


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


class GadgetHistory:
    """Gadgets written as the pipeline writes them: inserts, changes, gone-marks and returns,
    each with its history row in the same transaction (spider ``t``, run 1)."""

    def __init__(self, database_url: str) -> None:
        import psycopg2

        from scraper.storage import schema

        self.conn = psycopg2.connect(database_url)
        schema.migrate(self.conn, [Gadget])
        self.upserter = TableUpserter("gadgets", COLUMNS, ("shop", "code"), 3600.0, spider="t", track=True)

    def write(self, rows: list[Row]) -> None:
        with self.conn, self.conn.cursor() as cur:
            result = self.upserter.write(cur, rows)
            history.record(cur, "gadgets", result.changes, history.Context("t", 1))

    def gone(self, codes: list[str]) -> None:
        """*codes* marked gone, as a crawl that no longer finds them does."""
        with self.conn, self.conn.cursor() as cur:
            cur.execute(
                "WITH g AS (UPDATE gadgets SET gone_at = now() WHERE code = ANY(%s) RETURNING code)"
                " INSERT INTO item_changes (item_table, key, kind, reason, spider, run_id)"
                " SELECT 'gadgets', jsonb_build_array('s', code), 'gone', 'crawl', 't', 1 FROM g ORDER BY code",
                (list(codes),),
            )

    def close(self) -> None:
        self.conn.close()
