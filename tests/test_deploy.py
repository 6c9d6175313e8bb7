"""Deployment: scrapyd with authentication, scrapyd-deploy, two scrapyd nodes, the compose stack.

All real: scrapyd and scrapyd-deploy from PyPI (in the venv) run on loopback with our
scrapyd.conf (its folders moved under a temporary directory) and our scrapy.cfg; crawls go to
the Redis and Postgres of the ``clean`` fixture and fetch the demo site. docker-compose.yml is
validated by Debian's docker-compose.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import psutil
import pytest
import yaml
from support.binaries import ensure_binary
from support.crawls import ROOT, TEST_SCHEDULER_SECRET, Services

from scraper.demo_site import Catalog, DemoSite
from scraper.scraping_api.standin import StandIn

VENV_BIN = Path(sys.executable).parent
USERNAME = "deployer"
PASSWORD = "Scrapyd-pw-5d0c8e"
# Variables of ours that must not leak from the test into scrapyd, which must get only what a
# test gives it.
SCRUBBED = (
    "REDIS_URL",
    "DATABASE_URL",
    "DEMO_SITE_URL",
    "PYTHONPATH",
    "SCRAPY_SETTINGS_MODULE",
    "SCRAPY_PROJECT",
    "SCRAPYD_USERNAME",
    "SCRAPYD_PASSWORD",
    "SCRAPYD_URL",
    "SCRAPYD_BIND_ADDRESS",
    "SCRAPYD_HTTP_PORT",
    "SCRAPING_API_KEY",
    "LOG_LEVEL",
)

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(
    method: str, url: str, auth: tuple[str, str] | None = None, data: dict[str, str] | None = None
) -> tuple[int, bytes]:
    body = urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, method=method)
    if auth:
        request.add_header("Authorization", "Basic " + b64encode(":".join(auth).encode()).decode())
    try:
        with _no_proxy.open(request, timeout=15) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update(extra)
    return env


@dataclass
class Scrapyd:
    url: str
    workdir: Path
    proc: subprocess.Popen
    log: Path

    def call(self, endpoint: str, data: dict[str, str] | None = None, **params: str) -> dict:
        url = self.url + endpoint + (f"?{urlencode(params)}" if params else "")
        status, body = http("POST" if data is not None else "GET", url, (USERNAME, PASSWORD), data)
        assert status == 200, (endpoint, status, body[:500], self.output())
        answer = json.loads(body)
        assert answer["status"] == "ok", (endpoint, answer)
        return answer

    def schedule(self, spider: str = "demo") -> str:
        return self.call("schedule.json", {"project": "scraper", "spider": spider})["jobid"]

    def wait(self, job: str, timeout: float = 60, while_running: Callable[[int], None] | None = None) -> dict:
        """Wait for *job* to finish; call ``while_running(pid)`` on every poll while it runs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = self.call("listjobs.json", project="scraper")
            finished = [j for j in jobs["finished"] if j["id"] == job]
            if finished:
                return finished[0]
            running = [j for j in jobs["running"] if j["id"] == job]
            if running and while_running is not None:
                while_running(running[0]["pid"])
            time.sleep(0.1)
        raise AssertionError(f"job {job} did not finish in {timeout} s\n{self.output()}")

    def job_log(self, job: str) -> str:
        return (self.workdir / "logs" / "scraper" / "demo" / f"{job}.log").read_text()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


def scrapyd_conf(workdir: Path, port: int) -> str:
    """Our scrapyd.conf, with its folders under *workdir* and a quicker poll for the tests."""
    config = configparser.ConfigParser()
    config.read(ROOT / "scrapyd.conf")
    section = config["scrapyd"]
    assert section["bind_address"] == "127.0.0.1"  # production: loopback unless told otherwise
    for option, folder in (("eggs_dir", "eggs"), ("dbs_dir", "dbs"), ("logs_dir", "logs")):
        assert section[option].startswith("/"), option  # production keeps them outside the code
        section[option] = str(workdir / folder)
    section["http_port"] = str(port)
    section["poll_interval"] = "0.2"
    return "[scrapyd]\n" + "".join(f"{name} = {value}\n" for name, value in section.items())


