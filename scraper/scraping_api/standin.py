"""A local stand-in for the AlterLab API, for tests and for trying the middleware offline.

It speaks AlterLab's wire contract (``POST /api/v1/scrape`` with ``X-API-Key``, ``202 + job_id``
then ``GET /api/v1/jobs/{id}``, errors with ``detail``) and fetches the target itself, but only
loopback targets (127.0.0.1, ::1, localhost). Each page costs 1 credit, 5 with ``render_js``.
Every target fetch carries the header ``X-Scraping-Api-Standin: 1`` so a test site can tell
the stand-in from a direct crawler.

Tell it how to misbehave with ``POST /_admin/config`` (JSON) or the command-line flags:

``rules``            a list of ``{"status": 429, "count": 2, "after": 0, "retry_after": 1,
                     "delay_ms": 0, "detail": "..."}``: after ``after`` scrape requests, the next
                     ``count`` ones (0: all) are answered with ``status`` (and ``Retry-After``),
                     or, without a status, only delayed by ``delay_ms`` before being served.
``async_jobs``       answer every scrape with ``202`` and a job; a job is done after
                     ``job_ready_polls`` polls (1: the first poll says pending).
``expire_jobs``      the first poll of that many jobs answers ``404`` (expired).
``job_ttl``          seconds a job's result is kept (3600).
``delay_ms``         every target fetch is held this long (a slow API).

A job is billed when its result is first delivered; a job that expired unread costs nothing.

``GET /_admin/stats`` reports requests, credits, fetches per target URL and host, and the
highest number of concurrent fetches per target host; ``POST /_admin/reset`` clears them.

    python -m scraper.scraping_api.standin --port 8700   # key: --key, SCRAPING_API_STANDIN_KEY or SCRAPING_API_KEY
"""

from __future__ import annotations

import argparse
import json
import os
import socketserver
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
STANDIN_HEADER = "X-Scraping-Api-Standin"
_MAX_BODY = 1 << 20


