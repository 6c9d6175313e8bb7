"""Whoever writes to the shared queue cannot point a worker at internal services or local files."""

from __future__ import annotations

import os
import stat

import pytest
import scrapy
from scrapy.settings import Settings
from support.crawls import crawl_env, run_scrapy
from support.queue import queue_depth, queue_put

from scraper.backends.redis_client import get_redis
from scraper.config import ConfigError
from scraper.demo_site import Catalog, DemoSite
from scraper.queue import serializer, signing
from scraper.queue.queues import PriorityQueue
from scraper.queue.requests import request_to_dict
from scraper.runtime.secrets import redact
from scraper.spiders.demo import DemoSpider


def _letters(env: dict[str, str]) -> list[str]:
    listing = run_scrapy(env, "dlq", "list", "demo")
    assert listing.returncode == 0, listing.stderr
    return [line for line in listing.stdout.splitlines() if "attempts=" in line]


def test_injected_entries_for_internal_addresses_and_files_are_not_fetched(clean, tmp_path) -> None:
    secret_file = tmp_path / "credentials"
    secret_file.write_text("<html><body><h1>AKIA-SECRET</h1></body></html>")
    catalog = Catalog(products=30)
    # The "internal" service listens on another loopback address the crawl is not allowed.
    with DemoSite(catalog) as site, DemoSite(Catalog(products=5), host="127.0.0.2") as internal:
        env = crawl_env(clean, DEMO_SITE_URL=site.url, FETCH_ALLOW_NETWORKS="127.0.0.1/32")
        queue = PriorityQueue(get_redis(clean.redis_url), DemoSpider(), "{demo}:requests")
        spider = queue.spider
        forged = [
            scrapy.Request(
                internal.origin + "/latest/meta-data/iam/security-credentials/",
                callback=spider.parse_product,
                dont_filter=True,
            ),
            scrapy.Request(
                internal.origin + "/admin/delete",
                method="POST",
                body=b"all=1",
                headers={"X-Admin": "1"},
                callback=spider.parse_product,
                dont_filter=True,
            ),
            scrapy.Request("http://169.254.169.254/latest/meta-data/", callback=spider.parse_product, dont_filter=True),
            scrapy.Request(secret_file.as_uri(), callback=spider.parse_product, dont_filter=True),
        ]
        for request in forged:
            queue.push(request)
        # Written by someone without the fleet secret: plain JSON, and signed with another key.
        product = catalog.valid_products()[0]
        plain = serializer.dumps(
            request_to_dict(
                scrapy.Request(internal.origin + "/p/unsigned.html", callback=spider.parse_product), spider, {}
            )
        )
        redis = get_redis(clean.redis_url)
        queue_put(redis, "{demo}:requests", {plain: 0})
        queue_put(redis, "{demo}:requests", {signing.Signer("not-the-fleet-secret").sign(plain): 0})
        result = run_scrapy(env, "crawl", "demo")
        internal_hits = sum(internal.stats()["requests"].values())
    assert result.returncode == 0, result.stderr[-3000:]
    assert internal_hits == 0
    assert "AKIA-SECRET" not in result.stderr
    letters = _letters(env)
    forbidden = [line for line in letters if "forbidden_address" in line]
    scheme = [line for line in letters if "forbidden_scheme" in line]
    unsigned = [line for line in letters if "unsigned" in line]
    assert len(forbidden) == 3 and len(scheme) == 1 and len(unsigned) == 2, letters
    assert product.sku in {r[0] for r in clean.query("SELECT sku FROM products")}
    shown = run_scrapy(env, "dlq", "show", "demo", unsigned[0].split()[0])
    assert shown.returncode == 0 and "reason:    unsigned" in shown.stdout, shown.stdout + shown.stderr
    assert "/p/unsigned.html" in shown.stdout
    # Not requeueable as is: a requeue would give them the fleet's signature.
    requeued = run_scrapy(env, "dlq", "requeue", "demo", "--reason", "unsigned")
    assert requeued.returncode == 0, requeued.stderr
    assert queue_depth(clean.redis(), "{demo}:requests") == 0
    assert len([line for line in _letters(env) if "unsigned" in line]) == 2
    assert any(secret_file.as_uri() in line for line in scheme)
    # Nothing planted: the rows are the shop's, and no reject carries the file's content.
    stored = {r[0] for r in clean.query("SELECT sku FROM products")}
    assert stored == {p.sku for p in catalog.valid_products()}
    assert not clean.query("SELECT 1 FROM rejects WHERE item::text LIKE '%AKIA-SECRET%'")
    assert "dead_letters/forbidden_address" in result.stderr and "dead_letters/unsigned" in result.stderr
    assert os.environ["SCHEDULER_SECRET"] not in result.stderr + "\n".join(letters)


def test_rotation_accepts_the_previous_secret_and_refuses_others() -> None:
    payload = b'{"url": "http://shop.test/"}'
    rotated = signing.Signer("new-secret-0123456789", "old-secret-0123456789")
    assert rotated.verify(signing.Signer("old-secret-0123456789").sign(payload)) == payload
    assert rotated.verify(rotated.sign(payload)) == payload
    for forged in (payload, signing.Signer("stolen-0123456789").sign(payload), rotated.sign(payload) + b" "):
        with pytest.raises(signing.UnsignedEntry):
            rotated.verify(forged)
    # Entries of the format before the compact one (a 43-character tag), signed with either secret.
    old_format = b"h1." + signing.Signer("old-secret-0123456789").tag(payload) + b"." + payload
    assert rotated.verify(old_format) == payload
    assert rotated.verify(b"h1." + rotated.tag(payload) + b"." + payload) == payload
    with pytest.raises(signing.UnsignedEntry):
        rotated.verify(b"h1." + signing.Signer("stolen-0123456789").tag(payload) + b"." + payload)
    # Once the window is over the old secret's entries are refused.
    with pytest.raises(signing.UnsignedEntry):
        signing.Signer("new-secret-0123456789").verify(signing.Signer("old-secret-0123456789").sign(payload))


