"""RabbitMQ: events appended to a stream (a queue of type ``stream``), with publisher confirms.

A stream rather than a quorum queue: a stream is a log that consumers read without removing
anything, each from an offset of its own (``x-stream-offset``: ``first``, an offset, a time), so
any number of consumers fan out from one copy, and one that starts late or lost its state
replays from the start or from a time and rebuilds it. A quorum queue hands each message to one
consumer and deletes it, and its dead-lettering is at-most-once unless set up with
``overflow=reject-publish``: replay and fan-out would need a queue per consumer, declared before
the events it must see. Each message's ``message_id`` is the event id (consumers dedupe by it:
the relay may send a batch again after a crash), and its headers carry the table, kind and key
so a consumer filters without parsing the body.

Every message of a batch is written to the channel in order, without waiting for the socket
after each one (the connection writes them out together), and the batch is done when the broker
confirmed each one: not one round trip per message, which caps a relay at a few hundred events a
second. The client is aiormq, the AMQP protocol layer under aio-pika: aio-pika's ``publish``
waits for each message to reach the socket, one write per message, which halved the relay's
rate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiormq
from aiormq import spec

from ...config import mask_url
from ..config import FeedConfig
from ..events import Event
from .base import Delivery, Sink, SinkError, SinkFatal, failure


class RabbitMQSink(Sink):
    kind = "rabbitmq"

    def __init__(self, url: str, stream: str, max_age: str = "7D", timeout: float = 30.0) -> None:
        self._url = url
        self.stream = stream
        self.max_age = max_age
        self.timeout = timeout
        self._connection: Any = None
        self._channel: Any = None

    @classmethod
    def from_config(cls, conf: FeedConfig) -> RabbitMQSink:
        return cls(conf.rabbitmq_url, conf.rabbitmq_stream, conf.rabbitmq_max_age, conf.publish_timeout)

    def describe(self) -> str:
        return f"rabbitmq {mask_url(self._url)} stream {self.stream}"

    async def open(self) -> None:
        try:
            self._connection = await asyncio.wait_for(aiormq.connect(self._url), self.timeout)
            self._channel = await self._connection.channel(publisher_confirms=True)
            await self._channel.queue_declare(
                self.stream,
                durable=True,
                arguments={"x-queue-type": "stream", "x-max-age": self.max_age},
            )
        except aiormq.exceptions.ProbableAuthenticationError as exc:
            await self.close()
            raise SinkFatal(f"rabbitmq refused the credentials: {failure(exc)}") from None
        except aiormq.exceptions.ChannelAccessRefused as exc:
            await self.close()
            raise SinkFatal(f"rabbitmq refused access: {failure(exc)}") from None
        except (TimeoutError, aiormq.exceptions.AMQPError, OSError) as exc:
            await self.close()
            raise SinkError(f"rabbitmq unreachable: {failure(exc)}") from None

    def _properties(self, event: Event) -> spec.Basic.Properties:
        return spec.Basic.Properties(
            message_id=event.message_id,
            content_type="application/json",
            delivery_mode=2,  # persistent
            timestamp=event.at,
            headers={"table": event.item_table, "kind": event.kind, "key": event.key_text},
        )

    async def publish(self, events: Sequence[Event]) -> Delivery:
        if self._channel is None or self._channel.is_closed:
            await self.close()
            await self.open()
        channel = self._channel
        # The channel writes publishes in the order they are started (one lock, first come first
        # served) and confirms them as the broker stores them.
        tasks = [
            asyncio.ensure_future(
                channel.basic_publish(e.body(), routing_key=self.stream, properties=self._properties(e), wait=False)
            )
            for e in events
        ]
        try:
            confirms = await asyncio.wait_for(asyncio.gather(*tasks), self.timeout)
        except (TimeoutError, aiormq.exceptions.AMQPError, OSError) as exc:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.close()
            raise SinkError(f"rabbitmq did not confirm the batch: {failure(exc)}") from None
        refused = [c for c in confirms if not isinstance(c, spec.Basic.Ack)]
        if refused:
            raise SinkError(f"rabbitmq refused {len(refused)} of {len(events)} events (a length limit?)")
        return Delivery()

    async def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                await asyncio.wait_for(connection.close(), 5)
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
