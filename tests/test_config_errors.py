"""Bad configuration fails at start with one line naming the setting, never a traceback."""

from __future__ import annotations

import socket

from support.crawls import crawl_env, run_scrapy
from support.errors import CANARY, check_one_line_error


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_redis(services) -> None:
    env = crawl_env(services, REDIS_URL=f"redis://:{CANARY}@127.0.0.1:{free_port()}/0")
    line = check_one_line_error(run_scrapy(env, "crawl", "demo"), "REDIS_URL")
    assert "cannot connect" in line and ":***@" in line


def test_unreachable_postgres(services) -> None:
    env = crawl_env(services, DATABASE_URL=f"postgresql://u:{CANARY}@127.0.0.1:{free_port()}/db")
    line = check_one_line_error(run_scrapy(env, "crawl", "demo"), "DATABASE_URL")
    assert "cannot connect" in line


def test_malformed_urls(services) -> None:
    env = crawl_env(services, REDIS_URL=f"http://:{CANARY}@127.0.0.1/")
    check_one_line_error(run_scrapy(env, "crawl", "demo"), "REDIS_URL")
    env = crawl_env(services, DATABASE_URL=f"mysql://root:{CANARY}@127.0.0.1/db")
    check_one_line_error(run_scrapy(env, "crawl", "demo"), "DATABASE_URL")


def test_malformed_number(services) -> None:
    env = crawl_env(services, POSTGRES_BATCH_SIZE="lots")
    line = check_one_line_error(run_scrapy(env, "crawl", "demo"), "POSTGRES_BATCH_SIZE")
    assert "'lots'" in line
    env = crawl_env(services, CONCURRENT_REQUESTS="0")
    check_one_line_error(run_scrapy(env, "crawl", "demo"), "CONCURRENT_REQUESTS")
    env = crawl_env(services, DOWNLOAD_POOL_PER_HOST="0")
    check_one_line_error(run_scrapy(env, "crawl", "demo"), "DOWNLOAD_POOL_PER_HOST")


def test_seed_and_migrate_report_the_same_way(services) -> None:
    env = crawl_env(services, REDIS_URL=f"redis://:{CANARY}@127.0.0.1:{free_port()}/0")
    check_one_line_error(run_scrapy(env, "seed", "demo", "http://127.0.0.1/"), "REDIS_URL")
    env = crawl_env(services, DATABASE_URL=f"postgresql://u:{CANARY}@127.0.0.1:{free_port()}/db")
    check_one_line_error(run_scrapy(env, "migrate"), "DATABASE_URL")


def test_bad_scraping_api_setting(services) -> None:
    env = crawl_env(services, SCRAPING_API_KEY=CANARY, SCRAPING_API_PROVIDER="bogus")
    line = check_one_line_error(run_scrapy(env, "crawl", "demo"), "SCRAPING_API_PROVIDER")
    assert "'bogus'" in line


def test_queue_commands_on_a_shared_redis_without_the_fleet_secret_say_it_in_one_line(services) -> None:
    env = {k: v for k, v in crawl_env(services).items() if k != "SCHEDULER_SECRET"}
    for args in (("seed", "demo", "http://127.0.0.1/"), ("queue", "demo"), ("dlq", "list", "demo")):
        check_one_line_error(run_scrapy(env, *args), "SCHEDULER_SECRET")
