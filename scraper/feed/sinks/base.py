"""The one interface every sink offers the relay."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...runtime.secrets import redact
from ..events import Event


def failure(exc: BaseException) -> str:
    """An exception as one line without secrets (client errors may quote the URL)."""
    return redact(f"{type(exc).__name__}: {exc}".strip().rstrip(":"))[:300]


class SinkError(Exception):
    """The sink did not take a batch (down, refusing, timed out): the relay waits and sends the
    batch again. Its text never holds a secret."""


class SinkFatal(SinkError):
    """The sink will not take anything until someone changes something (bad credentials, a
    missing permission): the relay stops, nothing is lost."""


@dataclass
class Delivery:
    """What became of a batch the sink took: every event is delivered but *dead* ones, each
    with its reason (kept as dead letters; the relay moves past them)."""

    dead: list[tuple[Event, str]] = field(default_factory=list)


class Sink(ABC):
    #: the kind, as ``--sink`` names it
    kind: str = ""

    @abstractmethod
    async def open(self) -> None:
        """Connect and declare what is needed (a stream, a queue). Raises SinkError."""

    @abstractmethod
    async def publish(self, events: Sequence[Event]) -> Delivery:
        """Send *events* in this order and return once the sink confirmed every one (or gave
        some up as dead letters). Raises SinkError when the batch must be sent again: the
        relay sends it again with the same ids."""

    @abstractmethod
    async def close(self) -> None:
        """Let go of connections; never raises."""

    @abstractmethod
    def describe(self) -> str:
        """Where it publishes, for logs and ``scrapy feed status``: never a password."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"
