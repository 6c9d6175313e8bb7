"""One fetched response as a stream entry, and back.

Two fields: ``m``, the JSON of the queue's serializer (:mod:`scraper.queue.serializer`: no
pickle, so write access to Redis is not code execution on the processors) with the final URL,
status, headers, flags, run id and the request as the shared queue stores it; and ``b``, the
body, zlib-compressed (HTML shrinks about 4x at level 1, for a fraction of the CPU of level 6).

Nothing secret enters the stream: the request's own headers and cookies are left out (the
scraping API's key and any ``Authorization`` or ``Cookie`` live there), the response's
``Set-Cookie`` too, and the request's private meta (``_``-prefixed: its lease, among others).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from scrapy import Request
from scrapy.http import Headers, Response
from scrapy.responsetypes import responsetypes

from ..queue import serializer, signing
from ..queue.requests import request_from_dict, request_to_dict
from ..queue.serializer import SerializationError

#: Headers never stored, in the response or anywhere else (lower case).
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"})
# Meta that describes one download in the fetcher, not what the callback reads.
_FETCH_META = ("download_slot", "download_latency")
ZLIB_LEVEL = 1


@dataclass
class Entry:
    request: dict[str, Any]  # as the shared queue stores it, without headers and cookies
    url: str  # the final URL (after redirects): the response's
    status: int
    headers: list[tuple[str, str]]
    flags: list[str]
    run_id: int | None
    body: bytes

    def to_request(self, spider: Any) -> Request:
        return request_from_dict(self.request, spider)

    def to_response(self, request: Request) -> Response:
        headers = Headers()
        for name, value in self.headers:
            headers.appendlist(name, value)
        cls = responsetypes.from_args(headers=headers, url=self.url, body=self.body)
        return cls(
            url=self.url,
            status=self.status,
            headers=headers,
            body=self.body,
            request=request,
            flags=[*self.flags, "stream"],
        )


def _meta(meta: dict[str, Any]) -> dict[str, Any]:
    kept = {}
    for key, value in meta.items():
        if key.startswith("_") or key in _FETCH_META:
            continue
        try:
            serializer.dumps({"url": "", "v": value})
        except SerializationError:
            continue  # set by a middleware for this download only; the queue never held it
        kept[key] = value
    return kept


def encode(
    request: Request, response: Response, spider: Any, run_id: int | None, callbacks: dict[Any, str]
) -> dict[str, bytes]:
    """The stream fields of *response* to *request*. Raises ``SerializationError`` for a request
    the shared queue could not hold either (a callback that is not a spider method)."""
    data = request_to_dict(request, spider, callbacks)
    data.pop("headers", None)
    data.pop("cookies", None)
    data["meta"] = _meta(data.get("meta") or {})
    headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, values in response.headers.items()
        if k.decode("latin-1").lower() not in SECRET_HEADERS
        for v in values
    ]
    head = {
        "url": response.url,
        "status": response.status,
        "headers": headers,
        "flags": list(response.flags),
        "run": run_id,
        "request": data,
    }
    m, b = serializer.dumps(head), zlib.compress(response.body, ZLIB_LEVEL)
    # Signed as queue entries are: a forged entry would plant rows and queue the links it holds.
    return {"m": m, "b": b, "s": signing.current().tag(m + b"\0" + b)}


def decode(fields: dict[bytes, bytes]) -> Entry:
    """Raises ``ValueError`` (or ``zlib.error``) for fields that :func:`encode` did not write."""
    signing.current().check_tag(fields[b"m"] + b"\0" + fields.get(b"b", b""), fields.get(b"s", b""))
    head = serializer.loads(fields[b"m"])
    request = head["request"]
    if not isinstance(request, dict) or "url" not in request:
        raise ValueError("a stream entry without its request")
    return Entry(
        request=request,
        url=head["url"],
        status=int(head["status"]),
        headers=[(str(k), str(v)) for k, v in head.get("headers") or []],
        flags=list(head.get("flags") or []),
        run_id=head.get("run"),
        body=zlib.decompress(fields.get(b"b", b"") or zlib.compress(b"")),
    )
