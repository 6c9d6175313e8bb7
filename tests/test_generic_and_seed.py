"""The generic schema.org spider, start URLs fed from Redis by `scrapy seed`, and migrations."""

from __future__ import annotations

from support.crawls import crawl_env, project_with_spider, run_scrapy
from support.queue import queue_depth

from scraper.demo_site import Catalog, DemoSite


def test_schema_org_spider_reads_the_demo_shop_from_json_ld(clean, site: DemoSite, catalog: Catalog) -> None:
    result = run_scrapy(crawl_env(clean), "crawl", "schema_org", "-a", f"url={site.url}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r[0]: r for r in clean.query("SELECT sku, title, price, currency, source FROM products")}
    # The truncated page lost its JSON-LD with its tail; every other valid product is there.
    expected = [p for p in catalog.valid_products() if p.kind != "truncated"]
    assert sorted(rows) == sorted(p.sku for p in expected)
    for p in expected:
        assert rows[p.sku][1:] == (p.title, p.price, p.currency, "127.0.0.1")


def test_seeded_urls_are_crawled(clean, site: DemoSite, catalog: Catalog, tmp_path) -> None:
    chosen = catalog.valid_products()[:3]
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("# start here\n\n" + "\n".join(site.origin + p.canonical_path for p in chosen[:2]) + "\n")
    env = crawl_env(clean)
    result = run_scrapy(env, "seed", "schema_org", str(seeds), site.origin + chosen[2].canonical_path)
    assert result.returncode == 0, result.stderr
    assert "queued 3 start URL(s) for 'schema_org'; 3 request(s) now in its queue" in result.stdout
    # max_pages=1: parse the seeds only, follow nothing.
    result = run_scrapy(env, "crawl", "schema_org", "-a", "max_pages=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(r[0] for r in clean.query("SELECT sku FROM products")) == sorted(p.sku for p in chosen)


def test_seed_refuses_what_is_not_a_url(clean, tmp_path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("http://ok.example/\nnot a url\n")
    result = run_scrapy(crawl_env(clean), "seed", "demo", str(bad))
    assert result.returncode != 0 and "bad.txt:2: not a URL" in result.stderr
    assert queue_depth(clean.redis(), "{demo}:requests") == 0  # all or nothing


def test_migrate_is_idempotent_and_adds_new_columns(clean) -> None:
    env = crawl_env(clean)
    first = run_scrapy(env, "migrate")
    assert first.returncode == 0, first.stderr
    assert "created table products" in first.stdout and "created table rejects" in first.stdout
    # The tables a node's start or a command makes on first use too: a node needing no CREATE right.
    for table in ("pages", "crawl_runs", "run_quality", "run_checks", "archive_index", "field_sources"):
        assert clean.query("SELECT to_regclass(%s) IS NOT NULL", (table,)) == [(True,)], table
    for table in ("pages", "crawl_runs", "run_quality", "archive_index", "field_sources"):
        assert f"created table {table}" in first.stdout, first.stdout
    again = run_scrapy(env, "migrate")
    assert again.returncode == 0 and "schema up to date" in again.stdout
    clean.query("ALTER TABLE products DROP COLUMN brand")
    third = run_scrapy(env, "migrate")
    assert "added column products.brand text" in third.stdout
    columns = {
        r[0] for r in clean.query("SELECT column_name FROM information_schema.columns WHERE table_name = 'products'")
    }
    assert {"brand", "content_hash", "first_seen", "last_seen", "updated_at"} <= columns


REVIEW_ITEM = """
from scrapy import Field

from .base import StoredItem


class ReviewItem(StoredItem):
    table = "reviews"
    key = ("source", "review_id")
    source = Field(sql="text", required=True, type=str)
    review_id = Field(sql="text", required=True, clean="text", type=str)
    rating = Field(sql="integer", type=int, minimum=1)
"""


def test_migrate_finds_the_item_types_of_every_module_of_the_items_package(clean, tmp_path) -> None:
    """A type declared next to product.py gets its table with no import to add; a module there
    that cannot be imported stops migrate, naming it, before any change."""
    project = project_with_spider(tmp_path, "nothing", "")
    items = project / "scraper" / "items"
    (items / "review.py").write_text(REVIEW_ITEM)
    env = crawl_env(clean, PYTHONPATH=str(project))
    found = run_scrapy(env, "migrate", cwd=project)
    assert found.returncode == 0, found.stderr[-3000:]
    assert "created table reviews (key: source, review_id)" in found.stdout

    (items / "broken.py").write_text("import a_module_nobody_installed\n")
    (items / "extra.py").write_text(REVIEW_ITEM.replace("Review", "Extra").replace('"reviews"', '"extras"'))
    broken = run_scrapy(env, "migrate", cwd=project)
    assert broken.returncode == 2 and "Traceback" not in broken.stderr, broken.stderr[-3000:]
    errors = [line for line in broken.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: scraper.items.broken cannot be imported (ModuleNotFoundError: No module named "
        "'a_module_nobody_installed'): its item types would get no table; nothing migrated"
    ], broken.stderr[-3000:]
    assert clean.query("SELECT to_regclass('extras') IS NULL") == [(True,)]
