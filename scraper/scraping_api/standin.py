"""A local stand-in for the scraping APIs, for tests and for trying the middleware offline.

It speaks each provider's published wire contract, as their documentation and official clients
describe it, and fetches the target itself, but only loopback targets (127.0.0.1, ::1,
localhost):

* **AlterLab** (reference: the official ``alterlab`` SDK and AlterLab's error-code page):
  ``POST /api/v1/scrape`` with ``X-API-Key``; ``200`` with ``url`` (as asked), ``final_url``
  (after redirects), ``status_code``, ``headers``, ``content`` (a string, or an object per
  format), ``billing.total_credits`` (microcents), ``extraction_result``; or ``202 + job_id``
  then ``GET /api/v1/jobs/{id}`` (pending / running / completed / failed; ``404`` once expired).
  Errors are ``{error, message, details}``: 401 bad key, 402 no balance or a paywall, 403 the
  target blocked the request (refunded), 422 every tier failed, 429 with ``Retry-After``, 504
  ``TIMEOUT`` (refunded) when the page takes longer than the request's ``timeout``. Cookies
  (``advanced.cookies``), ``content_type``, ``location`` (country, language), ``headers``,
  ``method``/``body`` reach the target; ``formats`` html/text/markdown; an ``extraction_schema``
  / ``extraction_profile`` / ``extraction_prompt`` is answered deterministically from the
  page's schema.org data.
* **ScrapingBee** (reference: the official ``scrapingbee`` client): ``GET|POST /api/v1/`` with
  the key in ``Authorization: Bearer``; the target's status passed through
  (``transparent_status_code``), its headers prefixed ``Spb-``, the cost in ``Spb-Cost``; 401
  for a bad key *and* for an exhausted plan (the body says which).
* **Zyte API** (reference: ``zyte-api`` / ``scrapy-zyte-api``): ``POST /v1/extract`` with
  HTTP basic auth; ``httpResponseBody`` (base64 raw bytes) or ``browserHtml``; errors as RFC 7807
  problems (``type``, ``title``, ``detail``); a browser request with a custom method, body or
  headers is a 400.

Text handed over as text (AlterLab's ``content``, Zyte's ``browserHtml``) is decoded as a
browser does: BOM, then the HTTP charset, then ``<meta charset>``, then detection.

Misbehaviour is configured with ``POST /_admin/config`` (JSON), :meth:`StandIn.configure` or the
command-line flags:

``rules``          a list of ``{"status": 429, "count": 2, "after": 0, "retry_after": 1,
                   "delay_ms": 0, "error": "CODE", "message": "...", "match": "/p/3.html",
                   "provider": "alterlab", "job": "failed"}``: of the calls whose target URL
                   contains ``match`` (all, by default) after ``after`` of them, the next
                   ``count`` (0: all) are answered with ``status`` in the provider's error
                   shape, or become an AlterLab job that ends ``failed`` / ``expired``, or,
                   with neither, are only delayed by ``delay_ms`` before being served.
``block``          target URL substrings the "anti-bot" blocks (AlterLab 403 BLOCKED_BY_ANTIBOT)
                   unless the call asks for ``render_js``.
``async_jobs``     answer every AlterLab scrape with ``202`` and a job; a job is done after
                   ``job_ready_polls`` polls (1: the first poll says it is done).
``expire_jobs``    the first poll of that many jobs answers ``404`` (expired).
``fail_jobs``      that many jobs end ``failed``.
``job_ttl``        seconds a job's result is kept (3600).
``delay_ms``       every target fetch is held this long (a slow API).

A page is billed when its result is first delivered; an expired or failed job, a refunded
error, costs nothing. ``GET /_admin/stats`` reports calls, credits, fetches per target URL and
host, the highest number of concurrent fetches per host, calls with the key in the URL and
request fields the contract does not know; ``POST /_admin/reset`` clears them.

    SCRAPING_API_STANDIN_KEY=... python -m scraper.scraping_api.standin --port 8700
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
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
from urllib.parse import parse_qs, urlsplit

from w3lib.encoding import html_to_unicode

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
STANDIN_HEADER = "X-Scraping-Api-Standin"
COUNTRY_HEADER = "X-Standin-Country"
_MAX_BODY = 1 << 20

# AlterLab: request fields the SDK sends (scrape()'s arguments).
ALTERLAB_FIELDS = frozenset(
    {
        "url",
        "mode",
        "sync",
        "force_refresh",
        "include_raw_html",
        "timeout",
        "evidence",
        "promote_schema_org",
        "wait_until",
        "advanced",
        "cost_controls",
        "formats",
        "extraction_schema",
        "extraction_prompt",
        "extraction_profile",
        "wait_for",
        "screenshot",
        "pdf_format",
        "ocr_language",
        "headers",
        "method",
        "body",
        "content_type",
        "location",
        "cache",
        "cache_ttl",
        "webhook_url",
        "max_response_bytes",
    }
)
ALTERLAB_PRICE = {"plain": 200, "render_js": 1000, "use_proxy": 100}  # microcents
SCRAPINGBEE_PRICE = {"plain": 1, "render_js": 5, "premium_proxy": 10, "premium_proxy_js": 25}


class _LoopbackRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if (urlsplit(newurl).hostname or "") not in LOOPBACK:
            raise urllib.error.HTTPError(newurl, 403, "stand-in only fetches loopback targets", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_opener = urllib.request.build_opener(_LoopbackRedirects)


def decode_like_a_browser(raw: bytes, content_type: str | None) -> str:
    """BOM, then the HTTP header's charset, then ``<meta charset>``, then detection."""
    return html_to_unicode(content_type, raw)[1]


