"""A canary password in DATABASE_URL must not surface anywhere a crawl writes."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from support.crawls import crawl_env, run_scrapy

from scraper.demo_site import DemoSite

CANARY = "Canary-9f3b1e77"


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or "postgres"
    return urlunsplit((parts.scheme, f"{user}:{password}@{host}", parts.path, parts.query, ""))


def test_database_password_never_reaches_logs_stats_redis_or_postgres(clean, site: DemoSite) -> None:
    # Trust authentication on the test server accepts any password, so the canary is really used.
    env = crawl_env(
        clean, DATABASE_URL=with_password(clean.database_url, CANARY), DEMO_SITE_URL=site.url, LOG_LEVEL="DEBUG"
    )
    result = run_scrapy(env, "crawl", "demo")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Storing items in postgresql://postgres:***@" in result.stderr  # the URL was logged, masked
    assert CANARY not in result.stdout + result.stderr
    # Redis (left-over keys of any kind) and every text column of every table.
    r = clean.redis()
    r.set("probe", "1")  # the crawl completed and cleared its keys; make sure we are looking at the right db
    for key in r.keys("*"):
        assert CANARY.encode() not in key
        assert CANARY.encode() not in r.dump(key)
    rows = clean.query("SELECT t::text FROM products t UNION ALL SELECT r::text FROM rejects r")
    assert rows and not any(CANARY in row[0] for row in rows)


def test_every_log_record_is_redacted(caplog) -> None:
    import logging

    from scraper.runtime.secrets import install_log_redaction, register_url_password

    install_log_redaction()
    register_url_password(f"redis://:{CANARY}@10.1.2.3:6379/0")
    log = logging.getLogger("some.library")
    with caplog.at_level(logging.INFO):
        log.info("connecting to %s", f"redis://:{CANARY}@10.1.2.3:6379/0")
        try:
            raise RuntimeError(f"auth failed with {CANARY}")
        except RuntimeError:
            log.exception("boom")
    text = caplog.text
    assert "connecting to redis://:***@10.1.2.3" in text and "auth failed with ***" in text
    assert CANARY not in text
