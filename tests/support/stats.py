"""Values from the stats dump a crawl logs when it closes (``Dumping Scrapy stats:``)."""

from __future__ import annotations

import re
from typing import Any


def stat(log: str, name: str) -> float:
    match = re.search(rf"'{re.escape(name)}': ([\d.]+)", log)
    return float(match.group(1)) if match else 0.0


def stat_value(log: str, name: str) -> Any:
    """The value of stat *name* in the last stats dump of *log*: a number, a quoted text without
    its quotes, or None when the stat is not there."""
    dump = log.rpartition("Dumping Scrapy stats:")[2]
    match = re.search(rf"'{re.escape(name)}': ('[^']*'|-?[0-9.]+(?:e-?\d+)?)", dump)
    if not match:
        return None
    value = match.group(1)
    if value.startswith("'"):
        return value[1:-1]
    return float(value) if any(c in value for c in ".e") else int(value)
