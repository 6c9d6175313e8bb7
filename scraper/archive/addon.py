"""Check the ``ARCHIVE_*`` settings before any component is built."""

from __future__ import annotations

from typing import Any

from scrapy.settings import BaseSettings

from .config import read_config


class ArchiveAddon:
    @classmethod
    def from_crawler(cls, crawler: Any) -> ArchiveAddon:
        return cls()

    def update_settings(self, settings: BaseSettings) -> None:
        read_config(settings)
