"""Scraping-API providers behind one small interface.

A provider knows one API's wire format and nothing about Scrapy's engine:

* ``build_request(target, options)`` -> :class:`ApiCall` (url, method, headers, body) that makes
  the API fetch ``target``;
* ``parse_response(status, headers, body)`` -> a :class:`Result` (the target's page), a
  :class:`Job` (accepted, poll later), :class:`Expired` (a job the API no longer has) or an
  :class:`ApiError`;
* ``poll_request(job_id)`` -> the :class:`ApiCall` that asks for a job's result.

The key is only ever put into the headers (or, for ScrapingBee whose API has no other way, the
query string) of the :class:`ApiCall`; it is never part of a result, an error or a message.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from datetime import datetime, timezone
from typing import Any, Mapping
from urllib.parse import urlencode

from ..secrets import redact

# Headers of the target's response that describe the API's transfer, not the page: the body we
# hand on is already decoded and re-encoded, so these would lie about it.
HOP_HEADERS = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"}
)


@dataclass(frozen=True)
class Target:
    """What the spider asked for."""

    url: str
    method: str = "GET"
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class ApiCall:
    url: str
    method: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class Result:
    """The target's answer as the API saw it."""

    url: str
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    credits: float = 0.0


@dataclass(frozen=True)
class Job:
    job_id: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Expired:
    job_id: str


@dataclass(frozen=True)
class ApiError:
    status: int
    detail: str
    retry_after: float | None = None

    @property
    def retryable(self) -> bool:
        return self.status in (408, 429) or self.status >= 500


Outcome = Result | Job | Expired | ApiError


def retry_after_seconds(value: Any) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; None when absent or malformed."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    text = str(value).strip()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _detail(body: bytes, status: int) -> str:
    data = _json(body)
    if isinstance(data, dict):
        detail = data.get("detail") or data.get("message") or data.get("error") or data.get("title")
        if detail is not None:
            return redact(str(detail if isinstance(detail, str) else json.dumps(detail))[:500])
    text = body[:200].decode("utf-8", "replace").strip()
    return redact(text) or f"HTTP {status}"


def _header(headers: Mapping[Any, Any], name: str) -> Any:
    """One header from Scrapy's ``Headers`` or a plain dict, case-insensitively."""
    getter = getattr(headers, "get", None)
    if getter is not None:
        value = getter(name)
        if value is None and isinstance(headers, dict):
            value = next((v for k, v in headers.items() if str(k).lower() == name.lower()), None)
        if isinstance(value, list):
            value = value[0] if value else None
        return value
    return None


def _pairs(raw: Any) -> list[tuple[str, str]]:
    """Headers given as a dict (values str or list) or a list of pairs/{name, value} dicts."""
    pairs: list[tuple[str, str]] = []
    if isinstance(raw, dict):
        for k, v in raw.items():
            for one in v if isinstance(v, list) else [v]:
                pairs.append((str(k), str(one)))
    elif isinstance(raw, list):
        for entry in raw:
            if isinstance(entry, dict) and "name" in entry:
                pairs.append((str(entry["name"]), str(entry.get("value", ""))))
            elif isinstance(entry, (list, tuple)) and len(entry) == 2:
                pairs.append((str(entry[0]), str(entry[1])))
    return [(k, v) for k, v in pairs if k.lower() not in HOP_HEADERS]


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)


def text_to_body(content: str, headers: list[tuple[str, str]]) -> tuple[bytes, list[tuple[str, str]]]:
    """Encode text content as UTF-8 and make the Content-Type say so."""
    out: list[tuple[str, str]] = []
    seen = False
    for k, v in headers:
        if k.lower() == "content-type":
            seen = True
            params = [p.strip() for p in v.split(";")]
            params = [p for p in params[1:] if not p.lower().startswith("charset=")]
            v = "; ".join([v.split(";")[0].strip(), *params, "charset=utf-8"])
        out.append((k, v))
    if not seen:
        out.append(("Content-Type", "text/html; charset=utf-8"))
    return content.encode("utf-8"), out


class Provider:
    name = "base"
    default_url = ""
    #: Credits one page costs when the API does not say, and the estimate the budget reserves.
    base_cost = 1.0
    render_cost = 5.0

    def __init__(self, key: str, base_url: str | None = None) -> None:
        self._key = key
        self.base_url = (base_url or self.default_url).rstrip("/")

    def __repr__(self) -> str:  # never the key
        return f"<{type(self).__name__} {self.base_url}>"

    def estimate(self, options: Mapping[str, Any]) -> float:
        return self.render_cost if _as_bool(options.get("render_js")) else self.base_cost

    def build_request(self, target: Target, options: Mapping[str, Any]) -> ApiCall:
        raise NotImplementedError

    def parse_response(self, status: int, headers: Mapping[Any, Any], body: bytes) -> Outcome:
        raise NotImplementedError

    def poll_request(self, job_id: str) -> ApiCall:
        raise NotImplementedError(f"{self.name} has no asynchronous jobs")

    def parse_poll(self, status: int, headers: Mapping[Any, Any], body: bytes, job_id: str) -> Outcome:
        return self.parse_response(status, headers, body)

    def _error(self, status: int, headers: Mapping[Any, Any], body: bytes) -> ApiError:
        return ApiError(status, _detail(body, status), retry_after_seconds(_header(headers, "Retry-After")))


