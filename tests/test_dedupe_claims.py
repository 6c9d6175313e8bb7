"""Dedupe claims sent from the event loop: one script call per batch, on a real Redis."""

from __future__ import annotations

import asyncio

import pytest

from scraper.pipelines.dedupe import _ClaimBatches


def test_claims_made_together_go_in_one_call_and_the_first_page_owns_each_key(clean) -> None:
    async def scenario() -> tuple[list[str], list[str], int]:
        batches = _ClaimBatches(clean.redis_url, asyncio.get_running_loop())
        try:
            # Claims made in one pass of the loop: one batch, each key owned by its first page.
            first = [batches.claim("claims", f"k{i % 30}", f"page{i}") for i in range(60)]
            calls = 0
            owners = [o.decode() for o, _ in await asyncio.gather(*first)]
            client = batches.client  # opened by the first batch
            real = client.execute_command

            async def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
                nonlocal calls
                calls += 1
                return await real(*args, **kwargs)

            client.execute_command = counted
            # Two hashes in one batch (a replay claims in its own): one call each.
            second = [batches.claim("claims" if i % 2 else "replay", f"k{i}", "later") for i in range(10)]
            again = [o.decode() for o, _ in await asyncio.gather(*second)]
            return owners, again, calls
        finally:
            await batches.close()

    owners, again, calls = asyncio.run(scenario())
    assert owners == [f"page{i % 30}" for i in range(60)]
    assert again == [f"page{i}" if i % 2 else "later" for i in range(10)]
    assert calls == 2
    assert clean.redis().hlen("claims") == 30


def test_an_unreachable_redis_fails_every_claim_of_the_batch_with_a_connection_error() -> None:
    import socket

    import redis

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def scenario() -> list[BaseException | bytes]:
        batches = _ClaimBatches(f"redis://127.0.0.1:{port}/0", asyncio.get_running_loop())
        batches.client = _no_retry_client(port)
        try:
            claims = [batches.claim("claims", f"k{i}", "page") for i in range(3)]
            return await asyncio.gather(*claims, return_exceptions=True)
        finally:
            await batches.close()

    results = asyncio.run(scenario())
    assert len(results) == 3 and all(isinstance(r, redis.ConnectionError) for r in results), results


def _no_retry_client(port: int):  # type: ignore[no-untyped-def]
    import redis.asyncio

    return redis.asyncio.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1, retry=None)


@pytest.mark.parametrize("size", [1, 1500])
def test_a_batch_larger_than_the_script_limit_is_split_and_every_claim_answered(clean, size: int) -> None:
    async def scenario() -> list[tuple[bytes, bytes]]:
        batches = _ClaimBatches(clean.redis_url, asyncio.get_running_loop())
        try:
            return await asyncio.gather(*(batches.claim("big", f"k{i}", f"p{i}") for i in range(size)))
        finally:
            await batches.close()

    assert [o.decode() for o, _ in asyncio.run(scenario())] == [f"p{i}" for i in range(size)]


def test_under_another_twisted_reactor_claims_go_from_a_worker_thread_with_the_same_outcome(
    clean, site, catalog
) -> None:
    from support.crawls import assert_each_product_stored_or_rejected_once, crawl_env, run_scrapy
    from support.stats import stat

    result = run_scrapy(
        crawl_env(clean, DEMO_SITE_URL=site.url),
        "crawl",
        "demo",
        "-s",
        "TWISTED_REACTOR=twisted.internet.epollreactor.EPollReactor",
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "EPollReactor" in result.stderr
    # The shop lists some products in two categories: the second sighting is dropped.
    assert stat(result.stderr, "item_duplicates_dropped") > 0
    assert_each_product_stored_or_rejected_once(clean.query, catalog)
