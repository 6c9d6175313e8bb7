"""The ``ARCHIVE_*`` settings, read and checked in one place (a bad one fails at start by name)."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..config import ConfigError, get_bool, get_float, get_int


@dataclass(frozen=True)
class ArchiveConfig:
    enabled: bool
    url: str  # a folder, s3://bucket/prefix or gs://bucket/prefix
    retention_days: float
    file_size: int
    file_age: float
    s3_endpoint: str | None
    # A page whose record is not on disk is not acknowledged: the archive's failure stops the crawl.
    required: bool = False
    gcs_endpoint: str | None = None

    @property
    def endpoint(self) -> str | None:
        """The endpoint setting of this archive's kind of bucket (None: the cloud's own, or a folder)."""
        if self.url.startswith("s3://"):
            return self.s3_endpoint
        if self.url.startswith("gs://"):
            return self.gcs_endpoint
        return None


# Google's bucket naming rules, enough to catch a typo before the first upload does.
_GCS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


def read_config(settings: Any) -> ArchiveConfig:
    url = str(settings.get("ARCHIVE_URL") or "").strip()
    enabled = get_bool(settings, "ARCHIVE_ENABLED", False) or bool(url)
    if not url:
        url = os.path.join(str(settings.get("DATA_DIR") or ".data"), "archive")
    if url.startswith("s3://"):
        if not url[5:].split("/", 1)[0]:
            raise ConfigError(f"ARCHIVE_URL: {url!r} names no bucket (expected s3://bucket/prefix)")
    elif url.startswith("gs://"):
        _check_gcs_url(url)
    elif "://" in url and not url.startswith("file://"):
        raise ConfigError(f"ARCHIVE_URL: {url!r} is neither a folder nor s3://bucket/prefix nor gs://bucket/prefix")
    return ArchiveConfig(
        enabled=enabled,
        url=url,
        retention_days=get_float(settings, "ARCHIVE_RETENTION_DAYS", 30.0, minimum=0.001),
        file_size=get_int(settings, "ARCHIVE_FILE_SIZE", 100 * 1024 * 1024, minimum=1024),
        file_age=get_float(settings, "ARCHIVE_FILE_AGE", 300.0, minimum=0.1),
        s3_endpoint=str(settings.get("ARCHIVE_S3_ENDPOINT") or "").strip() or None,
        required=get_bool(settings, "ARCHIVE_REQUIRED", False),
        gcs_endpoint=_gcs_endpoint(settings),
    )


def _check_gcs_url(url: str) -> None:
    bucket = url[len("gs://") :].split("/", 1)[0]
    if not bucket:
        raise ConfigError(f"ARCHIVE_URL: {url!r} names no bucket (expected gs://bucket/prefix)")
    if not _GCS_BUCKET.fullmatch(bucket):
        named = "it" if "@" in bucket else repr(bucket)  # a user:password@ part is not echoed
        raise ConfigError(
            f"ARCHIVE_URL: {named} is no GCS bucket name (3-222 characters: lowercase letters, "
            "digits, '-', '_' and '.', starting and ending with a letter or digit)"
        )
    # Some pyarrow builds (conda's, without the extra) lack the GCS file system.
    if importlib.util.find_spec("pyarrow._gcsfs") is None:
        raise ConfigError("ARCHIVE_URL: gs:// needs pyarrow built with GCS support (the PyPI wheels are)")


def _gcs_endpoint(settings: Any) -> str | None:
    endpoint = str(settings.get("ARCHIVE_GCS_ENDPOINT") or "").strip()
    if not endpoint:
        return None
    try:
        parts = urlsplit(endpoint)
        _ = parts.port  # raises on a port that is not a number
    except ValueError:
        parts = None
    if parts is not None and (parts.username or parts.password):
        # Never echoed: it holds credentials, and an endpoint is reached anonymously anyway.
        raise ConfigError("ARCHIVE_GCS_ENDPOINT: holds credentials; give http(s)://host:port alone")
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        raise ConfigError(f"ARCHIVE_GCS_ENDPOINT: expected http(s)://host:port, got {endpoint!r}")
    return endpoint.rstrip("/")
