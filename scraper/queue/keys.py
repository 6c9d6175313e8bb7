"""Names of the Redis keys one spider's crawl uses, in one place."""


def queue_key(spider_name: str) -> str:
    return f"{spider_name}:requests"


def dupefilter_key(spider_name: str) -> str:
    return f"{spider_name}:dupefilter"


def bloom_key(spider_name: str) -> str:
    """The Bloom filter (``DUPEFILTER_BACKEND=bloom``); ``:<generation>`` is appended with an
    expiry, and its shape is kept in ``<key>:params``."""
    return f"{spider_name}:bloom"


def items_seen_key(spider_name: str) -> str:
    return f"{spider_name}:items:seen"


def nodes_key(spider_name: str) -> str:
    return f"{spider_name}:nodes"


def dead_key(spider_name: str) -> str:
    return f"{spider_name}:dead"


def escalated_key(spider_name: str) -> str:
    """Domains the scraping API's ``on_block`` route moved to the API in this run."""
    return f"{spider_name}:scraping_api:escalated"


def run_key(spider_name: str) -> str:
    """The spider's current run: id, state, started/stopped/finished times, last reason."""
    return f"{spider_name}:run"


def run_figures_key(spider_name: str, run_id: int) -> str:
    """Each node's figures for run *run_id* (node id -> JSON), summed into the run's figures."""
    return f"{spider_name}:run:{run_id}:figures"


def responses_key(spider_name: str) -> str:
    """Fetched responses waiting for ``scrapy process`` (``PROCESSING=decoupled``): a stream."""
    return f"{spider_name}:responses"


def dead_index_key(spider_name: str) -> str:
    """Request identity -> its entry in :func:`dead_key`: one dead letter per request."""
    return f"{spider_name}:dead:index"


def crawl_scoped_keys(spider_name: str, seen_keys: list[str] | None = None) -> list[str]:
    """Keys that describe one run of a crawl and are dropped when that run completes.

    *seen_keys* are those of the request seen-state the crawl used (default: the set of the
    default backend); with an expiry there are none, as the seen-state outlives the run. The
    scraping API's budget and escalated domains belong to the run too."""
    from ..scraping_api.budget import budget_keys

    seen = [dupefilter_key(spider_name)] if seen_keys is None else seen_keys
    return [*seen, items_seen_key(spider_name), escalated_key(spider_name), *budget_keys(spider_name)]
