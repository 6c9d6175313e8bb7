"""What the politeness scripts share: Redis' clock inside a script, and one script call.

Every deadline and turn is computed on Redis' clock (``TIME``), so no node's clock decides for
another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backends.redis_client import pipeline_eval

_NOW_US = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
_NOW_MS = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"


@dataclass(frozen=True)
class Command:
    """One script call, to be queued on a pipeline (the batcher's) or run on a client."""

    script: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]

    def add(self, pipe: Any) -> Any:
        return pipeline_eval(pipe, self.script, self.keys, self.args)
