"""Scraping-API providers behind one small interface.

A provider knows one API's wire format and its documented semantics, and nothing about
Scrapy's engine:

* ``check_options(options)`` raises :class:`OptionError` for an option name it does not know,
  so a typo fails at start instead of being dropped;
* ``build_request(target, options, timeout)`` -> :class:`ApiCall` (url, method, headers, body)
  that makes the API fetch ``target``;
* ``parse_response(status, headers, body)`` -> a :class:`Result` (the target's page), a
  :class:`Job` (accepted, poll later), :class:`Expired` / :class:`Failed` (a job to submit
  again) or an :class:`ApiError` that says what to do (``kind``);
* ``poll_request(job_id)`` -> the :class:`ApiCall` that asks for a job's result.

The key is only ever put into the headers of an :class:`ApiCall`, never into its URL, a result,
an error or a message. An :class:`ApiCall` is sent by the middleware's private client and is
never a Scrapy request.
"""

from __future__ import annotations

import base64
import difflib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlencode

from ..runtime.secrets import redact

# Headers of the target's response that describe the API's transfer, not the page: the body we
# hand on is already decoded (and, for text, re-encoded), so these would lie about it.
HOP_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"})

# What the middleware does with an error (``ApiError.kind``):
AUTH = "auth"  # the key is refused: stop the crawl, keep the queue
CREDITS = "credits"  # the account has no credits left: stop the crawl, keep the queue
BLOCKED = "blocked"  # the target blocked the API: retry with escalated options, then dead letter
RETRY = "retry"  # transient (rate limit, 5xx, network): back off and retry, then dead letter
THROTTLED = "throttled"  # retry, waiting as long as the provider's own client does
FATAL = "fatal"  # retrying cannot help (bad request, paywall, billed timeout): dead letter now
KINDS = (AUTH, CREDITS, BLOCKED, RETRY, THROTTLED, FATAL)

# Options every provider understands; the middleware maps them onto each API's own names.
COMMON_OPTIONS = frozenset({"render_js", "country", "headers", "forward_headers", "timeout"})


class OptionError(ValueError):
    """An option the provider does not know, or a combination it cannot send."""


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

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"<ApiCall {self.method} {self.url}>"


@dataclass(frozen=True)
class Result:
    """The target's answer as the API saw it. ``url`` is where the target ended (redirects)."""

    url: str
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    credits: float = 0.0
    #: True when the API handed the page over as text it decoded itself (not the raw bytes).
    decoded: bool = False
    #: Structured data the API extracted from the page (AlterLab's ``extraction_result``).
    extraction: Any = None


@dataclass(frozen=True)
class Job:
    job_id: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Expired:
    job_id: str


@dataclass(frozen=True)
class Failed:
    """A job the API gave up on: final, submit it again rather than poll it."""

    job_id: str
    detail: str
    code: str = "job_failed"


@dataclass(frozen=True)
class ApiError:
    status: int
    detail: str
    retry_after: float | None = None
    code: str = ""
    kind: str = RETRY

    @property
    def retryable(self) -> bool:
        return self.kind in (RETRY, THROTTLED, BLOCKED)

    @property
    def reason(self) -> str:
        """The dead-letter reason: ``api:<status>:<code>``."""
        return f"api:{self.status}:{self.code or 'error'}"


Outcome = Result | Job | Expired | Failed | ApiError


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
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _error_fields(body: bytes, status: int) -> tuple[str, str]:
    """(code, message) of an API error body: ``{error, message, details}`` as documented, or
    the ``{detail}`` / ``{message}`` shapes older endpoints and gateways answer with."""
    data = _json(body)
    code, message = "", ""
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):  # {"error": {"code": ..., "message": ...}}
            code = str(err.get("code") or err.get("type") or "")
            message = str(err.get("message") or "")
        elif isinstance(err, str):
            code = err
        message = message or str(data.get("message") or data.get("detail") or data.get("title") or "")
        if not isinstance(data.get("detail"), (str, type(None))) and not message:
            message = json.dumps(data["detail"])
        if not code and isinstance(data.get("type"), str):  # Zyte: "/limits/over-user-limit"
            code = data["type"].rstrip("/").rsplit("/", 1)[-1]
    if not message:
        message = body[:200].decode("utf-8", "replace").strip() or f"HTTP {status}"
    code = "".join(c if c.isalnum() or c in "_-" else "_" for c in code)[:60]
    return code, redact(message[:500])


