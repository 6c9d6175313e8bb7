"""Which crawl processes are working on a spider right now, across the cluster.

A hash of node id -> last heartbeat, and next to it what each node reports (in-flight
requests, pages, items, and who it is: host, pid, process start). A killed node simply stops
heartbeating and ages out after the node TTL; on its own host it is recognised as gone at once,
as its pid no longer runs (see :mod:`scraper.runtime.procs`). Joining and leaving a run happen in
:mod:`scraper.runs.state`, atomically with the run's state.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from ..queue.clock import RedisClock
from ..runtime import procs


class NodeRegistry:
    """``info`` (optional) returns what this node reports with each heartbeat (in-flight
    requests, pages, items), for ``scrapy queue``."""

    def __init__(self, server: Any, key: str, ttl: float = 60.0, info: Callable[[], dict] | None = None) -> None:
        self.server = server
        self.key = key
        self.info_key = f"{key}:info"
        self.ttl = ttl
        self.info = info
        # Heartbeats are written and judged on Redis' clock: a node whose own clock is off
        # neither looks dead to the others nor counts them dead (see .clock).
        self.clock = RedisClock(server)
        self.node_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.identity = {"host": procs.host_id(), "pid": os.getpid(), "started": procs.started_at()}
        self._last_beat = 0.0

    def beat(self, force: bool = False) -> None:
        now = self.clock.now()
        if force or now - self._last_beat >= min(1.0, self.ttl / 6):
            pipe = self.server.pipeline(transaction=False)
            pipe.hset(self.key, self.node_id, now)
            info = self.info() if self.info is not None else {}
            pipe.hset(self.info_key, self.node_id, json.dumps({"t": now, **self.identity, **info}))
            pipe.execute()
            self._last_beat = now

    def dead_here(self) -> list[str]:
        """Nodes of this host whose process is gone: dead now, whatever their last heartbeat."""
        dead = []
        for node, raw in self.server.hgetall(self.info_key).items():
            try:
                info = json.loads(raw)
            except ValueError:
                continue
            if info.get("host") == self.identity["host"] and not procs.is_alive(
                info.get("pid", 0), info.get("started")
            ):
                dead.append(node.decode() if isinstance(node, bytes) else node)
        return dead

    def live(self, now: float | None = None) -> dict[str, float]:
        """Live nodes (this one included if registered) -> last heartbeat."""
        now = self.clock.now() if now is None else now
        dead = set(self.dead_here())
        beats = {k.decode(): float(v) for k, v in self.server.hgetall(self.key).items()}
        return {n: t for n, t in beats.items() if t >= now - self.ttl and n not in dead}