class Fetched:
    def __init__(
        self, url: str, final_url: str, status: int, headers: list[tuple[str, str]], raw: bytes, millis: int
    ) -> None:
        self.url, self.final_url, self.status, self.headers, self.raw, self.millis = (
            url,
            final_url,
            status,
            headers,
            raw,
            millis,
        )

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def text(self) -> str:
        return decode_like_a_browser(self.raw, self.header("Content-Type"))

    def header_map(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in self.headers:
            if name in out:
                previous = out[name]
                out[name] = (previous if isinstance(previous, list) else [previous]) + [value]
            else:
                out[name] = value
        return out


def _strip_tags(html: str) -> str:
    html = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", html)
    return re.sub(r"\s+", " ", re.sub(r"(?s)<[^>]+>", " ", html)).strip()


def extract_product(html: str, url: str) -> dict[str, Any]:
    """The stand-in's deterministic extraction: the page's first schema.org Product (JSON-LD or
    microdata), else what the page's own markup names (``h1``, ``itemprop`` or class ``sku``,
    ``price``, ``brand``...), flattened to the fields a product profile returns."""
    import extruct
    from parsel import Selector

    try:
        data = extruct.extract(html, base_url=url, syntaxes=["json-ld", "microdata"], uniform=True)
    except Exception:
        data = {}
    for node in data.get("json-ld", []) + data.get("microdata", []):
        for one in node.get("@graph", [node]) if isinstance(node, dict) else []:
            kind = one.get("@type")
            if "Product" not in (kind if isinstance(kind, list) else [kind]):
                continue
            offers = one.get("offers") or {}
            if isinstance(offers, list):
                offers = offers[0] if offers else {}
            brand = one.get("brand")
            return {
                "name": one.get("name"),
                "sku": one.get("sku"),
                "description": one.get("description"),
                "brand": brand.get("name") if isinstance(brand, dict) else brand,
                "price": offers.get("price") or offers.get("lowPrice"),
                "currency": offers.get("priceCurrency"),
                "availability": offers.get("availability"),
                "url": one.get("url") or url,
            }
    page = Selector(text=html)

    def field(name: str) -> str | None:
        text = page.css(f"[itemprop={name}] ::text, .{name} ::text").getall()
        return " ".join(t.strip() for t in text if t.strip()) or None

    if len(page.css("[itemprop=price], .price")) != 1:  # a listing, or no product at all
        return {}
    name = field("name") or " ".join(page.css("h1 ::text").getall()).strip() or None
    found = {
        "name": name,
        "sku": field("sku"),
        "description": field("description") or field("desc"),
        "brand": field("brand"),
        "price": field("price"),
        "currency": None,
        "availability": field("availability"),
        "release_date": field("released"),
        "url": url,
    }
    return found if found["name"] else {}


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

    def __repr__(self) -> str:  # never the key
        return f"<StandIn {self.url if self._httpd else 'stopped'}>"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> StandIn:
        self._httpd = _Server((self.host, self._requested_port), self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="scraping-api-standin", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> StandIn:
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
                    self._rules = [dict(rule, used=0, seen=0) for rule in (value or [])]
                elif name == "expire_jobs":
                    self._expire_left = int(value or 0)
                elif name == "fail_jobs":
                    self._fail_left = int(value or 0)
                else:
                    self._config[name] = value

    def reset(self) -> None:
        with self._lock:
            self._config = {"async_jobs": False, "job_ready_polls": 1, "job_ttl": 3600.0, "delay_ms": 0, "block": []}
            self._rules: list[dict[str, Any]] = []
            self._expire_left = 0
            self._fail_left = 0
            self._jobs.clear()
            self._scrapes = 0
            self._counts: Counter[str] = Counter()
            self._targets: Counter[str] = Counter()
            self._hosts: Counter[str] = Counter()
            self._statuses: Counter[str] = Counter()
            self._inflight: Counter[str] = Counter()
            self._max_inflight: Counter[str] = Counter()
            self._unknown: Counter[str] = Counter()
            self._credits = 0.0

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "scrapes": self._scrapes,
                "polls": self._counts["polls"],
                "jobs": self._counts["jobs"],
                "expired": self._counts["expired"],
                "failed_jobs": self._counts["failed_jobs"],
                "bad_keys": self._counts["bad_keys"],
                "key_in_url": self._counts["key_in_url"],
                "credits": self._credits,
                "fetches": sum(self._targets.values()),
                "targets": dict(self._targets),
                "hosts": dict(self._hosts),
                "max_concurrent": dict(self._max_inflight),
                "statuses": dict(self._statuses),
                "unknown_fields": dict(self._unknown),
                "calls": {k[5:]: v for k, v in self._counts.items() if k.startswith("call:")},
            }

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _take_rule(self, provider: str, target: str) -> dict[str, Any] | None:
        with self._lock:
            self._scrapes += 1
            self._counts[f"call:{provider}"] += 1
            matching = [
                rule
                for rule in self._rules
                if rule.get("provider") in (None, provider) and str(rule.get("match") or "") in target
            ]
            for rule in matching:
                rule["seen"] += 1
            for rule in matching:
                count = int(rule.get("count", 1) or 0)
                if rule["seen"] > int(rule.get("after", 0) or 0) and (count == 0 or rule["used"] < count):
                    rule["used"] += 1
                    return rule
        return None

    def _blocked(self, target: str, render_js: bool) -> bool:
        return not render_js and any(str(m) in target for m in self._config.get("block") or [])

    # -- fetching the target ---------------------------------------------------------------

    def _fetch(
        self, target: str, method: str = "GET", headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> Fetched:
        parts = urlsplit(target)
        host = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        sent = {"User-Agent": "scraping-api-standin/2.0", STANDIN_HEADER: "1"}
        sent.update(headers or {})
        request = urllib.request.Request(target, method=method.upper(), headers=sent, data=body)
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
                    status, final_url, raw_headers, raw = (
                        response.status,
                        response.url,
                        response.headers,
                        response.read(),
                    )
            except urllib.error.HTTPError as exc:
                status, final_url, raw_headers, raw = exc.code, exc.url or target, exc.headers, exc.read()
            except (urllib.error.URLError, OSError) as exc:
                status, final_url, raw_headers, raw = 502, target, None, f"stand-in could not fetch: {exc}".encode()
        finally:
            with self._lock:
                self._inflight[host] -= 1
        with self._lock:
            self._statuses[str(status)] += 1
        pairs = [(k, v) for k, v in (raw_headers.items() if raw_headers is not None else [])]
        return Fetched(target, final_url, status, pairs, raw, int((time.monotonic() - started) * 1000))

    def _charge(self, amount: float) -> None:
        with self._lock:
            self._credits += amount

    # -- AlterLab ----------------------------------------------------------------------------

    def alterlab_scrape(self, api_key: str | None, payload: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        if api_key != self.key:
            self._count("bad_keys")
            return _alterlab_error(401, "UNAUTHORIZED", "Invalid or missing API key")
        if not isinstance(payload, dict) or not isinstance(payload.get("url"), str):
            return _alterlab_error(400, "INVALID_REQUEST", "body must be a JSON object with a url")
        with self._lock:
            for name in set(payload) - ALTERLAB_FIELDS:
                self._unknown[f"alterlab:{name}"] += 1
        target = payload["url"]
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or (parts.hostname or "") not in LOOPBACK:
            return _alterlab_error(400, "INVALID_URL", "the stand-in only fetches http(s) loopback targets")
        rule = self._take_rule("alterlab", target)
        if rule is not None:
            if rule.get("delay_ms"):
                time.sleep(float(rule["delay_ms"]) / 1000)
            if rule.get("status"):
                headers = {"Retry-After": str(rule["retry_after"])} if rule.get("retry_after") is not None else {}
                status = int(rule["status"])
                return (
                    *_alterlab_error(
                        status,
                        rule.get("error") or _ALTERLAB_CODES.get(status, f"HTTP_{status}"),
                        rule.get("message") or f"stand-in rule: {status}",
                    )[:2],
                    headers,
                )
        advanced = payload.get("advanced") or {}
        render_js = advanced.get("render_js") in (True, "true", "auto") or payload.get("mode") == "js"
        if self._blocked(target, render_js):
            return _alterlab_error(403, "BLOCKED_BY_ANTIBOT", "The target site blocked the request (refunded)")
        job_rule = (rule or {}).get("job")  # "failed" / "expired": this call becomes such a job
        if self._config.get("async_jobs") or payload.get("sync") is False or job_rule:
            job_id = uuid.uuid4().hex
            with self._lock:
                self._counts["jobs"] += 1
                expire = job_rule == "expired" or (not job_rule and self._expire_left > 0)
                self._expire_left -= 1 if expire and not job_rule else 0
                fail = job_rule == "failed" or (not job_rule and not expire and self._fail_left > 0)
                self._fail_left -= 1 if fail and not job_rule else 0
                self._jobs[job_id] = {
                    "created": time.monotonic(),
                    "result": None,
                    "error": None,
                    "polls": 0,
                    "expire": expire,
                    "fail": fail,
                }
            threading.Thread(target=self._run_job, args=(job_id, payload), daemon=True).start()
            return 202, {"job_id": job_id, "status": "pending"}, {}
        status, body = self._alterlab_result(payload)
        if status == 200:
            self._charge(body["billing"]["total_credits"])
        return status, body, {}

    def alterlab_job(self, api_key: str | None, job_id: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        if api_key != self.key:
            self._count("bad_keys")
            return _alterlab_error(401, "UNAUTHORIZED", "Invalid or missing API key")
        with self._lock:
            self._counts["polls"] += 1
            job = self._jobs.get(job_id)
            ttl = float(self._config.get("job_ttl") or 3600)
            if job is not None and (job["expire"] or time.monotonic() - job["created"] > ttl):
                del self._jobs[job_id]
                self._counts["expired"] += 1
                job = None
            if job is None:
                return _alterlab_error(404, "JOB_NOT_FOUND", "Job not found or expired")
            job["polls"] += 1
            done = job["result"] is not None or job["error"] is not None
            if not done or job["polls"] < int(self._config.get("job_ready_polls") or 1):
                return 200, {"job_id": job_id, "status": "running" if job["polls"] > 1 else "pending"}, {}
            if job["error"] is not None:
                self._counts["failed_jobs"] += 0 if job.get("reported") else 1
                job["reported"] = True
                return 200, {"job_id": job_id, "status": "failed", "error": job["error"]}, {}
            if not job.get("charged"):  # billed when its result is delivered, once
                job["charged"] = True
                self._credits += float(job["result"]["billing"]["total_credits"])
            return 200, {"job_id": job_id, "status": "completed", "result": job["result"]}, {}

    def _run_job(self, job_id: str, payload: dict[str, Any]) -> None:
        job = self._jobs.get(job_id) or {}
        if job.get("fail"):
            with self._lock:
                if job_id in self._jobs:
                    self._jobs[job_id]["error"] = "All scraping tiers failed (stand-in: failed job)"
            return
        status, result = self._alterlab_result(payload)
        with self._lock:
            if job_id in self._jobs:
                if status == 200:
                    self._jobs[job_id]["result"] = result
                else:
                    self._jobs[job_id]["error"] = result.get("message") or "job failed"

    def _alterlab_result(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        advanced = payload.get("advanced") or {}
        render_js = advanced.get("render_js") in (True, "true", "auto") or payload.get("mode") == "js"
        headers = {str(k): str(v) for k, v in (payload.get("headers") or {}).items()}
        cookies = advanced.get("cookies")
        if isinstance(cookies, dict) and cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        location = payload.get("location") or {}
        if location.get("country"):
            headers[COUNTRY_HEADER] = str(location["country"])
        if location.get("language"):
            headers["Accept-Language"] = str(location["language"])
        body = payload.get("body")
        if payload.get("content_type"):
            headers["Content-Type"] = str(payload["content_type"])
        timeout = float(payload.get("timeout") or 30)
        started = time.monotonic()
        fetched = self._fetch(
            payload["url"],
            str(payload.get("method") or "GET"),
            headers,
            body.encode("utf-8") if isinstance(body, str) else None,
        )
        if time.monotonic() - started > timeout:
            return _alterlab_error(504, "TIMEOUT", f"The page took longer than {timeout:g} s (refunded)")[:2]
        text = fetched.text()
        formats = payload.get("formats") or ["html"]
        rendered = {"html": text, "text": _strip_tags(text), "markdown": _strip_tags(text), "json": None}
        content: Any = rendered.get(formats[0], text) if len(formats) == 1 else {f: rendered.get(f) for f in formats}
        credits = ALTERLAB_PRICE["render_js" if render_js else "plain"]
        if advanced.get("use_proxy"):
            credits += ALTERLAB_PRICE["use_proxy"]
        result: dict[str, Any] = {
            "url": payload["url"],
            "final_url": fetched.final_url,
            "status_code": fetched.status,
            "content": content,
            "headers": fetched.header_map(),
            "cached": False,
            "credits_used": credits,
            "billing": {"total_credits": credits, "tier_used": "4" if render_js else "1"},
            "response_time_ms": fetched.millis,
            "size_bytes": len(fetched.raw),
        }
        if payload.get("include_raw_html"):
            result["raw_html"] = text
        if any(payload.get(k) for k in ("extraction_schema", "extraction_prompt", "extraction_profile")):
            extracted = extract_product(text, fetched.final_url)
            schema = payload.get("extraction_schema")
            if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
                aliases = {"title": "name", "released_at": "release_date"}
                extracted = (
                    {k: extracted.get(k, extracted.get(aliases.get(k, k))) for k in schema["properties"]}
                    if extracted
                    else {}
                )
            result["extraction_result"] = extracted
        return 200, result

    # -- ScrapingBee -------------------------------------------------------------------------

    def scrapingbee(
        self, authorization: str | None, query: str, method: str, body: bytes | None, forwarded: dict[str, str]
    ) -> tuple[int, bytes, list[tuple[str, str]]]:
        params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        if "api_key" in params:
            self._count("key_in_url")
        token = (authorization or "").removeprefix("Bearer ").strip() or params.get("api_key")
        if token != self.key:
            self._count("bad_keys")
            return _json_answer(401, {"message": "Invalid api key: ..."})
        target = params.get("url") or ""
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or (parts.hostname or "") not in LOOPBACK:
            return _json_answer(400, {"message": "the stand-in only fetches http(s) loopback targets"})
        rule = self._take_rule("scrapingbee", target)
        if rule is not None:
            if rule.get("delay_ms"):
                time.sleep(float(rule["delay_ms"]) / 1000)
            if rule.get("status"):
                status = int(rule["status"])
                message = rule.get("message") or (
                    "Monthly API calls limit reached: 1000"
                    if rule.get("error") == "no_credits"
                    else f"stand-in rule: {status}"
                )
                status_, out, headers = _json_answer(status, {"message": message})
                if rule.get("retry_after") is not None:
                    headers.append(("Retry-After", str(rule["retry_after"])))
                return status_, out, headers
        render_js = params.get("render_js", "true") == "true"  # ScrapingBee renders by default
        premium = params.get("premium_proxy") == "true"
        cost = SCRAPINGBEE_PRICE[
            "premium_proxy_js"
            if premium and render_js
            else "premium_proxy"
            if premium
            else "render_js"
            if render_js
            else "plain"
        ]
        headers = {k[4:]: v for k, v in forwarded.items() if params.get("forward_headers") == "true"}
        fetched = self._fetch(target, method, headers, body)
        self._charge(cost)
        out = [("Content-Type", fetched.header("Content-Type") or "text/html")]
        out += [
            (f"Spb-{k}", v)
            for k, v in fetched.headers
            if k.lower() not in ("content-length", "transfer-encoding", "connection")
        ]
        out += [
            ("Spb-Cost", str(cost)),
            ("Spb-Resolved-Url", fetched.final_url),
            ("Spb-Initial-Status-Code", str(fetched.status)),
        ]
        status = fetched.status if params.get("transparent_status_code") == "true" else 200
        return status, fetched.raw, out

    # -- Zyte API ----------------------------------------------------------------------------

    def zyte_extract(self, authorization: str | None, payload: Any) -> tuple[int, bytes, list[tuple[str, str]]]:
        try:
            user = base64.b64decode((authorization or "").removeprefix("Basic ").strip()).decode().split(":", 1)[0]
        except (ValueError, UnicodeDecodeError):
            user = ""
        if user != self.key:
            self._count("bad_keys")
            return _zyte_error(401, "/auth/key-not-found", "Authentication Key Not Found")
        if not isinstance(payload, dict) or not isinstance(payload.get("url"), str):
            return _zyte_error(400, "/request/invalid", "Invalid request body")
        target = payload["url"]
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or (parts.hostname or "") not in LOOPBACK:
            return _zyte_error(400, "/request/invalid", "the stand-in only fetches http(s) loopback targets")
        browser = bool(payload.get("browserHtml"))
        if browser and (
            payload.get("httpRequestMethod")
            or payload.get("httpRequestBody")
            or payload.get("customHttpRequestHeaders")
        ):
            return _zyte_error(
                400,
                "/request/unprocessable",
                "browserHtml requests accept no httpRequestMethod, httpRequestBody or customHttpRequestHeaders",
            )
        rule = self._take_rule("zyte", target)
        if rule is not None:
            if rule.get("delay_ms"):
                time.sleep(float(rule["delay_ms"]) / 1000)
            if rule.get("status"):
                status = int(rule["status"])
                kind = {
                    429: "/limits/over-user-limit",
                    503: "/limits/over-global-limit",
                    520: "/download/temporary-error",
                    521: "/download/permanent-error",
                }.get(status, "/error")
                status_, out, headers = _zyte_error(status, kind, rule.get("message") or f"stand-in rule: {status}")
                if rule.get("retry_after") is not None:
                    headers.append(("Retry-After", str(rule["retry_after"])))
                return status_, out, headers
        headers = {
            str(h["name"]): str(h["value"])
            for h in payload.get("customHttpRequestHeaders") or []
            if isinstance(h, dict)
        }
        headers.update({str(k).title(): str(v) for k, v in (payload.get("requestHeaders") or {}).items()})
        if payload.get("geolocation"):
            headers[COUNTRY_HEADER] = str(payload["geolocation"])
        body = payload.get("httpRequestBody")
        fetched = self._fetch(
            target, str(payload.get("httpRequestMethod") or "GET"), headers, base64.b64decode(body) if body else None
        )
        self._charge(1)
        answer: dict[str, Any] = {"url": fetched.final_url, "statusCode": fetched.status}
        if payload.get("httpResponseHeaders"):
            answer["httpResponseHeaders"] = [{"name": k, "value": v} for k, v in fetched.headers]
        if browser:
            answer["browserHtml"] = fetched.text()
        else:
            answer["httpResponseBody"] = base64.b64encode(fetched.raw).decode("ascii")
        return _json_answer(200, answer)


_ALTERLAB_CODES = {
    400: "INVALID_REQUEST",
    401: "UNAUTHORIZED",
    402: "INSUFFICIENT_CREDITS",
    403: "BLOCKED_BY_ANTIBOT",
    404: "NOT_FOUND",
    422: "ALL_TIERS_FAILED",
    429: "RATE_LIMITED",
    500: "INTERNAL_ERROR",
    502: "BAD_GATEWAY",
    503: "SERVICE_UNAVAILABLE",
    504: "GATEWAY_TIMEOUT",
}


def _alterlab_error(status: int, code: str, message: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    return status, {"error": code, "message": message, "details": {}}, {}


def _json_answer(status: int, payload: Any) -> tuple[int, bytes, list[tuple[str, str]]]:
    return status, json.dumps(payload).encode("utf-8"), [("Content-Type", "application/json")]


def _zyte_error(status: int, kind: str, title: str) -> tuple[int, bytes, list[tuple[str, str]]]:
    return (
        status,
        json.dumps({"type": kind, "title": title, "status": status, "detail": title}).encode(),
        [("Content-Type", "application/problem+json")],
    )


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

    def _send_raw(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self._send_raw(
            status,
            json.dumps(payload).encode("utf-8"),
            [("Content-Type", "application/json"), *(headers or {}).items()],
        )

    def _raw_body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            return None
        return self.rfile.read(length) if length else b""

    def _payload(self) -> Any:
        raw = self._raw_body()
        try:
            return json.loads(raw or b"null") if raw is not None else None
        except ValueError:
            return None

    def _forwarded(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if k.lower().startswith("spb-")}

    def do_POST(self) -> None:  # noqa: N802
        api = self.server.api
        parts = urlsplit(self.path)
        if parts.path == "/api/v1/scrape":
            self._send(*api.alterlab_scrape(self.headers.get("X-API-Key"), self._payload()))
        elif parts.path == "/v1/extract":
            self._send_raw(*api.zyte_extract(self.headers.get("Authorization"), self._payload()))
        elif parts.path == "/api/v1/":
            self._send_raw(
                *api.scrapingbee(
                    self.headers.get("Authorization"), parts.query, "POST", self._raw_body(), self._forwarded()
                )
            )
        elif parts.path == "/_admin/config":
            payload = self._payload()
            if not isinstance(payload, dict):
                self._send(422, {"error": "INVALID_REQUEST", "message": "expected a JSON object"})
                return
            api.configure(**payload)
            self._send(200, {"ok": True})
        elif parts.path == "/_admin/reset":
            api.reset()
            self._send(200, {"ok": True})
        else:
            self._send(404, {"error": "NOT_FOUND", "message": "Not found", "details": {}})

    def do_GET(self) -> None:  # noqa: N802
        api = self.server.api
        parts = urlsplit(self.path)
        if parts.path.startswith("/api/v1/jobs/"):
            self._send(*api.alterlab_job(self.headers.get("X-API-Key"), parts.path.rsplit("/", 1)[-1]))
        elif parts.path == "/api/v1/":
            self._send_raw(
                *api.scrapingbee(self.headers.get("Authorization"), parts.query, "GET", None, self._forwarded())
            )
        elif parts.path == "/_admin/stats":
            self._send(200, api.stats())
        else:
            self._send(404, {"error": "NOT_FOUND", "message": "Not found", "details": {}})


def _rule(text: str) -> dict[str, Any]:
    """``STATUS[xCOUNT][@AFTER]``, e.g. ``429x3`` or ``402@10`` (COUNT 0 = every request)."""
    head, _, after = text.partition("@")
    status, _, count = head.partition("x")
    return {"status": int(status), "count": int(count or 1), "after": int(after or 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scraper.scraping_api.standin", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--delay-ms", type=int, default=0, help="hold every target fetch this long")
    parser.add_argument("--async-jobs", action="store_true", help="answer 202 + job_id, to be polled")
    parser.add_argument("--job-ready-polls", type=int, default=1)
    parser.add_argument("--expire-jobs", type=int, default=0, help="the first poll of N jobs answers 404")
    parser.add_argument("--fail-jobs", type=int, default=0, help="N jobs end failed")
    parser.add_argument("--job-ttl", type=float, default=3600.0)
    parser.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="STATUS[xCOUNT][@AFTER]",
        help="answer STATUS to COUNT scrape requests (0: all) after AFTER of them",
    )
    parser.add_argument("--retry-after", type=float, default=None, help="Retry-After sent with --fail answers")
    args = parser.parse_args(argv)
    # The key comes from the environment only (a command line is visible to every user in ps);
    # the crawl's own variable as a fallback: one key in .env serves both sides in docker compose.
    key = os.environ.get("SCRAPING_API_STANDIN_KEY") or os.environ.get("SCRAPING_API_KEY")
    if not key:
        parser.error("set the key to accept in SCRAPING_API_STANDIN_KEY (or SCRAPING_API_KEY)")
    rules = [_rule(r) for r in args.fail]
    for rule in rules:
        if args.retry_after is not None:
            rule["retry_after"] = args.retry_after
    api = StandIn(
        key,
        host=args.host,
        port=args.port,
        delay_ms=args.delay_ms,
        async_jobs=args.async_jobs,
        job_ready_polls=args.job_ready_polls,
        expire_jobs=args.expire_jobs,
        fail_jobs=args.fail_jobs,
        job_ttl=args.job_ttl,
        rules=rules,
    )
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
