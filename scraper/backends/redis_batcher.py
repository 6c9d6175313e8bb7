"""Redis commands whose answer can wait a moment: many per round trip, off the reactor thread.

A command sent from the reactor thread blocks every download and callback for a network round
trip. Commands given to :class:`RedisBatcher` are queued; one pipelined batch at a time is sent
from a worker thread, and whatever arrives while it is in flight goes in the next one, so the
batch size grows with the load by itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer

from ..runtime.worker_threads import defer_to_thread


class RedisBatcher:
    def __init__(self, server: Any, max_batch: int = 1000) -> None:
        self.server = server
        self.max_batch = max_batch
        self._pending: list[tuple[Callable[[Any], Any], defer.Deferred]] = []
        self._in_flight = False

    def call(self, add: Callable[[Any], Any]) -> defer.Deferred:
        """*add* queues one command on the pipeline it is given; the Deferred fires with its reply."""
        d: defer.Deferred = defer.Deferred()
        self._pending.append((add, d))
        if not self._in_flight:
            self._send()
        return d

    def _send(self) -> None:
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
        self._in_flight = True
        sent = defer_to_thread(self._execute, [add for add, _ in batch])

        def done(replies: list[Any]) -> None:
            for (_, d), reply in zip(batch, replies):
                if isinstance(reply, Exception):
                    d.errback(reply)
                else:
                    d.callback(reply)

        def failed(failure: Any) -> None:
            for _, d in batch:
                d.errback(failure)

        def next_batch(_: Any) -> None:
            self._in_flight = False
            if self._pending:
                self._send()

        sent.addCallbacks(done, failed).addBoth(next_batch)

    def _execute(self, adds: list[Callable[[Any], Any]]) -> list[Any]:
        pipe = self.server.pipeline(transaction=False)
        for add in adds:
            add(pipe)
        return pipe.execute(raise_on_error=False)
