"""Where the relay publishes: one small interface (:class:`.base.Sink`), one module per kind."""

from __future__ import annotations

from ..config import FeedConfig, require
from .base import Sink


def make(kind: str, conf: FeedConfig, database_url: str = "") -> Sink:
    """The sink *kind* (rabbitmq, nats, webhook, lake) as *conf* describes it; ConfigError if it
    lacks a setting it needs. Each client library is imported only by its own sink. The lake
    keeps its catalog in the project's database (*database_url*)."""
    require(conf, kind)
    if kind == "rabbitmq":
        from .rabbitmq import RabbitMQSink

        return RabbitMQSink.from_config(conf)
    if kind == "nats":
        from .nats import NatsSink

        return NatsSink.from_config(conf)
    if kind == "lake":
        from .lake import LakeSink

        return LakeSink.from_config(conf, database_url)
    from .webhook import WebhookSink

    return WebhookSink.from_config(conf)
