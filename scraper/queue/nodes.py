"""Which crawl processes are working on a spider right now, across the cluster.

A hash of node id -> last heartbeat. It answers one question safely: "am I the last node of a
finished crawl?", so that the crawl's seen-set is dropped exactly once, by the last node out,
and a finished crawl can be run again. A killed node simply stops heartbeating and ages out.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Any, Callable

# Leave; count the others still alive; if none and the queue is empty, drop the run's keys.
# KEYS: nodes hash, nodes info hash, queue, lease deadlines, then the run's keys.
_LEAVE = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
local now = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local live = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) >= now - ttl then
    live = live + 1
  else
    redis.call('HDEL', KEYS[1], all[i])
    redis.call('HDEL', KEYS[2], all[i])
  end
end
if live == 0 and ARGV[4] == '1' and redis.call('ZCARD', KEYS[3]) == 0 and redis.call('ZCARD', KEYS[4]) == 0 then
  for i = 5, #KEYS do redis.call('DEL', KEYS[i]) end
  return -1
end
return live
"""


class NodeRegistry:
    """``info`` (optional) returns what this node reports with each heartbeat (in-flight
    requests, pages, items), for ``scrapy queue``."""

    def __init__(self, server: Any, key: str, ttl: float = 60.0, info: Callable[[], dict] | None = None) -> None:
        self.server = server
        self.key = key
        self.info_key = f"{key}:info"
        self.ttl = ttl
        self.info = info
        self.node_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._last_beat = 0.0
        self._leave = server.register_script(_LEAVE)

    def beat(self, force: bool = False) -> None:
        now = time.time()
        if force or now - self._last_beat >= min(1.0, self.ttl / 6):
            pipe = self.server.pipeline(transaction=False)
            pipe.hset(self.key, self.node_id, now)
            if self.info is not None:
                pipe.hset(self.info_key, self.node_id, json.dumps({"t": now, **self.info()}))
            pipe.execute()
            self._last_beat = now

    def leave(self, queue_key: str, finished: bool, run_keys: list[str], leases_key: str | None = None) -> int:
        """Deregister. Returns the number of other live nodes, or -1 when this node was the last
        one out of a finished crawl and the run's keys were dropped."""
        return int(
            self._leave(
                keys=[self.key, self.info_key, queue_key, leases_key or f"{queue_key}:no-leases", *run_keys],
                args=[self.node_id, time.time(), self.ttl, "1" if finished else "0"],
            )
        )
