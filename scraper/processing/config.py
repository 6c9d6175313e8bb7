"""The ``PROCESSING_*`` settings, read and checked in one place (a bad one fails at start by name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import get_bool, get_choice, get_float, get_int

MODES = ("inline", "decoupled")
#: Set by ``scrapy process``: this process runs the callbacks, it does not fetch.
PROCESSOR_SETTING = "PROCESSING_PROCESSOR"


@dataclass(frozen=True)
class ProcessingConfig:
    mode: str  # inline: fetch and process in one process (default); decoupled: see docs/operations/decoupled.md
    max_pending: int  # responses the stream may hold before fetchers stop fetching
    claim_idle: float  # seconds an entry may sit unrenewed with a processor before another takes it
    max_deliveries: int  # deliveries of one entry before it becomes a dead letter
    batch: int  # entries a processor reads per round trip
    processor: bool
    replay: bool  # ``scrapy reprocess``: neither fetches nor hands over

    @property
    def decoupled(self) -> bool:
        return self.mode == "decoupled"

    @property
    def fetcher(self) -> bool:
        """A crawl node that hands its responses to the stream instead of calling back."""
        return self.decoupled and not self.processor and not self.replay


def read_config(settings: Any) -> ProcessingConfig:
    return ProcessingConfig(
        mode=get_choice(settings, "PROCESSING", "inline", MODES),
        max_pending=get_int(settings, "PROCESSING_MAX_PENDING", 1000, minimum=1),
        claim_idle=get_float(settings, "PROCESSING_CLAIM_IDLE", 60.0, minimum=0.1),
        max_deliveries=get_int(settings, "PROCESSING_MAX_DELIVERIES", 3, minimum=1),
        batch=get_int(settings, "PROCESSING_BATCH", 16, minimum=1),
        processor=get_bool(settings, PROCESSOR_SETTING, False),
        replay=get_bool(settings, "ARCHIVE_REPLAY", False),
    )