def _header(headers: Mapping[Any, Any], name: str) -> Any:
    """One header from Scrapy's ``Headers``, a multidict or a plain dict, case-insensitively."""
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    value = getter(name)
    if value is None and isinstance(headers, dict):
        value = next((v for k, v in headers.items() if str(k).lower() == name.lower()), None)
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value


def _header_items(headers: Any) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    items = headers.items() if hasattr(headers, "items") else []
    for k, values in items:
        k = k.decode("latin-1") if isinstance(k, bytes) else str(k)
        for v in values if isinstance(values, list) else [values]:
            pairs.append((k, v.decode("latin-1") if isinstance(v, bytes) else str(v)))
    return pairs


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
    """Encode text content as UTF-8 and make the Content-Type say so (the page's own ``<meta
    charset>`` no longer applies: the API already decoded it)."""
    out: list[tuple[str, str]] = []
    seen = False
    for k, v in headers:
        if k.lower() == "content-type":
            seen = True
            params = [p.strip() for p in v.split(";")]
            params = [p for p in params[1:] if p and not p.lower().startswith("charset=")]
            v = "; ".join([v.split(";")[0].strip(), *params, "charset=utf-8"])
        out.append((k, v))
    if not seen:
        out.append(("Content-Type", "text/html; charset=utf-8"))
    return content.encode("utf-8"), out


class Provider:
    name = "base"
    default_url = ""
    #: What ``credits`` count: the provider's own billing unit (budget and stats use it too).
    unit = "credits"
    #: The reservation the budget makes before the API has said what a page costs.
    base_cost = 1.0
    render_cost = 5.0
    #: Option names this provider passes through, beyond :data:`COMMON_OPTIONS`.
    OPTIONS: frozenset[str] = frozenset()

    def __init__(self, key: str, base_url: str | None = None) -> None:
        self._key = key
        self.base_url = (base_url or self.default_url).rstrip("/")

    def __repr__(self) -> str:  # never the key
        return f"<{type(self).__name__} {self.base_url}>"

    def check_options(self, options: Mapping[str, Any]) -> None:
        known = COMMON_OPTIONS | self.OPTIONS
        unknown = sorted(set(options) - known)
        if unknown:
            hints = [
                f"{name} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(name, known, 1)) else name
                for name in unknown
            ]
            raise OptionError(f"unknown {self.name} option(s) {', '.join(hints)}; known: {', '.join(sorted(known))}")

    def estimate(self, options: Mapping[str, Any]) -> float:
        return self.render_cost if _as_bool(options.get("render_js")) else self.base_cost

    def build_request(self, target: Target, options: Mapping[str, Any], timeout: float) -> ApiCall:
        raise NotImplementedError

    def parse_response(self, status: int, headers: Mapping[Any, Any], body: bytes) -> Outcome:
        raise NotImplementedError

    def poll_request(self, job_id: str) -> ApiCall:
        raise NotImplementedError(f"{self.name} has no asynchronous jobs")

    def parse_poll(self, status: int, headers: Mapping[Any, Any], body: bytes, job_id: str) -> Outcome:
        return self.parse_response(status, headers, body)

    def retry_delay(self, error: ApiError, retries: int, backoff: float) -> float:
        """Seconds before retry number ``retries + 1`` (before ``Retry-After`` is applied)."""
        return backoff * (2**retries) * (0.5 + random.random() / 2)

    def max_attempts(self, error: ApiError) -> int | None:
        """A provider's own cap on attempts for this error, or None for SCRAPING_API_MAX_RETRIES."""
        return None

    def _error(self, status: int, headers: Mapping[Any, Any], body: bytes, kind: str | None = None) -> ApiError:
        code, message = _error_fields(body, status)
        if kind is None:
            kind = RETRY if status in (408, 429) or status >= 500 else FATAL
        return ApiError(status, message, retry_after_seconds(_header(headers, "Retry-After")), code, kind)