class AlterLab(Provider):
    """``POST /api/v1/scrape`` with ``X-API-Key``; ``202 + job_id`` polled at ``/api/v1/jobs/{id}``."""

    name = "alterlab"
    default_url = "https://api.alterlab.io"
    # Options passed through to the top level of the request body, and into ``advanced``.
    TOP_LEVEL = ("mode", "formats", "timeout", "cache", "cache_ttl", "max_response_bytes", "wait_for",
                 "location", "cost_controls", "include_raw_html", "sync", "screenshot")
    ADVANCED = ("render_js", "use_proxy", "proxy_country", "wait_condition", "scroll_to_load",
                "session_id", "cookies", "actions")

    def build_request(self, target: Target, options: Mapping[str, Any]) -> ApiCall:
        body: dict[str, Any] = {"url": target.url, "mode": options.get("mode", "auto"), "formats": ["html"]}
        for name in self.TOP_LEVEL:
            if name in options and options[name] is not None:
                body[name] = options[name]
        advanced = {name: options[name] for name in self.ADVANCED if options.get(name) is not None}
        if options.get("country") and "proxy_country" not in advanced:
            advanced["proxy_country"] = options["country"]
            advanced.setdefault("use_proxy", True)
        advanced.update(options.get("advanced") or {})
        if advanced:
            body["advanced"] = advanced
        if target.method.upper() != "GET":
            body["method"] = target.method.upper()
            if target.body:
                body["body"] = target.body.decode("utf-8", "replace")
        if target.headers:
            body["headers"] = dict(target.headers)
        return ApiCall(
            f"{self.base_url}/api/v1/scrape",
            "POST",
            {"X-API-Key": self._key, "Content-Type": "application/json", "Accept": "application/json"},
            json.dumps(body).encode("utf-8"),
        )

    def poll_request(self, job_id: str) -> ApiCall:
        return ApiCall(f"{self.base_url}/api/v1/jobs/{job_id}", "GET",
                       {"X-API-Key": self._key, "Accept": "application/json"})

    def parse_response(self, status: int, headers: Mapping[Any, Any], body: bytes) -> Outcome:
        data = _json(body)
        if status == 202 and isinstance(data, dict) and data.get("job_id"):
            return Job(str(data["job_id"]), retry_after_seconds(_header(headers, "Retry-After")))
        if status == 200 and isinstance(data, dict):
            return self._result(data, status, headers, body)
        return self._error(status, headers, body)

    def parse_poll(self, status: int, headers: Mapping[Any, Any], body: bytes, job_id: str) -> Outcome:
        if status == 404:
            return Expired(job_id)
        data = _json(body)
        if status in (200, 202) and isinstance(data, dict):
            state = str(data.get("status", "")).lower()
            if state in {"failed", "error"}:
                return ApiError(502, redact(str(data.get("error") or data.get("detail") or "job failed")[:500]))
            result = data.get("result")
            if isinstance(result, dict):
                return self._result(result, status, headers, body)
            if "status_code" in data and "content" in data:
                return self._result(data, status, headers, body)
            return Job(job_id, retry_after_seconds(_header(headers, "Retry-After")))
        return self._error(status, headers, body)

    def _result(self, data: dict[str, Any], status: int, headers: Mapping[Any, Any], body: bytes) -> Outcome:
        if "status_code" not in data:
            return ApiError(502, "the API answered 200 without a status_code")
        content = data.get("content")
        if isinstance(content, dict):  # several formats asked for: take the page itself
            content = content.get("html") or content.get("raw_html") or content.get("content") or ""
        if data.get("raw_html") and not content:
            content = data["raw_html"]
        page_body, page_headers = text_to_body(str(content or ""), _pairs(data.get("headers") or {}))
        credits = data.get("credits_used")
        if credits is None and isinstance(data.get("billing"), dict):
            credits = data["billing"].get("credits_used") or data["billing"].get("total_credits")
        return Result(
            url=str(data.get("url") or ""),
            status=int(data["status_code"]),
            headers=page_headers,
            body=page_body,
            credits=float(credits or 0),
        )


