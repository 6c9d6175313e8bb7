"""NATS JetStream: events stored in a stream, ``Nats-Msg-Id`` = the event id.

JetStream drops a message whose ``Nats-Msg-Id`` it stored within the stream's duplicate window,
so a batch the relay sends again (after a crash or an unconfirmed send) is stored once, provided
it comes back within the window: the window (``CHANGEFEED_NATS_DUPLICATE_WINDOW``, two minutes by
default) is checked at start to exceed the relay's longest gap between two sends. A relay
restarted after a longer outage may store a copy; consumers dedupe by the id all the same.

Subjects are ``PREFIX.<table>.<kind>``: a consumer filters by table or kind; per-key order holds
on the stream as a whole (one publisher, messages written in order, each batch confirmed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.js.api import StreamConfig

from ...config import mask_url
from ..config import FeedConfig
from ..events import Event
from .base import Delivery, Sink, SinkError, SinkFatal, failure


class NatsSink(Sink):
    kind = "nats"

    def __init__(
        self, url: str, stream: str, subject: str, duplicate_window: float = 120.0, timeout: float = 30.0
    ) -> None:
        self._url = url
        self.stream = stream
        self.subject = subject
        self.duplicate_window = duplicate_window
        self.timeout = timeout
        self._nc: Any = None
        self._js: Any = None

    @classmethod
    def from_config(cls, conf: FeedConfig) -> NatsSink:
        return cls(conf.nats_url, conf.nats_stream, conf.nats_subject, conf.nats_duplicate_window, conf.publish_timeout)

    def describe(self) -> str:
        return f"nats {mask_url(self._url)} stream {self.stream} subjects {self.subject}.>"

    async def open(self) -> None:
        async def quiet(_exc: Exception) -> None:
            # nats-py logs each failed reconnection with its URL; the relay says it once.
            return None

        try:
            # One try (max_reconnect_attempts=0 would mean: try for ever, silently); the relay
            # does the waiting, and says so.
            self._nc = await asyncio.wait_for(
                nats.connect(
                    self._url,
                    connect_timeout=min(self.timeout, 5),
                    allow_reconnect=False,
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0.2,
                    error_cb=quiet,
                ),
                self.timeout + 5,
            )
            self._js = self._nc.jetstream(timeout=self.timeout)
            try:
                await self._js.stream_info(self.stream)
            except nats.js.errors.NotFoundError:
                await self._js.add_stream(
                    StreamConfig(
                        name=self.stream,
                        subjects=[f"{self.subject}.>"],
                        duplicate_window=self.duplicate_window,
                    )
                )
        except nats.errors.NoServersError as exc:
            await self.close()
            raise SinkError(f"nats unreachable: {failure(exc)}") from None
        except (nats.errors.AuthorizationError, nats.js.errors.ServiceUnavailableError) as exc:
            await self.close()
            raise SinkFatal(f"nats refused: {failure(exc)}") from None
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            await self.close()
            raise SinkError(f"nats unreachable: {failure(exc)}") from None

    async def publish(self, events: Sequence[Event]) -> Delivery:
        if self._nc is None or not self._nc.is_connected:
            await self.close()
            await self.open()
        js = self._js
        acks = []
        try:
            # Sent one after another on one connection, so stored in this order; the acks are
            # awaited together.
            for event in events:
                acks.append(
                    await js.publish_async(
                        f"{self.subject}.{event.item_table}.{event.kind}",
                        event.body(),
                        wait_stall=self.timeout,
                        headers={"Nats-Msg-Id": event.message_id, "Changefeed-Key": event.key_text},
                    )
                )
            await asyncio.wait_for(asyncio.gather(*acks), self.timeout)
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            for ack in acks:
                ack.cancel()
            await self.close()
            raise SinkError(f"nats did not confirm the batch: {failure(exc)}") from None
        return Delivery()

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            try:
                await asyncio.wait_for(nc.close(), 5)
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
