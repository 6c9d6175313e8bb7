"""The relay's settings (``CHANGEFEED_*``), read and checked once at start.

The prefix is not ``FEED_``: Scrapy's own feed exports own ``FEEDS`` and ``FEED_*``. A bad value
stops the relay with one line naming the setting; a URL's password or a webhook secret is never
part of that line, nor of any log line (they are registered for redaction here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..config import ConfigError, get_float, get_int, mask_url
from ..runtime.secrets import install_log_redaction, register_secret, register_url_password

SINKS = ("rabbitmq", "nats", "webhook", "lake")
_AGE = re.compile(r"^\d+[YMDhms]$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


@dataclass(frozen=True)
class FeedConfig:
    batch: int
    poll_interval: float
    retry_max_gap: float
    publish_timeout: float
    rabbitmq_url: str = field(repr=False)
    rabbitmq_stream: str
    rabbitmq_max_age: str
    nats_url: str = field(repr=False)
    nats_stream: str
    nats_subject: str
    nats_duplicate_window: float
    webhook_url: str = field(repr=False)
    webhook_secret: str = field(repr=False)
    webhook_tries: int
    webhook_timeout: float
    lake_folder: str = ""
    metrics_port: int = 0
    lake_namespace: str = "changefeed"
    lake_endpoint: str = field(default="", repr=False)
    lake_timeout: float = 30.0
    lake_keep: float = 7.0


def _url(settings: Any, name: str, schemes: tuple[str, ...]) -> str:
    value = str(settings.get(name) or "")
    if not value:
        return ""
    register_url_password(value)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ConfigError(f"{name}: not a URL ({mask_url(value)})") from None
    if parts.scheme not in schemes or not parts.hostname:
        raise ConfigError(f"{name}: expected a {'/'.join(schemes)} URL with a host, got {mask_url(value)}")
    return value


def _name(settings: Any, name: str, default: str) -> str:
    value = str(settings.get(name) or default)
    if not _NAME.match(value):
        raise ConfigError(f"{name}: letters, digits, '_', '.' and '-' only, got {value!r}")
    return value


def _lake(settings: Any) -> str:
    value = str(settings.get("CHANGEFEED_LAKE_FOLDER") or "").strip()
    parts = urlsplit(value)
    if parts.scheme in ("s3", "gs"):
        if not parts.netloc:
            raise ConfigError(
                f"CHANGEFEED_LAKE_FOLDER: {value!r} names no bucket (expected {parts.scheme}://bucket/prefix)"
            )
    elif len(parts.scheme) > 1 and not value.startswith("file://"):  # a Windows drive letter is no scheme
        raise ConfigError(
            f"CHANGEFEED_LAKE_FOLDER: a folder, s3://bucket/prefix or gs://bucket/prefix, got {mask_url(value)}"
        )
    return value[len("file://") :] if value.startswith("file://") else value


def read(settings: Any) -> FeedConfig:
    """Every ``CHANGEFEED_*`` setting, checked (ConfigError names the first bad one)."""
    install_log_redaction()
    secret = str(settings.get("CHANGEFEED_WEBHOOK_SECRET") or "")
    register_secret(secret)
    max_age = str(settings.get("CHANGEFEED_RABBITMQ_MAX_AGE") or "7D")
    if not _AGE.match(max_age):
        raise ConfigError(f"CHANGEFEED_RABBITMQ_MAX_AGE: a number and one of Y M D h m s (e.g. 7D), got {max_age!r}")
    conf = FeedConfig(
        batch=get_int(settings, "CHANGEFEED_BATCH"),
        poll_interval=get_float(settings, "CHANGEFEED_POLL_INTERVAL"),
        retry_max_gap=get_float(settings, "CHANGEFEED_RETRY_MAX_GAP"),
        publish_timeout=get_float(settings, "CHANGEFEED_PUBLISH_TIMEOUT"),
        rabbitmq_url=_url(settings, "CHANGEFEED_RABBITMQ_URL", ("amqp", "amqps")),
        rabbitmq_stream=_name(settings, "CHANGEFEED_RABBITMQ_STREAM", "item_changes"),
        rabbitmq_max_age=max_age,
        nats_url=_url(settings, "CHANGEFEED_NATS_URL", ("nats", "tls")),
        nats_stream=_name(settings, "CHANGEFEED_NATS_STREAM", "ITEM_CHANGES").replace(".", "_"),
        nats_subject=_name(settings, "CHANGEFEED_NATS_SUBJECT", "item_changes"),
        nats_duplicate_window=get_float(settings, "CHANGEFEED_NATS_DUPLICATE_WINDOW"),
        webhook_url=_url(settings, "CHANGEFEED_WEBHOOK_URL", ("http", "https")),
        webhook_secret=secret,
        webhook_tries=get_int(settings, "CHANGEFEED_WEBHOOK_TRIES"),
        webhook_timeout=get_float(settings, "CHANGEFEED_WEBHOOK_TIMEOUT"),
        lake_folder=_lake(settings),
        lake_endpoint=_url(settings, "CHANGEFEED_LAKE_ENDPOINT", ("http", "https")),
        lake_timeout=get_float(settings, "CHANGEFEED_LAKE_TIMEOUT"),
        lake_keep=get_float(settings, "CHANGEFEED_LAKE_KEEP_DAYS"),
        lake_namespace=_name(settings, "CHANGEFEED_LAKE_NAMESPACE", "changefeed").replace(".", "_"),
        metrics_port=get_int(settings, "CHANGEFEED_METRICS_PORT"),
    )
    # A batch that was sent but not confirmed is sent again after at most this long (plus the
    # time to give up on it); JetStream drops the copies only within its duplicate window.
    longest_gap = conf.retry_max_gap + conf.publish_timeout
    if conf.nats_duplicate_window <= longest_gap:
        raise ConfigError(
            f"CHANGEFEED_NATS_DUPLICATE_WINDOW: {conf.nats_duplicate_window:g} s must exceed the relay's longest "
            f"gap between two sends of one batch (CHANGEFEED_RETRY_MAX_GAP + CHANGEFEED_PUBLISH_TIMEOUT = "
            f"{longest_gap:g} s)"
        )
    return conf


def require(conf: FeedConfig, sink: str) -> None:
    """ConfigError naming what *sink* needs and lacks."""
    if sink not in SINKS:
        raise ConfigError(f"--sink: one of {', '.join(SINKS)}, got {sink!r}")
    needed = {
        "rabbitmq": [("CHANGEFEED_RABBITMQ_URL", conf.rabbitmq_url)],
        "nats": [("CHANGEFEED_NATS_URL", conf.nats_url)],
        "webhook": [("CHANGEFEED_WEBHOOK_URL", conf.webhook_url), ("CHANGEFEED_WEBHOOK_SECRET", conf.webhook_secret)],
        "lake": [("CHANGEFEED_LAKE_FOLDER", conf.lake_folder)],
    }[sink]
    for name, value in needed:
        if not value:
            raise ConfigError(f"{name}: not set, and the {sink} sink needs it")
    if sink == "webhook" and len(conf.webhook_secret) < 16:
        raise ConfigError("CHANGEFEED_WEBHOOK_SECRET: at least 16 characters (openssl rand -hex 24)")
