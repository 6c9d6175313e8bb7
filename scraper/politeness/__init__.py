"""Per-domain politeness held in Redis: the whole fleet of crawl processes obeys one limit.

* :mod:`.limits` - ``POLITENESS_*`` settings and per-domain overrides, parsed and matched;
* :mod:`.keys` - the Redis keys, per domain (never per spider: two spiders share a site's limit);
* :mod:`.limiter` - the Lua scripts (a rate reservation, a concurrency slot), one round trip each;
* :mod:`.middleware` - the downloader middleware that waits for both before a request goes out.
"""
