"""Per-domain politeness held in Redis: the whole fleet of crawl processes obeys one limit.

* :mod:`.limits` - ``POLITENESS_*`` settings and per-domain overrides, parsed and matched;
* :mod:`.keys` - the Redis keys, per domain (never per spider: two spiders share a site's limit);
* :mod:`.limiter` - the Lua scripts (a rate reservation, a concurrency slot), one round trip each;
* :mod:`.adaptive` - the fleet's rate of a site that throttled it, cut and raised (AIMD);
* :mod:`.slow_start` - the fleet's ramp on a site with no declared rate, until it throttles;
* :mod:`.middleware` - the downloader middleware that waits for both before a request goes out.
"""
