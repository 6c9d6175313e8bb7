"""Names of the Redis keys one spider's crawl uses, in one place.

Every key of a spider starts with ``{<spider>}``: a Redis Cluster hash tag, so that all of a
spider's keys live in one hash slot and the Lua scripts that touch several of them at once (take
a lease, claim a URL and queue it, begin or leave a run) run on a cluster too. On a single Redis
the braces are only characters. Keys written by versions before the tag (``<spider>:requests``)
are renamed once by :func:`migrate_legacy`.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

#: Suffixes of the keys a spider had before hash tags (``<spider>:<suffix>[...]``).
_LEGACY_SUFFIXES = (
    "requests",
    "dupefilter",
    "bloom",
    "items:",
    "nodes",
    "dead",
    "scraping_api:",
    "run",
    "leased",
    "lease_deadlines",
    "redeliveries",
    "lease_owners",
    "responses",
)


#: Keys one of which any crawl of an earlier version left behind.
_LEGACY_MARKERS = (
    "run",
    "requests",
    "dead",
    "leased",
    "lease_deadlines",
    "dupefilter",
    "bloom:params",
    "items:seen",
    "nodes",
)


def prefix(spider_name: str) -> str:
    """The start of every key of *spider_name*: its hash tag."""
    return "{" + spider_name + "}"


def queue_key(spider_name: str) -> str:
    return f"{prefix(spider_name)}:requests"


def dupefilter_key(spider_name: str) -> str:
    return f"{prefix(spider_name)}:dupefilter"


def bloom_key(spider_name: str) -> str:
    """The Bloom filter (``DUPEFILTER_BACKEND=bloom``); ``:<generation>`` is appended with an
    expiry, and its shape is kept in ``<key>:params``."""
    return f"{prefix(spider_name)}:bloom"


def items_seen_key(spider_name: str) -> str:
    return f"{prefix(spider_name)}:items:seen"


def item_pages_key(spider_name: str) -> str:
    """An item's dedupe claim -> the URL of the page first recorded as its own (the sole item of a
    page with no canonical link); kept across runs (:mod:`scraper.identity.content`)."""
    return f"{prefix(spider_name)}:items:pages"


#: The field of a run's expected-items hash that says a node ran it as a revisit run.
REVISIT_DUE_FIELD = "__due__"


def revisit_expected_key(spider_name: str) -> str:
    """A revisit run's items of the pages it visited (dedupe claims; with ``REVISIT_DUE_FIELD``
    once a node ran the run as a revisit): what its gone-marking may cover."""
    return f"{prefix(spider_name)}:revisit:expected"


def items_reprocess_key(spider_name: str, token: str) -> str:
    """Item claims of one ``scrapy reprocess`` (apart from the live crawl's)."""
    return f"{prefix(spider_name)}:items:reprocess:{token}"


def nodes_key(spider_name: str) -> str:
    return f"{prefix(spider_name)}:nodes"


def dead_key(spider_name: str) -> str:
    return f"{prefix(spider_name)}:dead"


def responses_key(spider_name: str) -> str:
    """Fetched responses waiting for ``scrapy process`` (``PROCESSING=decoupled``): a stream."""
    return f"{prefix(spider_name)}:responses"


def dead_index_key(spider_name: str) -> str:
    """Request identity -> its entry in :func:`dead_key`: one dead letter per request."""
    return f"{prefix(spider_name)}:dead:index"


def lease_keys(spider_name: str) -> dict[str, str]:
    """The leases of taken requests (see :mod:`.leases`): request data, deadlines, redelivery
    counts and owners, by lease id."""
    return lease_keys_under(prefix(spider_name))


def lease_keys_under(tag: str) -> dict[str, str]:
    """:func:`lease_keys` under the hash tag *tag* (a spider's, or a shard's)."""
    return {
        "leased": f"{tag}:leased",
        "deadlines": f"{tag}:lease_deadlines",
        "redeliveries": f"{tag}:redeliveries",
        "owners": f"{tag}:lease_owners",
    }


def escalated_key(spider_name: str) -> str:
    """Domains the scraping API's ``on_block`` route moved to the API in this run."""
    return f"{prefix(spider_name)}:scraping_api:escalated"


def budget_base_key(spider_name: str) -> str:
    """The scraping API's shared budget (``:spent``, ``:deadlines``, ``:amounts``)."""
    return f"{prefix(spider_name)}:scraping_api:budget"


def run_key(spider_name: str) -> str:
    """The spider's current run: id, state, started/stopped/finished times, last reason."""
    return f"{prefix(spider_name)}:run"


def run_figures_key(spider_name: str, run_id: int) -> str:
    """Each node's figures for run *run_id* (node id -> JSON), summed into the run's figures."""
    return f"{run_key(spider_name)}:{run_id}:figures"


def run_quality_key(spider_name: str, run_id: int) -> str:
    """The data-quality figures of run *run_id*."""
    return f"{run_key(spider_name)}:{run_id}:quality"


def aliases_key(spider_name: str) -> str:
    """URL -> the canonical URL of the page it is, learnt from canonical links; kept across runs."""
    return f"{prefix(spider_name)}:aliases"


def budget_keys(spider_name: str) -> list[str]:
    """The run's scraping-API budget: spent, and the reservations of calls in flight."""
    base = budget_base_key(spider_name)
    return [f"{base}:spent", f"{base}:deadlines", f"{base}:amounts"]


def crawl_scoped_keys(spider_name: str, seen_keys: list[str] | None = None) -> list[str]:
    """Keys that describe one run of a crawl and are dropped when that run completes.

    *seen_keys* are those of the request seen-state the crawl used (default: the set of the
    default backend); with an expiry there are none, as the seen-state outlives the run. The
    scraping API's budget and escalated domains belong to the run too."""
    seen = [dupefilter_key(spider_name)] if seen_keys is None else seen_keys
    return [
        *seen,
        items_seen_key(spider_name),
        revisit_expected_key(spider_name),
        escalated_key(spider_name),
        *budget_keys(spider_name),
    ]


def migrate_legacy(server: Any, spider_name: str) -> int:
    """Rename the keys an earlier version wrote without the hash tag; returns how many.

    Only on a single Redis (a cluster never held them: they could not have worked there), and
    only keys whose tagged name is free, so running it twice, or on a fleet, is harmless."""
    if is_cluster(server):
        return 0
    old = f"{spider_name}:"
    # A spider that ever ran has its run record; checking it first spares a scan of the keyspace.
    if not server.exists(*(old + name for name in _LEGACY_MARKERS)):
        return 0
    renamed = 0
    for raw in server.scan_iter(match=_glob_escape(old) + "*", count=1000):
        name = raw.decode() if isinstance(raw, bytes) else raw
        rest = name[len(old) :]
        if not rest.startswith(_LEGACY_SUFFIXES):
            continue
        if server.renamenx(name, f"{prefix(spider_name)}:{rest}"):
            renamed += 1
    if renamed:
        logger.info(
            "Renamed %d Redis keys of %s written by an earlier version (now %s:...)",
            renamed,
            spider_name,
            prefix(spider_name),
        )
    return renamed


def is_cluster(server: Any) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(server, RedisCluster)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
