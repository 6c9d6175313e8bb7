"""The Redis Stream of fetched responses and its consumer group of processors.

An entry is added by a fetcher once the response is downloaded, read by one processor of the
group ``processors``, and deleted (XACK then XDEL, in one transaction) once its items are
committed and the requests its callback yielded are in the shared queue. So the stream's length
is the work not yet done, whether waiting or in a processor's hands: what fetchers hold back on
(``PROCESSING_MAX_PENDING``) and what keeps a crawl from finishing.

A processor renews the entries it holds (resets their idle time, as a lease is renewed); one that
dies stops renewing, and after ``PROCESSING_CLAIM_IDLE`` seconds another takes them over with
XAUTOCLAIM. Each delivery is counted by Redis; an entry delivered more than
``PROCESSING_MAX_DELIVERIES`` times is the caller's to dead-letter.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import redis

from ..backends.redis_client import register_script
from ..queue import keys

GROUP = "processors"

# Reset the idle time of the entries this consumer still owns; an entry claimed by another
# processor meanwhile is not taken back. KEYS: stream. ARGV: group, consumer, ids...
# Returns the ids no longer owned.
_RENEW = """
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""


# KEYS: stream. ARGV: group, min idle (ms), this consumer. Atomic: no entry is read by a consumer
# between the look at it and its removal.
_FORGET = """
local dropped = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if f['name'] ~= ARGV[3] and tonumber(f['pending']) == 0 and tonumber(f['idle']) >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    dropped = dropped + 1
  end
end
return dropped
"""


# KEYS: stream. ARGV: group, consumer.
_LEAVE = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ResponseStream:
    def __init__(self, server: Any, spider_name: str, consumer: str | None = None) -> None:
        self.server = server
        self.key = keys.responses_key(spider_name)
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._renew = register_script(server, _RENEW)
        self._forget = register_script(server, _FORGET)
        self._leave = register_script(server, _LEAVE)
        self._claim_from = "0-0"

    def ensure_group(self) -> None:
        """Create the group (and the stream) if missing; from id 0, so entries added before the
        first processor started are delivered too."""
        try:
            self.server.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def add(self, fields: dict[str, bytes]) -> str:
        return _text(self.server.xadd(self.key, fields))

    def __len__(self) -> int:
        return int(self.server.xlen(self.key))

    def read(self, count: int) -> list[tuple[str, dict[bytes, bytes]]]:
        """Up to *count* entries never delivered before, now this consumer's."""
        try:
            reply = self.server.xreadgroup(GROUP, self.consumer, {self.key: ">"}, count=count)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self.ensure_group()  # the stream was deleted (an operator's purge): start again
            return []
        return [(_text(i), fields) for _, entries in reply or [] for i, fields in entries]

    def claim(self, min_idle: float, count: int) -> list[tuple[str, dict[bytes, bytes], int]]:
        """Entries other processors held unrenewed for *min_idle* seconds, now this consumer's,
        with how many times each has been delivered (this time included)."""
        try:
            reply = self.server.xautoclaim(
                self.key, GROUP, self.consumer, int(min_idle * 1000), start_id=self._claim_from, count=count
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self.ensure_group()
            return []
        self._claim_from = _text(reply[0])
        claimed = [(_text(i), fields) for i, fields in reply[1] if fields]
        if not claimed:
            return []
        pipe = self.server.pipeline(transaction=False)
        for entry_id, _ in claimed:
            pipe.xpending_range(self.key, GROUP, min=entry_id, max=entry_id, count=1)
        counts = [int(p[0]["times_delivered"]) if p else 1 for p in pipe.execute()]
        return [(entry_id, fields, n) for (entry_id, fields), n in zip(claimed, counts)]

    def renew(self, ids: set[str]) -> set[str]:
        """Keep *ids* from being claimed by another processor; returns those already claimed."""
        if not ids:
            return set()
        return {_text(i) for i in self._renew(keys=[self.key], args=[GROUP, self.consumer, *ids])}

    def done(self, ids: set[str]) -> None:
        """Acknowledge and delete: the work of these entries is durable."""
        if not ids:
            return
        pipe = self.server.pipeline(transaction=True)
        pipe.xack(self.key, GROUP, *ids)
        pipe.xdel(self.key, *ids)
        pipe.execute()

    def give_back(self, ids: dict[str, int]) -> None:
        """Entries read but never processed (id -> deliveries so far): claimable by any
        processor at once, this delivery not counted."""
        for entry_id, deliveries in ids.items():
            self.server.xclaim(
                self.key,
                GROUP,
                self.consumer,
                0,
                [entry_id],
                idle=10**9,
                retrycount=max(0, deliveries - 1),
                justid=True,
            )

    def keep(self, ids: dict[str, int]) -> None:
        """Entries this consumer holds that a claim handed back to it (id -> deliveries when it
        read them): their delivery counts set back, for that claim was no new delivery."""
        by_count: dict[int, list[str]] = {}
        for entry_id, deliveries in ids.items():
            by_count.setdefault(deliveries, []).append(entry_id)
        for deliveries, entry_ids in by_count.items():
            self.server.xclaim(self.key, GROUP, self.consumer, 0, entry_ids, retrycount=deliveries, justid=True)

    def forget_idle_consumers(self, min_idle: float) -> int:
        """Drop group members (other than this one) that hold nothing and have been idle for
        *min_idle* seconds: processors that died or stopped. One that holds entries is kept, or
        those would be lost. Returns how many were dropped."""
        return int(self._forget(keys=[self.key], args=[GROUP, int(min_idle * 1000), self.consumer]))

    def leave(self) -> bool:
        """Leave the group if this consumer holds nothing (a clean stop); True if it left."""
        return bool(self._leave(keys=[self.key], args=[GROUP, self.consumer]))

    def pending(self) -> int:
        """Entries delivered to a processor and not yet acknowledged."""
        try:
            return int(self.server.xpending(self.key, GROUP)["pending"])
        except redis.ResponseError:
            return 0
