"""Shared fixtures: real Redis, real Postgres, the real demo site, crawls as real processes.

Redis and Postgres are this machine's services when ``REDIS_URL`` / ``DATABASE_URL`` name them
(``.ci/run`` exports them), otherwise the embedded servers. Tests never touch the data they are
pointed at: each test session claims one of Redis databases 8-15 (a lock key in database 0) and
a Postgres database of the same number, both emptied before each test, so two test runs on one
machine do not interfere.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from typing import Any

import psycopg2
import pytest
import redis
from scrapy.settings import Settings
from support.crawls import TEST_SCHEDULER_SECRET, Services, with_database, with_redis_db
from support.processes import wait_for

from scraper import backends
from scraper.demo_site import Catalog, DemoSite

TEST_REDIS_DBS = range(15, 7, -1)


@pytest.fixture(scope="session")
def services():
    data_dir = tempfile.mkdtemp(prefix="scraper-test-")
    found = backends.resolve(
        Settings(
            {
                "REDIS_URL": os.environ.get("REDIS_URL", ""),
                "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
                "DATA_DIR": data_dir,
            }
        )
    )
    locks = redis.Redis.from_url(with_redis_db(found.redis_url, 0))
    lock = db = None
    for candidate in TEST_REDIS_DBS:
        if locks.set(f"scraper:test-session:{candidate}", os.getpid(), nx=True, ex=6 * 3600):
            lock, db = f"scraper:test-session:{candidate}", candidate
            break
    assert db is not None, "Redis databases 8-15 are all claimed by other test sessions"
    database = f"scraper_test_{db}"
    admin = psycopg2.connect(found.database_url)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {database}")
    admin.close()
    yield Services(with_redis_db(found.redis_url, db), with_database(found.database_url, database))
    locks.delete(lock)


@pytest.fixture
def clean(services: Services) -> Services:
    services.redis().flushdb()
    conn = psycopg2.connect(services.database_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    conn.close()
    return services


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return Catalog(products=120)


@pytest.fixture
def site(catalog: Catalog):
    with DemoSite(catalog) as running:
        yield running


os.environ.setdefault("SCHEDULER_SECRET", TEST_SCHEDULER_SECRET)


@pytest.fixture
def own_redis(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            "/usr/bin/redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(tmp_path),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    wait_for(answers, timeout=20, step=0.05)
    yield client
    proc.terminate()
    proc.wait(timeout=30)


# `make test-fast` runs the tests that start no process (no crawl, no command, no server of their
# own): a test is marked `process` when its body, or a fixture it asks for, starts one.
_PROCESS_CALLS = (
    "run_scrapy",
    "start_crawl",
    "crawl(",
    "Popen",
    "subprocess.run",
    "LocalCluster",
    "Stoppable",
    "ensure_binary",
    "Logged(",
    "scrapyd",
    "_run(",
)
_PROCESS_FIXTURES = {"own_redis", "s3_server", "postgres", "redis_server", "cluster", "small_disk", "read_only_folder"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "process: starts a process (a crawl, a command, a server); not in test-fast")


def _starting_process(module: Any) -> set[str]:
    """Names of the module's functions (and fixtures) that start a process, directly or through
    one another."""
    import inspect

    sources = {}
    for name, value in vars(module).items():
        if (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == module.__name__:
            try:
                sources[name] = inspect.getsource(value)
            except (OSError, TypeError):
                pass
    starting = {n for n, src in sources.items() if any(call in src for call in _PROCESS_CALLS)}
    while True:
        more = {n for n, src in sources.items() if n not in starting and any(f"{s}(" in src for s in starting)}
        if not more:
            return starting
        starting |= more


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import inspect

    by_module: dict[str, set[str]] = {}
    for item in items:
        function = getattr(item, "function", None)
        module = getattr(item, "module", None)
        if function is None or module is None:
            continue
        if module.__name__ not in by_module:
            by_module[module.__name__] = _starting_process(module)
        starting = by_module[module.__name__]
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            source = ""
        fixtures = set(getattr(item, "fixturenames", ()))
        if (
            any(call in source for call in _PROCESS_CALLS)
            or any(f"{name}(" in source for name in starting)
            or fixtures & (_PROCESS_FIXTURES | starting)
        ):
            item.add_marker(pytest.mark.process)