@contextlib.contextmanager
def running_scrapyd(workdir: Path, **env: str) -> Iterator[Scrapyd]:
    """A real scrapyd on a free loopback port, authentication on, *env* in its environment.

    It runs in a folder of its own (no scrapy.cfg, no project code, no PYTHONPATH): its jobs can
    only run the deployed egg."""
    workdir.mkdir(parents=True)
    port = free_port()
    (workdir / "scrapyd.conf").write_text(scrapyd_conf(workdir, port))
    log = workdir / "scrapyd.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(VENV_BIN / "scrapyd")],
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=base_env(SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD, **env),
        )
    node = Scrapyd(f"http://127.0.0.1:{port}/", workdir, proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"scrapyd exited with {proc.returncode}\n{node.output()}"
            with contextlib.suppress(OSError):
                if http("GET", node.url + "daemonstatus.json", (USERNAME, PASSWORD))[0] == 200:
                    break
            assert time.monotonic() < deadline, f"scrapyd did not answer\n{node.output()}"
            time.sleep(0.1)
        yield node
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        for child in children:  # a job still running when a test failed
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def checkout(tmp_path: Path) -> Path:
    """What a deploying machine has: a copy of the project's files (no venv, no build output).

    A copy, so that a deploy never writes build/ or *.egg-info into the working tree that
    another test session may be deploying from at the same time."""
    target = tmp_path / "checkout"
    target.mkdir()
    for name in ("setup.py", "scrapy.cfg", "Makefile", "requirements.txt", "requirements-dev.txt"):
        shutil.copy2(ROOT / name, target / name)
    shutil.copytree(ROOT / "scraper", target / "scraper", ignore=shutil.ignore_patterns("__pycache__"))
    return target


def deploy_env(node: Scrapyd) -> dict[str, str]:
    return base_env(SCRAPYD_URL=node.url, SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD)


def scrapyd_deploy(project: Path, node: Scrapyd) -> None:
    """`scrapyd-deploy` with no argument: the default target, whose URL comes from SCRAPYD_URL."""
    result = subprocess.run(
        [str(VENV_BIN / "scrapyd-deploy")],
        cwd=project,
        env=deploy_env(node),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"status": "ok"' in result.stdout, result.stdout + result.stderr


def job_env(services: Services, site: DemoSite, **extra: str) -> dict[str, str]:
    env = dict(
        REDIS_URL=services.redis_url,
        DATABASE_URL=services.database_url,
        DEMO_SITE_URL=site.url,
        SCHEDULER_IDLE_TIMEOUT="1",
        POSTGRES_FLUSH_INTERVAL="0.2",
        # The fleet secret and the loopback test site, as crawl_env gives every crawl.
        SCHEDULER_SECRET=TEST_SCHEDULER_SECRET,
        FETCH_ALLOW_NETWORKS="127.0.0.0/8",
    )
    env.update(extra)
    return env


def stored_skus(services: Services) -> list[str]:
    return sorted(sku for (sku,) in services.query("SELECT sku FROM products WHERE source = 'demo'"))


def stat(log: str, name: str) -> int:
    found = re.search(rf"'{name}': (\d+)", log)
    return int(found.group(1)) if found else 0


def assert_crawl_finished(log: str) -> None:
    assert "Crawl summary (finished" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


# --- scrapyd ---------------------------------------------------------------------------------


def test_deploy_with_make_then_crawl_through_the_authenticated_api(
    clean: Services, site: DemoSite, catalog: Catalog, tmp_path: Path
) -> None:
    project = checkout(tmp_path)
    with running_scrapyd(tmp_path / "scrapyd", **job_env(clean, site)) as node:
        # `make deploy`: the Makefile target, which runs scrapyd-deploy on the default target
        # (URL and credentials from the environment). STAMP= skips the venv install step.
        make = ensure_binary("make", "make")
        result = subprocess.run(
            [make, "deploy", "STAMP=", f"VENV={VENV_BIN.parent}"],
            cwd=project,
            env=deploy_env(node),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "scrapyd-deploy default" in result.stdout and '"status": "ok"' in result.stdout
        assert node.call("listspiders.json", project="scraper")["spiders"] == [
            "api_extract",
            "demo",
            "demo_js",
            "demo_sitemap",
            "schema_org",
        ]

        job = node.schedule()
        finished = node.wait(job)
        log = node.job_log(job)
        assert_crawl_finished(log)
        assert stored_skus(clean) == sorted(p.sku for p in catalog.valid_products())

        # The job ran the deployed egg, not the working tree.
        assert re.search(r"'TEMPLATES_DIR': '[^']*/eggs/scraper/[^']*\.egg/scraper/templates'", log), log[:4000]
        # Telnet console and remote control are off in a deployed job.
        extensions = re.search(r"Enabled extensions:\n(\[.*?\])", log, re.S)
        assert extensions, log[:4000]
        assert "TelnetConsole" not in extensions.group(1) and "RemoteControl" not in extensions.group(1)
        assert "Telnet console listening" not in log and "Remote control HTTP server" not in log

        # The job's log is served, to the authenticated only.
        status, body = http("GET", node.url.rstrip("/") + finished["log_url"], (USERNAME, PASSWORD))
        assert status == 200 and b"Crawl summary (finished" in body

        # Without credentials, or with wrong ones, everything is refused: the API, the logs, the
        # web pages, and deploying or scheduling (which would run code).
        refused = [
            ("GET", "daemonstatus.json", None),
            ("GET", "listjobs.json", None),
            ("GET", "", None),
            ("GET", finished["log_url"].lstrip("/"), None),
            ("GET", "logs/", None),
            ("POST", "schedule.json", {"project": "scraper", "spider": "demo"}),
            ("POST", "cancel.json", {"project": "scraper", "job": job}),
            ("POST", "delproject.json", {"project": "scraper"}),
        ]
        for method, endpoint, data in refused:
            for auth in (None, (USERNAME, "wrong"), ("intruder", PASSWORD)):
                status, _ = http(method, node.url + endpoint, auth, data)
                assert status == 401, (method, endpoint, auth, status)
        jobs = node.call("listjobs.json", project="scraper")
        assert [j["id"] for j in jobs["finished"]] == [job] and not jobs["pending"] and not jobs["running"]


def test_two_scrapyd_nodes_share_one_crawl(clean: Services, catalog: Catalog, tmp_path: Path) -> None:
    # Slow pages and low concurrency, so that the crawl outlasts the start of both jobs.
    site = DemoSite(catalog, delay_ms=100).start()
    env = job_env(clean, site, SCHEDULER_IDLE_TIMEOUT="3", CONCURRENT_REQUESTS_PER_DOMAIN="4")
    project = checkout(tmp_path)
    try:
        with running_scrapyd(tmp_path / "a", **env) as a, running_scrapyd(tmp_path / "b", **env) as b:
            for node in (a, b):
                scrapyd_deploy(project, node)
                # scrapyd runs `scrapy list` (a second or two) to check a spider name, then caches
                # the answer: ask for the list first, so that the two jobs start together.
                assert "demo" in node.call("listspiders.json", project="scraper")["spiders"]
            jobs = [(a, a.schedule()), (b, b.schedule())]
            logs = []
            for node, job in jobs:
                node.wait(job)
                logs.append(node.job_log(job))
    finally:
        site.stop()
    for log in logs:
        assert_crawl_finished(log)
        assert stat(log, "response_received_count") > 10, "one node did not share the work"
    counts = site.stats()["requests"]
    pages = [p for p in counts if p != "/robots.txt"]
    assert sorted(pages) == sorted(catalog.pages())
    assert all(counts[p] == 1 for p in pages), {p: c for p, c in counts.items() if c > 1}
    rows = clean.query("SELECT sku, count(*) FROM products GROUP BY sku")
    assert sorted(sku for sku, _ in rows) == sorted(p.sku for p in catalog.valid_products())
    assert all(n == 1 for _, n in rows)
    assert sum(stat(log, "item_scraped_count") for log in logs) == len(catalog.valid_products())


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, f"{parts.username or 'postgres'}:{password}@{host}", parts.path, parts.query, ""))


def test_secrets_stay_out_of_job_list_logs_and_command_lines(clean: Services, catalog: Catalog, tmp_path: Path) -> None:
    db_canary, key_canary = "Canary-db-7c1e55", "Canary-key-0b9d21"
    secrets = (db_canary, key_canary, PASSWORD)
    # Trust authentication on the test Postgres: any password is accepted, so the canary is used.
    site = DemoSite(catalog, delay_ms=30).start()
    # The key is really used: pages go through the local scraping-API stand-in that accepts it.
    api = StandIn(key_canary).start()
    env = job_env(
        clean,
        site,
        DATABASE_URL=with_password(clean.database_url, db_canary),
        SCRAPING_API_KEY=key_canary,
        SCRAPING_API_URL=api.url,
        LOG_LEVEL="DEBUG",
    )
    cmdlines: list[str] = []
    listeners: dict[int, bytes] = {}

    def inspect(pid: int) -> None:
        # Every process on the machine, the job included: nothing shows a secret in `ps`.
        for proc in psutil.process_iter(["cmdline"]):
            cmdlines.append(" ".join(proc.info["cmdline"] or []))
        # The job listens on nothing but its metrics endpoint (no telnet, no remote control).
        with contextlib.suppress(psutil.NoSuchProcess):
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.port not in listeners:
                    with contextlib.suppress(OSError):
                        listeners[conn.laddr.port] = http("GET", f"http://127.0.0.1:{conn.laddr.port}/metrics")[1]

    try:
        with running_scrapyd(tmp_path / "scrapyd", **env) as node:
            scrapyd_deploy(checkout(tmp_path), node)
            job = node.schedule()
            node.wait(job, while_running=inspect)
            status, listing = http("GET", node.url + "listjobs.json", (USERNAME, PASSWORD))
            status_html, jobs_page = http("GET", node.url + "jobs", (USERNAME, PASSWORD))
            assert status == status_html == 200
            log = node.job_log(job)
            job_logs = "".join(p.read_text() for p in (node.workdir / "logs").rglob("*") if p.is_file())
            daemon_log = node.log.read_text()
    finally:
        site.stop()
        api.stop()
    assert_crawl_finished(log)
    assert "'scraping_api/credits':" in log  # pages went through the API with the canary key
    assert stored_skus(clean) == sorted(p.sku for p in catalog.valid_products())  # the canary URL worked
    assert "Storing items in postgresql://postgres:***@" in log  # the URL was logged, masked

    job_cmdlines = [c for c in cmdlines if "scrapyd.runner" in c and job in c]
    assert job_cmdlines, "never saw the job running"
    # Settings reach the job from the environment: its only arguments are scrapyd's own.
    for cmdline in job_cmdlines:
        assert re.fullmatch(rf"\S*python\S* -m scrapyd\.runner crawl demo -s LOG_FILE=\S+ -a _job={job}", cmdline), (
            cmdline
        )
    for secret in secrets:
        assert secret not in listing.decode() and secret not in jobs_page.decode()
        assert secret not in job_logs and secret not in daemon_log
        assert not [c for c in cmdlines if secret in c]
    for port, body in listeners.items():
        assert b"# HELP" in body, (port, body[:200])


# --- make deploy -----------------------------------------------------------------------------


def test_make_deploy_needs_credentials_and_a_url(tmp_path: Path) -> None:
    make = ensure_binary("make", "make")
    project = checkout(tmp_path)
    args = [make, "deploy", "STAMP=", f"VENV={VENV_BIN.parent}"]
    result = subprocess.run(args, cwd=project, env=base_env(), capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "set SCRAPYD_USERNAME and SCRAPYD_PASSWORD" in result.stderr
    creds = base_env(SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD)
    result = subprocess.run(args, cwd=project, env=creds, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "set SCRAPYD_URL" in result.stderr
    assert "scrapyd-deploy" not in result.stdout  # stopped before building anything


# --- docker-compose.yml ----------------------------------------------------------------------

COMPOSE_FILE = ROOT / "docker-compose.yml"


def env_example() -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def compose(tmp_path: Path, *args: str, env_file: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    binary = ensure_binary("docker-compose", "docker-compose")
    values = env_example() if env_file is None else env_file
    path = tmp_path / "test.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    # Only the env file speaks: a variable of this shell must not hide a missing one.
    env = {k: v for k, v in os.environ.items() if k not in env_example() and not k.startswith("COMPOSE_")}
    return subprocess.run(
        [binary, "-f", str(COMPOSE_FILE), "--env-file", str(path), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def compose_config(tmp_path: Path, *args: str) -> dict:
    result = compose(tmp_path, "config", *args)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def our_services(config: dict) -> dict[str, dict]:
    """The services built from our Dockerfile."""
    return {name: svc for name, svc in config["services"].items() if "build" in svc}


def settings_variables() -> set[str]:
    """The environment variables scraper/settings.py reads: the registry's environment settings."""
    from scraper.conf.registry import REGISTRY

    return {name for name, setting in REGISTRY.items() if setting.env}


def scrapyd_variables() -> set[str]:
    import scrapyd

    names: set[str] = set()
    for source in Path(scrapyd.__file__).parent.glob("*.py"):
        names |= set(re.findall(r'os\.getenv\("(SCRAPYD_[A-Z_]+)"', source.read_text()))
    return names


def test_compose_file_validates_with_docker_compose(tmp_path: Path) -> None:
    result = compose(tmp_path, "config", "-q")
    assert result.returncode == 0, result.stderr
    profiles = compose(tmp_path, "config", "--profiles")
    assert profiles.returncode == 0 and profiles.stdout.split() == ["api", "feed", "scrapyd"], (
        profiles.stdout + profiles.stderr
    )
    services = set(compose_config(tmp_path)["services"])
    assert {"redis", "postgres", "crawler", "scrapyd", "api-standin", "prometheus", "grafana"} <= services


@pytest.mark.parametrize("missing", ["POSTGRES_PASSWORD", "REDIS_PASSWORD", "GRAFANA_ADMIN_PASSWORD"])
def test_compose_refuses_to_run_without_a_password(tmp_path: Path, missing: str) -> None:
    values = {k: v for k, v in env_example().items() if k != missing}
    result = compose(tmp_path, "config", "-q", env_file=values)
    assert result.returncode != 0 and f"set {missing} in .env" in result.stderr, result.stderr


def test_compose_environment_of_our_services_is_read_by_settings(tmp_path: Path) -> None:
    config = compose_config(tmp_path)
    ours = our_services(config)
    assert {"crawler", "scrapyd", "demo-site", "api-standin"} <= set(ours)
    read = settings_variables()
    assert {"REDIS_URL", "DATABASE_URL", "DEMO_SITE_URL"} <= read
    scrapyd_reads = scrapyd_variables()
    assert {"SCRAPYD_USERNAME", "SCRAPYD_PASSWORD", "SCRAPYD_BIND_ADDRESS"} <= scrapyd_reads
    for name, service in ours.items():
        keys = set(service.get("environment") or {})
        allowed = read | (scrapyd_reads if name == "scrapyd" else set())
        assert keys <= allowed, (
            f"{name} sets {sorted(keys - allowed)}, which no setting reads from the environment (scraper/conf/registry.py)"
        )


def test_compose_file_holds_no_secret_and_documents_every_variable(tmp_path: Path) -> None:
    raw = compose_config(tmp_path, "--no-interpolate")
    secret_name = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY$|AUTH")
    for name, service in raw["services"].items():
        for key, value in (service.get("environment") or {}).items():
            value = str(value)
            if secret_name.search(key):
                assert re.fullmatch(r"\$\{[A-Z0-9_]+(:?[-?][^}]*)?\}", value), (name, key, value)
            userinfo = re.match(r"\w+://([^/@]*)@", value)
            if userinfo and ":" in userinfo.group(1):
                assert re.fullmatch(r"[^:]*:\$\{[A-Z0-9_]+\}", userinfo.group(1)), (name, key, value)
    text = "\n".join(line for line in COMPOSE_FILE.read_text().splitlines() if not line.lstrip().startswith("#"))
    used = set(re.findall(r"(?<!\$)\$\{([A-Z0-9_]+)", text))
    documented = set(env_example())
    assert used <= documented, f"not in .env.example: {sorted(used - documented)}"
    assert used >= {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "SCRAPYD_PASSWORD"}


def test_compose_wires_metrics_and_dashboards_to_the_monitoring_files(tmp_path: Path) -> None:
    config = compose_config(tmp_path)
    services = config["services"]

    def mounts(service: str) -> dict[str, str]:
        """Container path -> source (a host path or a volume name)."""
        result = {}
        for volume in services[service].get("volumes", []):
            if isinstance(volume, str):
                source, target = volume.split(":")[:2]
            else:
                source, target = volume["source"], volume["target"]
            result[target] = source
        return result

    prometheus = mounts("prometheus")
    assert prometheus["/etc/prometheus/prometheus.yml"] == str(ROOT / "monitoring" / "prometheus.yml")
    assert prometheus["/etc/prometheus/alerts.yml"] == str(ROOT / "monitoring" / "alerts.yml")
    # prometheus.yml reads file_sd target files from a folder; that folder is the shared volume
    # into which every crawl node writes its target files (METRICS_FILE_SD_DIR).
    prom_config = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    sd_files = [
        f for job in prom_config["scrape_configs"] for sd in job.get("file_sd_configs", []) for f in sd["files"]
    ]
    assert sd_files, "monitoring/prometheus.yml has no file_sd_configs"
    sd_dir = str(Path(sd_files[0]).parent)
    volume = prometheus[sd_dir]
    assert volume in config["volumes"]
    for name in ("crawler", "scrapyd"):
        env = services[name]["environment"]
        assert env["METRICS_BIND"] == "0.0.0.0", name
        assert mounts(name)[env["METRICS_FILE_SD_DIR"]] == volume, name
    assert "alerts.yml" in prom_config["rule_files"]  # relative to prometheus.yml: the mount above

    grafana = mounts("grafana")
    assert grafana["/etc/grafana/provisioning"] == str(ROOT / "monitoring" / "grafana" / "provisioning")
    provider = yaml.safe_load((ROOT / "monitoring/grafana/provisioning/dashboards/scraper.yml").read_text())
    dashboards_path = provider["providers"][0]["options"]["path"]
    assert grafana[dashboards_path] == str(ROOT / "monitoring" / "grafana" / "dashboards")

    # Healthchecks, and dependants wait for them.
    for name in ("redis", "postgres", "demo-site", "crawler", "scrapyd", "api-standin", "prometheus", "grafana"):
        assert "healthcheck" in services[name], name
    for name in ("crawler", "scrapyd"):
        assert all(dep["condition"] == "service_healthy" for dep in services[name]["depends_on"].values())
    assert services["redis"]["command"][-1].startswith("exec redis-server --appendonly yes")


def test_the_image_installs_the_scrapyd_the_tests_run() -> None:
    pins = dict(re.findall(r"^(scrapyd)==(\S+)", (ROOT / "requirements-dev.txt").read_text(), re.M))
    assert re.search(rf"\bscrapyd=={re.escape(pins['scrapyd'])}\b", (ROOT / "Dockerfile").read_text())