class AlterLab(Provider):
    """``POST /api/v1/scrape`` with ``X-API-Key``; ``202 + job_id`` polled at ``/api/v1/jobs/{id}``.

    Semantics from AlterLab's error-code reference and its official SDK: 401 is a refused key;
    402 is either an empty balance or a paywall on the target; 403 means the *target* blocked
    the request (refunded, worth retrying with a stronger setup); 422 means every tier failed;
    504 ``TIMEOUT`` is refunded and retried, any other 504 may have been billed and is not.
    The cost is ``billing.total_credits``, in microcents (the SDK's ``BillingDetails``).
    """

    name = "alterlab"
    default_url = "https://api.alterlab.io"
    unit = "microcents"
    base_cost = 200.0
    render_cost = 1000.0
    # Top-level body fields of POST /api/v1/scrape (the SDK's ``scrape()`` arguments).
    TOP_LEVEL = frozenset(
        {
            "mode",
            "sync",
            "force_refresh",
            "include_raw_html",
            "formats",
            "extraction_schema",
            "extraction_prompt",
            "extraction_profile",
            "evidence",
            "promote_schema_org",
            "wait_for",
            "screenshot",
            "wait_until",
            "pdf_format",
            "ocr_language",
            "location",
            "content_type",
            "cache",
            "cache_ttl",
            "webhook_url",
            "max_response_bytes",
            "cost_controls",
        }
    )
    # Fields of the ``advanced`` object (the SDK's ``AdvancedOptions``, plus session/cookies).
    ADVANCED = frozenset(
        {
            "use_proxy",
            "proxy_country",
            "markdown",
            "generate_pdf",
            "ocr",
            "use_own_proxy",
            "use_system_proxy",
            "proxy_integration_id",
            "remove_cookie_banners",
            "wait_condition",
            "scroll_to_load",
            "scroll_count",
            "include_iframes",
            "flatten_shadow_dom",
            "session_headers",
            "section_filter",
            "session_id",
            "cookies",
            "actions",
        }
    )
    OPTIONS = TOP_LEVEL | ADVANCED | {"advanced"}
    # 504s the error reference marks as refunded: safe to retry.
    REFUNDED_504 = frozenset({"TIMEOUT", "TARGET_TIMEOUT", "SCRAPE_TIMEOUT"})

    def build_request(self, target: Target, options: Mapping[str, Any], timeout: float) -> ApiCall:
        body: dict[str, Any] = {
            "url": target.url,
            "mode": "auto",
            "sync": True,
            "formats": ["html"],
            "timeout": max(1, int(timeout)),
        }
        for name in self.TOP_LEVEL:
            if options.get(name) is not None:
                body[name] = options[name]
        if options.get("timeout") is not None:  # the spider's own server-side timeout, capped
            body["timeout"] = max(1, min(int(float(options["timeout"])), int(timeout)))
        advanced = {name: options[name] for name in self.ADVANCED if options.get(name) is not None}
        if options.get("render_js") is not None:
            advanced["render_js"] = (
                options["render_js"] if options["render_js"] == "auto" else _as_bool(options["render_js"])
            )
        advanced.update(options.get("advanced") or {})
        if advanced:
            body["advanced"] = advanced
        if options.get("country"):  # the documented geo option, not proxy_country + use_proxy
            body["location"] = {"country": str(options["country"]).upper(), **(options.get("location") or {})}
        if target.method.upper() != "GET":
            body["method"] = target.method.upper()
            if target.body:
                body["body"] = target.body.decode("utf-8", "replace")
        headers = dict(target.headers)
        content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), None)
        if content_type and "content_type" not in body and body.get("method"):
            body["content_type"] = content_type.split(";")[0].strip()
        if headers:
            body["headers"] = headers
        return ApiCall(
            f"{self.base_url}/api/v1/scrape",
            "POST",
            {"X-API-Key": self._key, "Content-Type": "application/json", "Accept": "application/json"},
            json.dumps(body).encode("utf-8"),
        )

    def poll_request(self, job_id: str) -> ApiCall:
        return ApiCall(
            f"{self.base_url}/api/v1/jobs/{job_id}", "GET", {"X-API-Key": self._key, "Accept": "application/json"}
        )

    def parse_response(self, status: int, headers: Mapping[Any, Any], body: bytes) -> Outcome:
        data = _json(body)
        if status == 202 and isinstance(data, dict) and data.get("job_id"):
            return Job(str(data["job_id"]), retry_after_seconds(_header(headers, "Retry-After")))
        if status == 200 and isinstance(data, dict):
            return self._result(data)
        return self._classify(self._error(status, headers, body))

    def parse_poll(self, status: int, headers: Mapping[Any, Any], body: bytes, job_id: str) -> Outcome:
        if status == 404:
            return Expired(job_id)
        data = _json(body)
        if status in (200, 202) and isinstance(data, dict):
            state = str(data.get("status", "")).lower()
            if state in {"failed", "error"}:
                error = data.get("error")
                detail = error.get("message") if isinstance(error, dict) else error
                return Failed(job_id, redact(str(detail or data.get("message") or "job failed")[:500]))
            if state in {"completed", "succeeded", "done"}:
                result = data.get("result")
                return self._result(result if isinstance(result, dict) else data)
            if isinstance(data.get("result"), dict):
                return self._result(data["result"])
            return Job(job_id, retry_after_seconds(_header(headers, "Retry-After")))
        return self._classify(self._error(status, headers, body))

    def _classify(self, error: ApiError) -> ApiError:
        code = error.code.upper()
        kind = error.kind
        if error.status == 401:
            kind = AUTH
        elif error.status == 402:
            paywall = "PAYWALL" in code or "paywall" in error.detail.lower()
            kind = FATAL if paywall else CREDITS
        elif error.status in (403, 422):
            kind = BLOCKED
        elif error.status == 504:
            kind = RETRY if code in self.REFUNDED_504 else FATAL
        return ApiError(error.status, error.detail, error.retry_after, error.code or f"http_{error.status}", kind)

    def _result(self, data: dict[str, Any]) -> Outcome:
        if "status_code" not in data:
            return ApiError(502, "the API answered without a status_code", code="no_status_code", kind=RETRY)
        content = data.get("content")
        if isinstance(content, dict):  # several formats asked for: take the page itself
            content = content.get("html") or content.get("raw_html") or content.get("text") or ""
        if not content and data.get("raw_html"):
            content = data["raw_html"]
        if not isinstance(content, str):
            content = json.dumps(content) if content is not None else ""
        page_body, page_headers = text_to_body(content, _pairs(data.get("headers") or {}))
        billing = data.get("billing") if isinstance(data.get("billing"), dict) else {}
        cost = billing.get("total_credits")
        if cost is None:
            cost = data.get("credits_used")
        return Result(
            url=str(data.get("final_url") or data.get("url") or ""),
            status=int(data["status_code"]),
            headers=page_headers,
            body=page_body,
            credits=float(cost or 0),
            decoded=True,
            extraction=data.get("extraction_result"),
        )


