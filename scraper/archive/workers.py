"""A replay split over several processes, which share nothing but Postgres and Redis.

A replay is CPU-bound in its one Python process: the spider's parsing and the item pipeline run
one page at a time in one interpreter. ``scrapy reprocess`` therefore starts one worker process
per share of the records (``--workers``; by default one per CPU, once there are enough pages to
pay for a process's start): worker *i* of *n* replays every *n*-th record from the *i*-th, in
index order, with the same code as a replay in one process. What could make two workers store
differently from one process is shared: the dedupe claims are one Redis hash for the whole
replay (an item seen on pages of two workers is stored once, as by two crawl nodes), the rows'
upserts are idempotent, and the history, rejects and field counts are written as by any two nodes.

The command speaks for the workers: their logs go to its stderr as they are; their progress,
the files they cannot read and their figures come to it over their stdout (one line each,
marked), and it says one progress line, each unreadable file once, and one summary.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from .replay import BAD_RECORDS_NAMED, Unreadable, progress_line

logger = logging.getLogger(__name__)

MARK = "\x1ereprocess-worker "
# A worker's start (interpreter, imports, the crawler) costs about a second of CPU: below this
# many pages each, one process more is not worth it.
MIN_PAGES_PER_WORKER = 1000
PROGRESS_EVERY = 5.0
# Stats that are no counts: the largest of the workers', not their sum.
_NOT_ADDED = ("max", "seconds", "memusage", "interval", "known", "time")


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def worker_count(requested: int | None, pages: int) -> int:
    """*requested* workers (at most one per page), else one per CPU and per MIN_PAGES_PER_WORKER pages."""
    if requested is not None:
        return max(1, min(requested, pages))
    return max(1, min(cpus(), pages // MIN_PAGES_PER_WORKER))


def shares(ids: Sequence[int], count: int) -> list[list[int]]:
    """Every *count*-th id from the *i*-th: each worker goes through the archive in the order a
    single process would, so that which page claims an item first stays as it was."""
    return [list(ids[i::count]) for i in range(count)]


class Reporter:
    """A worker's side: one marked JSON line on stdout per message to the command."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        # The process's own stdout, not what LOG_STDOUT may have put in its place.
        self.stream = stream or sys.__stdout__ or sys.stdout

    def send(self, **message: Any) -> None:
        self.stream.write(MARK + json.dumps(message, default=str) + "\n")
        self.stream.flush()


class ReportedUnreadable(Unreadable):
    """A worker's unreadable files and records, told to the command, which says them once."""

    def __init__(self, reporter: Reporter) -> None:
        super().__init__()
        self.reporter = reporter

    def file(self, name: str, error: str) -> None:
        if name not in self.files:
            self.files.add(name)
            self.reporter.send(unreadable_file=[name, error])

    def record(self, url: str, name: str, start: int, end: int) -> None:
        self.records += 1
        # The command names BAD_RECORDS_NAMED in all, then says there are more.
        if self.records <= BAD_RECORDS_NAMED + 1:
            self.reporter.send(unreadable_record=[url, name, start, end])


def json_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """The stats a worker sends: numbers and text (times and the like stay with it)."""
    return {k: v for k, v in stats.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}


def merge_stats(each: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' stats as one replay's: counts added, sizes and durations the largest."""
    merged: dict[str, Any] = {}
    for stats in each:
        for key, value in stats.items():
            if not isinstance(value, (int, float)):
                merged.setdefault(key, value)
            elif any(word in key for word in _NOT_ADDED):
                merged[key] = max(merged.get(key, value), value)
            else:
                merged[key] = merged.get(key, 0) + value
    return merged


@dataclass
class Worker:
    index: int
    proc: subprocess.Popen
    done: int = 0
    opened: float | None = None
    closed: float | None = None
    result: dict[str, Any] | None = None
    reader: threading.Thread | None = None


@dataclass
class Outcome:
    stats: dict[str, Any]
    results: list[dict[str, Any]]
    failed: list[tuple[int, int]] = field(default_factory=list)  # (worker, exit status) without a result
    opened: float | None = None
    closed: float | None = None


class Workers:
    """The command's side: starts the workers, says their progress, gathers their figures."""

    def __init__(self, commands: list[list[str]], total: int, unreadable: Unreadable, env: dict[str, str]) -> None:
        self.commands = commands
        self.env = env
        self.total = total
        self.unreadable = unreadable
        self.lock = threading.Lock()
        self.workers: list[Worker] = []

    def run(self) -> Outcome:
        for i, command in enumerate(self.commands):
            # Their stderr is the command's: their logs read as one process's would.
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1, env=self.env)
            worker = Worker(i, proc)
            worker.reader = threading.Thread(target=self._read, args=(worker,), daemon=True)
            worker.reader.start()
            self.workers.append(worker)
        previous = signal.signal(signal.SIGTERM, self._terminate)
        try:
            self._wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
        opened = [w.opened for w in self.workers if w.opened is not None]
        closed = [w.closed for w in self.workers if w.closed is not None]
        outcome = Outcome(
            stats=merge_stats([w.result.get("stats", {}) for w in self.workers if w.result]),
            results=[w.result for w in self.workers if w.result],
            failed=[(w.index, w.proc.returncode) for w in self.workers if w.result is None],
            opened=min(opened) if opened else None,
            closed=max(closed) if closed else None,
        )
        done = sum(w.done for w in self.workers)
        if outcome.opened is not None and outcome.closed is not None:
            logger.info("%s", progress_line(done, self.total, outcome.closed - outcome.opened))
        return outcome

    def _wait(self) -> None:
        said = time.monotonic()
        while True:
            try:
                try:
                    for worker in self.workers:
                        worker.proc.wait(timeout=max(0.0, said + PROGRESS_EVERY - time.monotonic()))
                    break
                except subprocess.TimeoutExpired:
                    said = time.monotonic()
                    self._say_progress()
            except KeyboardInterrupt:
                # Ctrl-C reached every worker too (one process group): they close as one crawl
                # would, and are waited for.
                continue
        for worker in self.workers:
            if worker.reader is not None:
                worker.reader.join(timeout=10)

    def _say_progress(self) -> None:
        opened = [w.opened for w in self.workers if w.opened is not None]
        if opened:
            done = sum(w.done for w in self.workers)
            logger.info("%s", progress_line(done, self.total, time.time() - min(opened)))

    def _terminate(self, signum: int, frame: Any) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signum)

    def _read(self, worker: Worker) -> None:
        assert worker.proc.stdout is not None
        for line in worker.proc.stdout:
            if not line.startswith(MARK):
                sys.stdout.write(line)  # a spider's own print()
                continue
            try:
                message = json.loads(line[len(MARK) :])
            except ValueError:  # not ours after all: read on, or the worker blocks on a full pipe
                sys.stdout.write(line)
                continue
            with self.lock:
                self._take(worker, message)

    def _take(self, worker: Worker, message: dict[str, Any]) -> None:
        if "opened" in message:
            worker.opened = message["opened"]
        if "closed" in message:
            worker.closed = message["closed"]
        if "progress" in message:
            worker.done = message["progress"]
        if "unreadable_file" in message:
            self.unreadable.file(*message["unreadable_file"])
        if "unreadable_record" in message:
            self.unreadable.record(*message["unreadable_record"])
        if "result" in message:
            worker.result = message["result"]
