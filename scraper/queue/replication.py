"""Acknowledge a lease only once what replaces it is on a replica too (a sharded frontier).

A page's lease is acknowledged after the requests it yielded are queued. Unsharded, both writes
go to one master, whose replica receives them in order: a failover that loses the queued links
loses the later acknowledgement with them, and the page is fetched again. Sharded, the links may
sit on another master than the lease: that master could die with the links unreplicated while
the acknowledgement survives elsewhere, and the links would be lost. So before acknowledging,
each master written since the last acknowledgement confirms (``WAIT``) that one replica has
everything it was sent. A master without replicas is not waited for: nothing can promote.
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger(__name__)

#: How long one ``WAIT`` may block the reactor thread; a replica on the same network answers
#: in well under a millisecond, and an unanswered wait is simply tried again at the next tick.
WAIT_MS = 100
#: Seconds between looks at which masters have replicas (a failover changes it).
TOPOLOGY_EVERY = 10.0


class ReplicaBarrier:
    def __init__(self, server: Any, shards: Any) -> None:
        self.server = server
        self.shards = shards
        self.dirty: set[int] = set()
        self._replicas: dict[str, int] = {}
        self._looked = float("-inf")

    @classmethod
    def needed(cls, server: Any, shards: Any) -> ReplicaBarrier | None:
        from .keys import is_cluster

        return cls(server, shards) if shards is not None and shards.count > 1 and is_cluster(server) else None

    def written(self, shards: set[int]) -> None:
        self.dirty |= shards

    def settle(self) -> bool:
        """True once every master written since the last call holds its writes on a replica
        (or has none); False to try again at the next tick."""
        if not self.dirty:
            return True
        if time.monotonic() - self._looked >= TOPOLOGY_EVERY:
            self._look()
        pending = set(self.dirty)
        by_node: dict[str, tuple[Any, int]] = {}
        for shard in pending:
            node = self.server.get_node_from_key(self.shards.queue_key(shard))
            by_node.setdefault(node.name, (node, shard))
        for name, (node, shard) in by_node.items():
            if not self._replicas.get(name):
                continue
            pipe = node.redis_connection.pipeline(transaction=False)
            # A write of our own on the same connection first: WAIT counts from this
            # connection's last write, which then covers every earlier write to the master.
            pipe.set(f"{self.shards.prefixes[shard]}:sync", 1, ex=60)
            pipe.execute_command("WAIT", 1, WAIT_MS)
            acked = pipe.execute()[-1]
            if int(acked) < 1:
                return False
        self.dirty -= pending
        return True

    def _look(self) -> None:
        self._looked = time.monotonic()
        replicas: dict[str, int] = {}
        for node in self.server.get_primaries():
            try:
                replicas[node.name] = int(node.redis_connection.info("replication").get("connected_slaves", 0))
            except Exception as exc:  # a master that does not answer gets looked at next time
                logger.debug("Could not read the replication of %s: %s", node.name, exc)
                replicas[node.name] = self._replicas.get(node.name, 0)
        self._replicas = replicas