class ScrapingBee(Provider):
    """``GET /api/v1/?url=...`` with the key in ``Authorization: Bearer`` (as its official client
    sends it, to keep the key out of URLs and server logs). The target's status is passed through
    (``transparent_status_code``), its headers come back prefixed ``Spb-``, the cost in
    ``Spb-Cost``. A 401 is a bad key or an exhausted plan: the body tells which."""

    name = "scrapingbee"
    default_url = "https://app.scrapingbee.com"
    OPTIONS = frozenset(
        {
            "wait",
            "wait_for",
            "wait_browser",
            "block_resources",
            "block_ads",
            "premium_proxy",
            "stealth_proxy",
            "session_id",
            "device",
            "window_width",
            "window_height",
            "js_scenario",
            "custom_google",
            "return_page_source",
            "json_response",
            "screenshot",
            "extract_rules",
            "ai_query",
            "cookies",
            "timeout",
        }
    )

    def build_request(self, target: Target, options: Mapping[str, Any], timeout: float) -> ApiCall:
        params: dict[str, Any] = {"url": target.url, "transparent_status_code": "true"}
        params["render_js"] = "true" if _as_bool(options.get("render_js")) else "false"
        params["timeout"] = int(min(float(options.get("timeout") or timeout), timeout) * 1000)
        country = options.get("country")
        if country:
            params["country_code"] = str(country).lower()
            params.setdefault("premium_proxy", "true")
        for name in self.OPTIONS - {"timeout"}:
            if options.get(name) is not None:
                value = options[name]
                if isinstance(value, (dict, list)):
                    value = json.dumps(value)
                elif isinstance(value, bool):
                    value = str(value).lower()
                params[name] = value
        headers = {"Authorization": f"Bearer {self._key}"}
        if target.headers:
            params["forward_headers"] = "true"
            headers.update({f"Spb-{k}": v for k, v in target.headers.items()})
        return ApiCall(
            f"{self.base_url}/api/v1/?{urlencode(sorted(params.items()))}", target.method.upper(), headers, target.body
        )

    def parse_response(self, status: int, headers: Mapping[Any, Any], body: bytes) -> Outcome:
        cost = _header(headers, "Spb-Cost")
        resolved = _header(headers, "Spb-Resolved-Url")
        if cost is None and resolved is None:  # not a page: the API's own answer
            error = self._error(status, headers, body)
            if status == 401:
                text = (error.detail + " " + error.code).lower()
                no_credits = any(w in text for w in ("credit", "limit", "quota", "plan", "subscription"))
                return ApiError(
                    status,
                    error.detail,
                    error.retry_after,
                    "no_credits" if no_credits else "bad_key",
                    CREDITS if no_credits else AUTH,
                )
            return ApiError(status, error.detail, error.retry_after, error.code or f"http_{status}", error.kind)
        page_headers: list[tuple[str, str]] = []
        for k, v in _header_items(headers):
            low = k.lower()
            if low.startswith("spb-") and low not in {"spb-cost", "spb-resolved-url", "spb-initial-status-code"}:
                page_headers.append((k[4:], v))
            elif low == "content-type":
                page_headers.append((k, v))
        page_headers = [(k, v) for k, v in page_headers if k.lower() not in HOP_HEADERS]
        return Result(
            url=str(resolved or ""),
            status=status,
            headers=page_headers,
            body=body,
            credits=float(retry_after_seconds(cost) or 0),
        )


