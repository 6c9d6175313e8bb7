"""Webhooks: each batch POSTed as JSON, signed with HMAC-SHA256, retried with backoff, and
kept as dead letters after the last try.

The request: ``POST`` of ``{"events": [...]}`` (each event with its ``id``: the receiver dedupes
by it, a batch may come twice), headers ``X-Changefeed-Timestamp`` (Unix seconds) and
``X-Changefeed-Signature: sha256=<hex>``, the HMAC of ``<timestamp>.<body>`` with the shared
secret (the timestamp inside the signature lets a receiver refuse replays of old requests).

Answers: 2xx delivered. 408, 425, 429, 5xx, a timeout or no connection: sent again, the waits
doubling up to ``CHANGEFEED_RETRY_MAX_GAP`` (``Retry-After`` honoured within it), until
``CHANGEFEED_WEBHOOK_TRIES`` sends; then its events become dead letters and the relay goes on.
401 and 403: the secret or the endpoint is wrong for every event alike, so the relay stops
(nothing is lost; its position stays). Any other 4xx: the receiver refuses these events; they
are dead letters at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from ...config import mask_url
from ..config import FeedConfig
from ..events import Event
from .base import Delivery, Sink, SinkFatal, failure

_AGAIN = {408, 425, 429}


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Changefeed-Signature`` value of *body* sent at *timestamp*."""
    mac = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class WebhookSink(Sink):
    kind = "webhook"

    def __init__(self, url: str, secret: str, tries: int = 6, timeout: float = 10.0, max_gap: float = 30.0) -> None:
        self._url = url
        self._secret = secret
        self.tries = tries
        self.timeout = timeout
        self.max_gap = max_gap
        self._session: Any = None

    @classmethod
    def from_config(cls, conf: FeedConfig) -> WebhookSink:
        return cls(conf.webhook_url, conf.webhook_secret, conf.webhook_tries, conf.webhook_timeout, conf.retry_max_gap)

    def describe(self) -> str:
        return f"webhook {mask_url(self._url)}"

    async def open(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        wait = min(0.5 * 2**attempt, self.max_gap)
        if retry_after and retry_after.strip().isdigit():
            wait = min(max(wait, float(retry_after)), self.max_gap)
        return wait

    async def publish(self, events: Sequence[Event]) -> Delivery:
        await self.open()
        body = json.dumps(
            {"events": [e.as_dict() for e in events]}, ensure_ascii=False, separators=(",", ":"), default=str
        ).encode("utf-8")
        reason = ""
        retry_after: str | None = None
        for attempt in range(self.tries):
            if attempt:
                await asyncio.sleep(self._wait(attempt - 1, retry_after))
            retry_after = None
            timestamp = str(int(time.time()))
            headers = {
                "Content-Type": "application/json",
                "X-Changefeed-Timestamp": timestamp,
                "X-Changefeed-Signature": signature(self._secret, timestamp, body),
            }
            try:
                async with self._session.post(self._url, data=body, headers=headers, allow_redirects=False) as answer:
                    status = answer.status
                    retry_after = answer.headers.get("Retry-After")
                    await answer.read()
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                reason = f"no answer ({failure(exc)})"
                continue
            if 200 <= status < 300:
                return Delivery()
            if status in (401, 403):
                raise SinkFatal(f"the webhook refused the request (HTTP {status}): check CHANGEFEED_WEBHOOK_SECRET")
            reason = f"HTTP {status}"
            if status < 500 and status not in _AGAIN:
                return Delivery([(e, f"refused: {reason}") for e in events])
        return Delivery([(e, f"{reason} after {self.tries} tries") for e in events])

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