class _LoopbackRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if (urlsplit(newurl).hostname or "") not in LOOPBACK:
            raise urllib.error.HTTPError(newurl, 403, "stand-in only fetches loopback targets", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_opener = urllib.request.build_opener(_LoopbackRedirects)


class StandIn:
    """The stand-in served from a background thread (``with StandIn(key) as api: api.url``)."""

    def __init__(self, key: str, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        self.key = key
        self.host = host
        self._requested_port = port
        self._lock = threading.Lock()
        self._config: dict[str, Any] = {}
        self._jobs: dict[str, dict[str, Any]] = {}
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.reset()
        self.configure(**config)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "StandIn":
        self._httpd = _Server((self.host, self._requested_port), self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="scraping-api-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "StandIn":
        return self if self._httpd is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "stand-in not started"
        return f"http://{self.host}:{self._httpd.server_address[1]}"

    # -- configuration and statistics ------------------------------------------------------

    def configure(self, **config: Any) -> None:
        with self._lock:
            for name, value in config.items():
                if name == "rules":
                    self._rules = [dict(rule, used=0) for rule in (value or [])]
                elif name == "expire_jobs":
                    self._expire_left = int(value or 0)
                else:
                    self._config[name] = value

    def reset(self) -> None:
        with self._lock:
            self._config = {"async_jobs": False, "job_ready_polls": 1, "job_ttl": 3600.0, "delay_ms": 0}
            self._rules: list[dict[str, Any]] = []
            self._expire_left = 0
            self._jobs.clear()
            self._scrapes = 0
            self._counts: Counter[str] = Counter()
            self._targets: Counter[str] = Counter()
            self._hosts: Counter[str] = Counter()
            self._statuses: Counter[str] = Counter()
            self._inflight: Counter[str] = Counter()
            self._max_inflight: Counter[str] = Counter()
            self._credits = 0.0

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "scrapes": self._scrapes,
                "polls": self._counts["polls"],
                "jobs": self._counts["jobs"],
                "expired": self._counts["expired"],
                "bad_keys": self._counts["bad_keys"],
                "credits": self._credits,
                "fetches": sum(self._targets.values()),
                "targets": dict(self._targets),
                "hosts": dict(self._hosts),
                "max_concurrent": dict(self._max_inflight),
                "statuses": dict(self._statuses),
            }

    # -- the API ---------------------------------------------------------------------------

    def scrape(self, api_key: str | None, payload: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        if api_key != self.key:
            with self._lock:
                self._counts["bad_keys"] += 1
            return 401, {"detail": "Invalid or missing API key"}, {}
        if not isinstance(payload, dict) or not isinstance(payload.get("url"), str):
            return 422, {"detail": "body must be a JSON object with a url"}, {}
        target = payload["url"]
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or (parts.hostname or "") not in LOOPBACK:
            return 400, {"detail": "the stand-in only fetches http(s) loopback targets"}, {}
        with self._lock:
            n = self._scrapes
            self._scrapes += 1
            rule = self._take_rule(n)
            async_jobs = bool(self._config.get("async_jobs"))
        if rule is not None:
            if rule.get("delay_ms"):
                time.sleep(float(rule["delay_ms"]) / 1000)
            if rule.get("status"):
                headers = {"Retry-After": str(rule["retry_after"])} if rule.get("retry_after") is not None else {}
                return int(rule["status"]), {"detail": rule.get("detail") or f"stand-in rule: {rule['status']}"}, headers
        if async_jobs:
            job_id = uuid.uuid4().hex
            with self._lock:
                self._counts["jobs"] += 1
                expire = self._expire_left > 0
                self._expire_left -= 1 if expire else 0
                self._jobs[job_id] = {"created": time.monotonic(), "result": None, "polls": 0, "expire": expire}
            threading.Thread(target=self._run_job, args=(job_id, payload), daemon=True).start()
            return 202, {"job_id": job_id, "status": "pending"}, {}
        return 200, self._fetch(payload), {}

    def job(self, api_key: str | None, job_id: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        if api_key != self.key:
            with self._lock:
                self._counts["bad_keys"] += 1
            return 401, {"detail": "Invalid or missing API key"}, {}
        with self._lock:
            self._counts["polls"] += 1
            job = self._jobs.get(job_id)
            ttl = float(self._config.get("job_ttl") or 3600)
            if job is not None and (job["expire"] or time.monotonic() - job["created"] > ttl):
                del self._jobs[job_id]
                self._counts["expired"] += 1
                job = None
            if job is None:
                return 404, {"detail": "Job not found or expired"}, {}
            job["polls"] += 1
            ready = job["result"] is not None and job["polls"] >= int(self._config.get("job_ready_polls") or 1)
            if not ready:
                return 200, {"job_id": job_id, "status": "pending"}, {}
            if not job.get("charged"):  # a job is billed when its result is delivered, once
                job["charged"] = True
                self._credits += float(job["result"].get("credits_used") or 0)
            return 200, {"job_id": job_id, "status": "completed", "result": job["result"]}, {}

    def _take_rule(self, n: int) -> dict[str, Any] | None:
        for rule in self._rules:
            count = int(rule.get("count", 1) or 0)
            if n >= int(rule.get("after", 0) or 0) and (count == 0 or rule["used"] < count):
                rule["used"] += 1
                return rule
        return None

    def _run_job(self, job_id: str, payload: dict[str, Any]) -> None:
        result = self._fetch(payload, charge=False)
        with self._lock:
            if job_id in self._jobs:
                self._jobs[job_id]["result"] = result

    def _fetch(self, payload: dict[str, Any], charge: bool = True) -> dict[str, Any]:
        target = payload["url"]
        parts = urlsplit(target)
        host = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        advanced = payload.get("advanced") or {}
        render_js = advanced.get("render_js") in (True, "true", "auto") or payload.get("mode") == "js"
        credits = 5 if render_js else 1
        headers = {"User-Agent": "scraping-api-standin/1.0", STANDIN_HEADER: "1"}
        headers.update({str(k): str(v) for k, v in (payload.get("headers") or {}).items()})
        body = payload.get("body")
        request = urllib.request.Request(
            target, method=str(payload.get("method") or "GET").upper(), headers=headers,
            data=body.encode("utf-8") if isinstance(body, str) else None,
        )
        with self._lock:
            self._targets[target] += 1
            self._hosts[host] += 1
            self._inflight[host] += 1
            self._max_inflight[host] = max(self._max_inflight[host], self._inflight[host])
            delay = float(self._config.get("delay_ms") or 0) / 1000
        started = time.monotonic()
        try:
            if delay:
                time.sleep(delay)
            try:
                with _opener.open(request, timeout=30) as response:
                    status, final_url, raw_headers, raw = response.status, response.url, response.headers, response.read()
            except urllib.error.HTTPError as exc:
                status, final_url, raw_headers, raw = exc.code, exc.url or target, exc.headers, exc.read()
            except (urllib.error.URLError, OSError) as exc:
                status, final_url, raw_headers, raw = 502, target, None, f"stand-in could not fetch: {exc}".encode()
        finally:
            with self._lock:
                self._inflight[host] -= 1
        charset = (raw_headers.get_content_charset() if raw_headers is not None else None) or "utf-8"
        try:
            content = raw.decode(charset, "replace")
        except LookupError:
            content = raw.decode("utf-8", "replace")
        header_map: dict[str, Any] = {}
        for name, value in (raw_headers.items() if raw_headers is not None else []):
            if name in header_map:
                previous = header_map[name]
                header_map[name] = (previous if isinstance(previous, list) else [previous]) + [value]
            else:
                header_map[name] = value
        with self._lock:
            if charge:
                self._credits += credits
            self._statuses[str(status)] += 1
        return {
            "url": final_url,
            "status_code": status,
            "content": content,
            "headers": header_map,
            "cached": False,
            "credits_used": credits,
            "response_time_ms": int((time.monotonic() - started) * 1000),
            "size_bytes": len(raw),
        }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], api: StandIn) -> None:
        self.api = api
        super().__init__(address, _Handler)

    def server_bind(self) -> None:  # skip the FQDN lookup, which can hang without DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet; the stats tell the story
        pass

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _payload(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            return None
        try:
            return json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            return None

    def do_POST(self) -> None:  # noqa: N802
        api = self.server.api
        path = urlsplit(self.path).path
        if path == "/api/v1/scrape":
            self._send(*api.scrape(self.headers.get("X-API-Key"), self._payload()))
        elif path == "/_admin/config":
            payload = self._payload()
            if not isinstance(payload, dict):
                self._send(422, {"detail": "expected a JSON object"})
                return
            api.configure(**payload)
            self._send(200, {"ok": True})
        elif path == "/_admin/reset":
            api.reset()
            self._send(200, {"ok": True})
        else:
            self._send(404, {"detail": "Not found"})

    def do_GET(self) -> None:  # noqa: N802
        api = self.server.api
        path = urlsplit(self.path).path
        if path.startswith("/api/v1/jobs/"):
            self._send(*api.job(self.headers.get("X-API-Key"), path.rsplit("/", 1)[-1]))
        elif path == "/_admin/stats":
            self._send(200, api.stats())
        else:
            self._send(404, {"detail": "Not found"})


def _rule(text: str) -> dict[str, Any]:
    """``STATUS[xCOUNT][@AFTER]``, e.g. ``429x3`` or ``402@10`` (COUNT 0 = every request)."""
    head, _, after = text.partition("@")
    status, _, count = head.partition("x")
    rule: dict[str, Any] = {"status": int(status), "count": int(count or 1), "after": int(after or 0)}
    return rule


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scraper.scraping_api.standin", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument(
        "--key", default=None,
        help="API key to accept (default: $SCRAPING_API_STANDIN_KEY, else $SCRAPING_API_KEY, the crawl's own)",
    )
    parser.add_argument("--delay-ms", type=int, default=0, help="hold every target fetch this long")
    parser.add_argument("--async-jobs", action="store_true", help="answer 202 + job_id, to be polled")
    parser.add_argument("--job-ready-polls", type=int, default=1)
    parser.add_argument("--expire-jobs", type=int, default=0, help="the first poll of N jobs answers 404")
    parser.add_argument("--job-ttl", type=float, default=3600.0)
    parser.add_argument("--fail", action="append", default=[], metavar="STATUS[xCOUNT][@AFTER]",
                        help="answer STATUS to COUNT scrape requests (0: all) after AFTER of them")
    parser.add_argument("--retry-after", type=float, default=None, help="Retry-After sent with --fail answers")
    args = parser.parse_args(argv)
    # The crawl's own variable as a fallback: one key in .env serves both sides in docker compose.
    key = args.key or os.environ.get("SCRAPING_API_STANDIN_KEY") or os.environ.get("SCRAPING_API_KEY")
    if not key:
        parser.error("give the key to accept with --key, SCRAPING_API_STANDIN_KEY or SCRAPING_API_KEY")
    rules = [_rule(r) for r in args.fail]
    for rule in rules:
        if args.retry_after is not None:
            rule["retry_after"] = args.retry_after
    api = StandIn(key, host=args.host, port=args.port, delay_ms=args.delay_ms, async_jobs=args.async_jobs,
                  job_ready_polls=args.job_ready_polls, expire_jobs=args.expire_jobs, job_ttl=args.job_ttl,
                  rules=rules)
    api.start()
    print(f"scraping-API stand-in listening on {api.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
