"""A field read with ``getall()``: joined with the separator it declares (``join="; "``), or kept
as a list (``type=list``) in a ``text[]`` or ``jsonb`` column, so that what a page lists can be
told apart again once stored."""

from __future__ import annotations

import pytest
import scrapy
from scrapy import Field
from scrapy.utils.test import get_crawler
from support.crawls import crawl_env, project_with_spider, run_scrapy

from scraper.demo_site import Catalog, DemoSite
from scraper.items.base import StoredItem
from scraper.pipelines.clean import CleanPipeline
from scraper.pipelines.validate import check


class Posting(StoredItem):
    table = "postings"
    key = ("source", "ref")

    source = Field(sql="text", required=True, type=str)
    ref = Field(sql="text", required=True, clean="text", type=str)
    benefits = Field(sql="text", clean="text", type=str, join="; ")
    summary = Field(sql="text", clean="text", type=str, join=True)
    tags = Field(sql="text[]", clean="text", type=list, max_length=12)
    links = Field(sql="jsonb", clean="url", type=list)


class Board(scrapy.Spider):
    name = "board"


def cleaned(**values: object) -> Posting:
    crawler = get_crawler(Board)
    crawler.spider = crawler._create_spider()
    return CleanPipeline(crawler).process_item(Posting(ref="1", **values))


def test_parts_are_joined_with_the_declared_separator_or_kept_apart() -> None:
    item = cleaned(
        benefits=["  Remote\twork ", "", "Stock &amp; options", None, "<b>Gym</b>"],
        summary=["A  short", "summary"],
        tags=["  python ", "", "  ", "sql"],
        links=["https://Example.com/a/../jobs#top", "http://example.com/b"],
    )
    assert check(item) == []
    assert item["benefits"] == "Remote work; Stock & options; Gym"
    assert item["benefits"].split("; ") == ["Remote work", "Stock & options", "Gym"]
    assert item["summary"] == "A short summary"  # join=True: a space, as before
    assert item["tags"] == ["python", "sql"]
    assert item["links"] == ["https://example.com/jobs", "http://example.com/b"]
    # One value is a list of one; nothing left is no value; one part is joined as itself.
    item = cleaned(tags="rust", links=["", None], benefits="Remote")
    assert item["tags"] == ["rust"] and item["links"] is None and item["benefits"] == "Remote"


def test_a_bad_part_is_a_reject_naming_the_field_and_the_part() -> None:
    item = cleaned(tags=["python", "a tag far too long"], links=["https://example.com/", "mailto:x@example.com"])
    assert check(item) == [
        "links: part 2 is not an http(s) URL: 'mailto:x@example.com'",
        "tags: part 2 longer than 12 characters (18)",
    ]
    assert check(cleaned(tags=["ok", {"not": "text"}]))[0].startswith("tags: part 2 is not text but dict")


@pytest.mark.parametrize(
    ("field", "message"),
    [
        (Field(sql="text", clean="text", join=""), "join must be True (a space) or the separator"),
        (Field(sql="text", clean="text", join=3), "join must be True (a space) or the separator"),
        (Field(sql="text", clean="url", join="; "), 'join needs clean="text"'),
        (Field(sql="text[]", clean="text", type=list, join=True), "declare one of the two"),
        (Field(sql="text", clean="text", type=list), 'needs an array or JSON column (sql="text[]" or "jsonb")'),
        (Field(sql="numeric[]", clean="price", type=list), "clean='price' cannot"),
    ],
)
def test_a_declaration_the_pipelines_would_store_wrongly_fails_at_import(field: Field, message: str) -> None:
    with pytest.raises(TypeError, match="^Broken.parts: ") as raised:
        type("Broken", (StoredItem,), {"table": "broken", "key": ("ref",), "ref": Field(sql="text"), "parts": field})
    assert message in str(raised.value)


SHELF_SPIDER = """
from scrapy import Field

from scraper.items.base import StoredItem
from scraper.spiders.demo import DemoSpider


class ShelfItem(StoredItem):
    table = "shelves"
    key = ("source", "sku")
    source = Field(sql="text", required=True, type=str)
    sku = Field(sql="text", required=True, clean="text", type=str)
    trail = Field(sql="text", clean="text", type=str, join=" > ")
    categories = Field(sql="text[]", clean="text", type=list)
    pages = Field(sql="jsonb", clean="url", type=list)


class ShelfSpider(DemoSpider):
    name = "shelf"

    def parse_product(self, response):
        yield ShelfItem(
            sku=response.css(".sku::text").get(),
            trail=response.css(".breadcrumb a::text").getall(),
            categories=response.css("nav.categories a::text").getall(),
            pages=[response.urljoin(h) for h in response.css("nav.categories a::attr(href)").getall()],
        )
"""


def test_a_crawl_stores_joined_text_and_lists_that_split_back(clean, tmp_path) -> None:
    project = project_with_spider(tmp_path, "shelf", SHELF_SPIDER)
    catalog = Catalog(products=12, broken=False)
    with DemoSite(catalog) as site:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, PYTHONPATH=str(project))
        result = run_scrapy(env, "crawl", "shelf", cwd=project)
        origin = site.origin
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not clean.query("SELECT reasons FROM rejects")
    rows = clean.query("SELECT sku, trail, categories, pages FROM shelves ORDER BY sku")
    assert len(rows) == len(catalog.products)
    types = dict(
        clean.query("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'shelves'")
    )
    assert types["categories"] == "ARRAY" and types["pages"] == "jsonb"
    sku, trail, categories, pages = rows[0]
    assert trail.split(" > ")[0] == "Home" and len(trail.split(" > ")) == 2
    assert "Kitchen & Dining" in categories and len(categories) == len(pages) > 2
    assert all(page.startswith(origin + "/c/") for page in pages)