def test_a_short_tag_is_refused_unless_it_is_the_fleet_secrets_own() -> None:
    """The entry's tag is 128 bits of HMAC-SHA256 (see signing.py): nothing short of the secret
    makes one, whatever else an injected entry borrows from a real one."""
    payload = b'{"url":"http://shop.test/p/1.html","$":"parse_product"}'
    fleet = signing.Signer("fleet-secret-0123456789")
    good = fleet.sign(payload)
    assert len(good) == len(b"h2") + 22 + len(payload) and fleet.verify(good) == payload
    tag = good[2:24]
    other_tag = fleet.sign(b'{"url":"http://shop.test/p/2.html","$":"parse_product"}')[2:24]
    full_tag = fleet.tag(payload)  # the whole HMAC, 43 characters: the stream's and the old entries'
    planted = b'{"url":"http://169.254.169.254/","$":"parse_product"}'
    forged = [
        signing.Signer("stolen-0123456789").sign(payload),  # another key
        b"h2" + tag + planted,  # a real tag on another request
        b"h2" + other_tag + payload,  # another request's tag
        b"h2" + tag[:-1] + payload,  # a tag cut short
        b"h2" + tag[:-1] + (b"B" if tag[-1:] != b"B" else b"C") + payload,  # one character changed
        b"h2" + full_tag + payload,  # the whole HMAC where the short one belongs
        b"h1." + tag + b"." + payload,  # the short tag in the old format
        b"h2" + payload,  # no tag
        b"h2",
        payload,
    ]
    for entry in forged:
        with pytest.raises(signing.UnsignedEntry):
            fleet.verify(entry)


def test_the_secret_is_required_with_a_shared_redis_and_kept_0600_for_the_embedded_one(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SCHEDULER_SECRET", raising=False)
    monkeypatch.delenv("SCHEDULER_SECRET_PREVIOUS", raising=False)
    with pytest.raises(ConfigError, match=r"^SCHEDULER_SECRET: required"):
        signing.resolve_secret(Settings({"REDIS_URL": "redis://10.0.0.5:6379/0"}))
    with pytest.raises(ConfigError, match=r"^SCHEDULER_SECRET: still the placeholder"):
        signing.resolve_secret(Settings({"REDIS_URL": "redis://10.0.0.5/0", "SCHEDULER_SECRET": "change-me"}))
    with pytest.raises(ConfigError, match=r"^REDIS_URL: its password"):
        signing.resolve_secret(Settings({"REDIS_URL": "redis://:change-me@redis/0", "SCHEDULER_SECRET": "s" * 32}))
    # The embedded Redis: no REDIS_URL, or the unix socket backends.apply writes for it.
    assert signing.resolve_secret(Settings({"REDIS_URL": f"unix://{tmp_path}/redis.sock", "DATA_DIR": str(tmp_path)}))
    embedded = Settings({"REDIS_URL": "", "DATA_DIR": str(tmp_path)})
    first, _ = signing.resolve_secret(embedded)
    assert len(first) >= 32 and signing.resolve_secret(embedded)[0] == first  # made once, kept
    assert stat.S_IMODE((tmp_path / signing.SECRET_FILE).stat().st_mode) == 0o600
    assert redact(f"secret={first}") == "secret=***"


def test_the_boundary_refuses_internal_addresses_and_hosts_outside_allowed_domains() -> None:
    from scrapy.utils.test import get_crawler

    from scraper.middlewares.fetch_boundary import FetchBoundaryMiddleware, forbidden, on_domains

    class Shop(scrapy.Spider):
        name = "shop"
        allowed_domains = ["shop.test"]

    boundary = FetchBoundaryMiddleware(get_crawler(Shop, {"FETCH_ALLOW_NETWORKS": "10.1.0.0/16"}))
    assert on_domains("shop.test", Shop.allowed_domains) and on_domains("www.shop.test", Shop.allowed_domains)
    assert not on_domains("evilshop.test", Shop.allowed_domains)
    assert not on_domains("169.254.169.254", Shop.allowed_domains)
    refused = (
        "127.0.0.1",
        "10.2.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "0.0.0.0",
        "::ffff:127.0.0.1",
        "100.64.0.1",
        "224.0.0.1",
    )
    assert all(forbidden(a, boundary.allowed) for a in refused)
    assert not forbidden("10.1.2.3", boundary.allowed) and not forbidden("93.184.216.34", boundary.allowed)
    with pytest.raises(ConfigError, match="^FETCH_ALLOW_NETWORKS"):
        FetchBoundaryMiddleware(get_crawler(Shop, {"FETCH_ALLOW_NETWORKS": "10.1.0.0/33"}))


def test_a_processing_stream_entry_without_the_fleet_signature_is_refused() -> None:
    import zlib

    from scraper.processing import entry as entries
    from scraper.queue import serializer as json

    head = json.dumps(
        {
            "url": "http://shop.test/p/1.html",
            "status": 200,
            "headers": [],
            "flags": [],
            "run": None,
            "request": {"url": "http://shop.test/p/1.html"},
        }
    )
    body = zlib.compress(b"<html>planted</html>")
    for signature in (b"", signing.Signer("stolen-0123456789").tag(head + b"\0" + body)):
        with pytest.raises(signing.UnsignedEntry):
            entries.decode({b"m": head, b"b": body, b"s": signature})
    good = entries.decode({b"m": head, b"b": body, b"s": signing.current().tag(head + b"\0" + body)})
    assert good.body == b"<html>planted</html>"
