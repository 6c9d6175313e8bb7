"""The ``ARCHIVE_*`` settings, read and checked in one place (a bad one fails at start by name)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..config import ConfigError, get_bool, get_float, get_int


@dataclass(frozen=True)
class ArchiveConfig:
    enabled: bool
    url: str  # a folder, or s3://bucket/prefix
    retention_days: float
    file_size: int
    file_age: float
    s3_endpoint: str | None
    # A page whose record is not on disk is not acknowledged: the archive's failure stops the crawl.
    required: bool = False


def read_config(settings: Any) -> ArchiveConfig:
    url = str(settings.get("ARCHIVE_URL") or "").strip()
    enabled = get_bool(settings, "ARCHIVE_ENABLED", False) or bool(url)
    if not url:
        url = os.path.join(str(settings.get("DATA_DIR") or ".data"), "archive")
    if url.startswith("s3://"):
        if not url[5:].split("/", 1)[0]:
            raise ConfigError(f"ARCHIVE_URL: {url!r} names no bucket (expected s3://bucket/prefix)")
    elif "://" in url and not url.startswith("file://"):
        raise ConfigError(f"ARCHIVE_URL: {url!r} is neither a folder nor s3://bucket/prefix")
    return ArchiveConfig(
        enabled=enabled,
        url=url,
        retention_days=get_float(settings, "ARCHIVE_RETENTION_DAYS", 30.0, minimum=0.001),
        file_size=get_int(settings, "ARCHIVE_FILE_SIZE", 100 * 1024 * 1024, minimum=1024),
        file_age=get_float(settings, "ARCHIVE_FILE_AGE", 300.0, minimum=0.1),
        s3_endpoint=str(settings.get("ARCHIVE_S3_ENDPOINT") or "").strip() or None,
        required=get_bool(settings, "ARCHIVE_REQUIRED", False),
    )
