"""The shared queue as a test reads or writes it from outside (see scraper.queue.lists)."""

from __future__ import annotations

from typing import Any

from scraper.queue.lists import Lists


def queue_depth(server: Any, key: str) -> int:
    """How many requests the queue *key* holds."""
    return int(Lists(server).length(key))


def queue_entries(server: Any, key: str) -> list[bytes]:
    """The queue *key*'s entries, best first."""
    return [data for data, _ in Lists(server).entries(key)]


def queue_put(server: Any, key: str, members: dict[Any, float]) -> None:
    """Queue raw entries (*members*: entry -> score) as a node would, or someone with write
    access to Redis could."""
    Lists(server).push(key, list(members.items()))
