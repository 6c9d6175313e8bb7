"""Processes a test starts and waits on: crawls whose log goes to a file, free ports, polling."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from .crawls import ROOT, scrapy_cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def wait_for(predicate, timeout: float = 30.0, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError("condition not met in time")


class Crawl:
    """A crawl process whose log goes to a file: a pipe nobody reads would stall it."""

    def __init__(self, env: dict[str, str], *args: str, spider: str = "demo", cwd: Path = ROOT) -> None:
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            scrapy_cmd("crawl", spider, *args), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=self.log, text=True
        )

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def communicate(self, timeout: float) -> tuple[str, str]:
        self.proc.wait(timeout=timeout)
        self.log.seek(0)
        text = self.log.read()
        self.log.close()
        return "", text


def start_crawl(env: dict[str, str], *args: str, spider: str = "demo", cwd: Path = ROOT) -> Crawl:
    return Crawl(env, *args, spider=spider, cwd=cwd)


def prometheus_ready(port: int) -> bool:
    try:
        return "Ready" in fetch(f"http://127.0.0.1:{port}/-/ready")
    except OSError:
        return False
