"""The generic schema.org spider, start URLs fed from Redis by `scrapy seed`, and migrations."""

from __future__ import annotations

from support.crawls import crawl_env, run_scrapy

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
    assert clean.redis().zcard("{demo}:requests") == 0  # all or nothing


def test_migrate_is_idempotent_and_adds_new_columns(clean) -> None:
    env = crawl_env(clean)
    first = run_scrapy(env, "migrate")
    assert first.returncode == 0, first.stderr
    assert "created table products" in first.stdout and "created table rejects" in first.stdout
    again = run_scrapy(env, "migrate")
    assert again.returncode == 0 and "schema up to date" in again.stdout
    clean.query("ALTER TABLE products DROP COLUMN brand")
    third = run_scrapy(env, "migrate")
    assert "added column products.brand text" in third.stdout
    columns = {
        r[0] for r in clean.query("SELECT column_name FROM information_schema.columns WHERE table_name = 'products'")
    }
    assert {"brand", "content_hash", "first_seen", "last_seen", "updated_at"} <= columns
