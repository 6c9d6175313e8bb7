"""CPU and memory of the processes a crawl uses, read from /proc: the crawler, its Postgres
backends, and a Redis server of the bench's own (so that its CPU is the crawl's alone)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

import psycopg2

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of *pid* so far (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def private_redis() -> tuple[subprocess.Popen, str] | None:
    """A throwaway redis-server on a free port (no persistence), or None if there is none here."""
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="scraper-bench-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", folder],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"redis://127.0.0.1:{port}/7"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    return None


class PostgresWatch:
    """CPU of the Postgres backends that crawl processes opened (found by their
    ``application_name``, ``scraper:<host>:<pid>``), plus the server's own background processes
    (WAL writer, checkpointer, background writer: shared with anyone else using the server)."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.seen: dict[int, float] = {}
        self.background = self._background()
        self.background_start = {pid: cpu_seconds(pid) or 0.0 for pid in self.background}

    def _background(self) -> list[int]:
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type IN "
                "('walwriter', 'checkpointer', 'background writer', 'autovacuum launcher')"
            )
            return [r[0] for r in cur.fetchall()]

    def poll(self, crawler_pids: list[int]) -> None:
        names = [f"scraper:{socket.gethostname()}:{pid}"[:63] for pid in crawler_pids]
        with self.conn.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_activity WHERE application_name = ANY(%s)", (names,))
            for (pid,) in cur.fetchall():
                used = cpu_seconds(pid)
                if used is not None:
                    self.seen[pid] = max(self.seen.get(pid, 0.0), used)
        for pid in list(self.seen):
            used = cpu_seconds(pid)
            if used is not None:
                self.seen[pid] = max(self.seen[pid], used)

    def backends_cpu(self) -> float:
        return sum(self.seen.values())

    def background_cpu(self) -> float:
        return sum(
            (cpu_seconds(pid) or self.background_start[pid]) - self.background_start[pid] for pid in self.background
        )

    def close(self) -> None:
        self.conn.close()


def redis_pid(server: Any) -> int:
    return int(server.info("server")["process_id"])
