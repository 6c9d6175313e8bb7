"""Names of the Redis keys one spider's crawl uses, in one place."""


def queue_key(spider_name: str) -> str:
    return f"{spider_name}:requests"


def dupefilter_key(spider_name: str) -> str:
    return f"{spider_name}:dupefilter"


def items_seen_key(spider_name: str) -> str:
    return f"{spider_name}:items:seen"


def nodes_key(spider_name: str) -> str:
    return f"{spider_name}:nodes"


def dead_key(spider_name: str) -> str:
    return f"{spider_name}:dead"


def crawl_scoped_keys(spider_name: str) -> list[str]:
    """Keys that describe one run of a crawl and are dropped when that run completes."""
    return [dupefilter_key(spider_name), items_seen_key(spider_name)]