class ScrapingBee(Provider):
    """``GET /api/v1/?api_key=...&url=...``; the target's status is passed through
    (``transparent_status_code``), its headers come back prefixed ``Spb-``, the cost in ``Spb-Cost``.

    ScrapingBee takes the key only in the query string, so the API request's URL holds it: that
    request is built and sent inside the middleware, never queued, and the key is registered for
    log redaction like any other secret.
    """

    name = "scrapingbee"
    default_url = "https://app.scrapingbee.com"
    PASS = ("wait", "wait_for", "block_resources", "premium_proxy", "stealth_proxy", "session_id",
            "device", "window_width", "window_height", "js_scenario")

    def build_request(self, target: Target, options: Mapping[str, Any]) -> ApiCall:
        params: dict[str, Any] = {"api_key": self._key, "url": target.url, "transparent_status_code": "true"}
        params["render_js"] = "true" if _as_bool(options.get("render_js")) else "false"
        country = options.get("country") or options.get("proxy_country")
        if country:
            params["country_code"] = str(country).lower()
            params.setdefault("premium_proxy", "true")
        for name in self.PASS:
            if options.get(name) is not None:
                value = options[name]
                if isinstance(value, (dict, list)):
                    value = json.dumps(value)
                elif isinstance(value, bool):
                    value = str(value).lower()
                params[name] = value
        headers: dict[str, str] = {}
        if target.headers:
            params["forward_headers"] = "true"
            headers.update({f"Spb-{k}": v for k, v in target.headers.items()})
        return ApiCall(f"{self.base_url}/api/v1/?{urlencode(params)}", target.method.upper(), headers, target.body)

    def parse_response(self, status: int, headers: Mapping[Any, Any], body: bytes) -> Outcome:
        cost = _header(headers, "Spb-Cost")
        resolved = _header(headers, "Spb-Resolved-Url")
        if cost is None and resolved is None:  # not a page: the API's own answer
            return self._error(status, headers, body)
        page_headers: list[tuple[str, str]] = []
        items = headers.items() if hasattr(headers, "items") else []
        for k, values in items:
            k = k.decode("latin-1") if isinstance(k, bytes) else str(k)
            for v in values if isinstance(values, list) else [values]:
                v = v.decode("latin-1") if isinstance(v, bytes) else str(v)
                if k.lower().startswith("spb-") and k.lower() not in {"spb-cost", "spb-resolved-url",
                                                                         "spb-initial-status-code"}:
                    page_headers.append((k[4:], v))
                elif k.lower() == "content-type":
                    page_headers.append((k, v))
        page_headers = [(k, v) for k, v in page_headers if k.lower() not in HOP_HEADERS]
        if isinstance(resolved, bytes):
            resolved = resolved.decode("latin-1")
        return Result(url=str(resolved or ""), status=status, headers=page_headers, body=body,
                      credits=float(retry_after_seconds(cost) or 0))


class Zyte(Provider):
    """Zyte API: ``POST /v1/extract`` with HTTP basic auth (key as user name), base64 bodies."""

    name = "zyte"
    default_url = "https://api.zyte.com"
    base_cost = 1.0
    render_cost = 1.0  # Zyte bills per request type in money, not credits; count requests

    def build_request(self, target: Target, options: Mapping[str, Any]) -> ApiCall:
        body: dict[str, Any] = {"url": target.url}
        if _as_bool(options.get("render_js")):
            body["browserHtml"] = True
        else:
            body["httpResponseBody"] = True
        body["httpResponseHeaders"] = True
        country = options.get("country") or options.get("proxy_country")
        if country:
            body["geolocation"] = str(country).upper()
        if target.method.upper() != "GET":
            body["httpRequestMethod"] = target.method.upper()
            if target.body:
                body["httpRequestBody"] = base64.b64encode(target.body).decode("ascii")
        if target.headers:
            body["customHttpRequestHeaders"] = [{"name": k, "value": v} for k, v in target.headers.items()]
        body.update(options.get("zyte") or {})
        auth = base64.b64encode(f"{self._key}:".encode()).decode("ascii")
        return ApiCall(f"{self.base_url}/v1/extract", "POST",
                       {"Authorization": f"Basic {auth}", "Content-Type": "application/json"},
                       json.dumps(body).encode("utf-8"))

    def parse_response(self, status: int, headers: Mapping[Any, Any], body: bytes) -> Outcome:
        data = _json(body)
        if status == 200 and isinstance(data, dict) and "statusCode" in data:
            page_headers = _pairs(data.get("httpResponseHeaders") or [])
            if "browserHtml" in data:
                page_body, page_headers = text_to_body(str(data["browserHtml"]), page_headers)
            else:
                page_body = base64.b64decode(data.get("httpResponseBody") or "")
            return Result(url=str(data.get("url") or ""), status=int(data["statusCode"]),
                          headers=page_headers, body=page_body, credits=self.base_cost)
        # Zyte reports a ban or a failed download of the target as 520/521: retryable.
        return self._error(status, headers, body)


PROVIDERS: dict[str, type[Provider]] = {p.name: p for p in (AlterLab, ScrapingBee, Zyte)}