class Zyte(Provider):
    """Zyte API: ``POST /v1/extract`` with HTTP basic auth (key as user name), base64 bodies.

    Browser requests (``browserHtml``) take no custom method, body or headers (a Referer aside):
    a POST with ``render_js`` is refused at the request. Retries follow the official client's
    default policy: throttling (429/503) waits 20-40 s twice, then longer; a temporary download
    error (520) is tried 4 times, a permanent one (521) twice, an undocumented error twice."""

    name = "zyte"
    default_url = "https://api.zyte.com"
    unit = "requests"
    base_cost = 1.0
    render_cost = 1.0
    OPTIONS = frozenset(
        {"zyte", "geolocation", "javascript", "actions", "screenshot", "device", "requestCookies", "ipType"}
    )

    def build_request(self, target: Target, options: Mapping[str, Any], timeout: float) -> ApiCall:
        body: dict[str, Any] = {"url": target.url}
        browser = _as_bool(options.get("render_js"))
        if browser:
            if target.method.upper() != "GET" or target.body:
                raise OptionError(
                    f"Zyte API browser requests (render_js) send no method or body: "
                    f"{target.method} {target.url} cannot be rendered; fetch it with render_js off"
                )
            body["browserHtml"] = True
            referer = next((v for k, v in target.headers.items() if k.lower() == "referer"), None)
            if referer:
                body["requestHeaders"] = {"referer": referer}
        else:
            body["httpResponseBody"] = True
            if target.method.upper() != "GET":
                body["httpRequestMethod"] = target.method.upper()
                if target.body:
                    body["httpRequestBody"] = base64.b64encode(target.body).decode("ascii")
            if target.headers:
                body["customHttpRequestHeaders"] = [{"name": k, "value": v} for k, v in target.headers.items()]
        body["httpResponseHeaders"] = True
        country = options.get("country") or options.get("geolocation")
        if country:
            body["geolocation"] = str(country).upper()
        for name in ("javascript", "actions", "screenshot", "device", "requestCookies", "ipType"):
            if options.get(name) is not None:
                body[name] = options[name]
        body.update(options.get("zyte") or {})
        auth = base64.b64encode(f"{self._key}:".encode()).decode("ascii")
        return ApiCall(
            f"{self.base_url}/v1/extract",
            "POST",
            {"Authorization": f"Basic {auth}", "Content-Type": "application/json"},
            json.dumps(body).encode("utf-8"),
        )

    def parse_response(self, status: int, headers: Mapping[Any, Any], body: bytes) -> Outcome:
        data = _json(body)
        if status == 200 and isinstance(data, dict) and "statusCode" in data:
            page_headers = _pairs(data.get("httpResponseHeaders") or [])
            if "browserHtml" in data:
                page_body, page_headers = text_to_body(str(data["browserHtml"]), page_headers)
                decoded = True
            else:  # the raw bytes: the page's own encoding rules apply, as for a direct fetch
                page_body = base64.b64decode(data.get("httpResponseBody") or "")
                page_headers = [(k, v) for k, v in page_headers if k.lower() != "content-encoding"]
                decoded = False
            return Result(
                url=str(data.get("url") or ""),
                status=int(data["statusCode"]),
                headers=page_headers,
                body=page_body,
                credits=self.base_cost,
                decoded=decoded,
            )
        error = self._error(status, headers, body)
        kind = {401: AUTH, 403: AUTH, 402: CREDITS, 429: THROTTLED, 503: THROTTLED, 520: RETRY, 521: RETRY}.get(
            status, RETRY if status >= 500 else FATAL
        )
        return ApiError(status, error.detail, error.retry_after, error.code or f"http_{status}", kind)

    def retry_delay(self, error: ApiError, retries: int, backoff: float) -> float:
        if error.kind == THROTTLED:  # 20-40 s, 20-40 s, then 30 s plus up to 10 minutes
            if retries < 2:
                return backoff * (20 + random.uniform(0, 20))
            return backoff * (30 + random.uniform(0, min(600, 2**retries)))
        return backoff * (3 + random.uniform(0, 4) + random.uniform(0, min(55, 2**retries)))

    def max_attempts(self, error: ApiError) -> int | None:
        if error.status == 520:
            return 4
        if error.status == 521:
            return 2
        if error.kind == RETRY and error.status >= 500 and error.status != 599:
            return 2
        return None


PROVIDERS: dict[str, type[Provider]] = {p.name: p for p in (AlterLab, ScrapingBee, Zyte)}
