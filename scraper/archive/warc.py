"""One response as WARC bytes, and back.

What never reaches the archive: ``Cookie``, ``Set-Cookie``, ``Authorization``,
``Proxy-Authorization``, API-key headers, and any header holding a registered secret (the
scraping API's key, a database password). The body is stored as the spider saw it (already
decoded), so the transfer headers that described the wire form are dropped too.
"""

from __future__ import annotations

import base64
import hashlib
import io
from datetime import datetime
from typing import Any

from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from ..runtime.secrets import redact

_DROPPED = {
    "cookie",
    "set-cookie",
    "set-cookie2",
    "authorization",
    "proxy-authorization",
    "x-api-key",
    # The body is archived decoded: these described the bytes on the wire, not these.
    "transfer-encoding",
    "content-encoding",
    "content-length",
}


def payload_digest(body: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(body).digest()).decode("ascii")


def safe_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in _DROPPED and redact(v) == v and redact(k) == k]


def warc_date(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def response_record(
    url: str,
    status: int,
    reason: str,
    headers: list[tuple[str, str]],
    body: bytes | None,
    when: datetime,
    extra: dict[str, str],
    refers_to: tuple[str, datetime] | None = None,
    digest: str = "",
) -> bytes:
    """A gzip member holding one ``response`` record, or a ``revisit`` of *refers_to* (its
    body is not stored again)."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True)
    kept = safe_headers(headers)
    warc_headers = {"WARC-Date": warc_date(when), **{k: redact(v) for k, v in extra.items() if v}}
    if refers_to is None:
        assert body is not None
        http = StatusAndHeaders(
            f"{status} {reason}".strip(), kept + [("Content-Length", str(len(body)))], protocol="HTTP/1.1"
        )
        record = writer.create_warc_record(
            redact(url), "response", payload=io.BytesIO(body), http_headers=http, warc_headers_dict=warc_headers
        )
    else:
        http = StatusAndHeaders(f"{status} {reason}".strip(), kept, protocol="HTTP/1.1")
        record = writer.create_revisit_record(
            redact(url),
            digest,
            redact(refers_to[0]),
            warc_date(refers_to[1]),
            http_headers=http,
            warc_headers_dict=warc_headers,
        )
    writer.write_record(record)
    return out.getvalue()


def read_record(data: bytes) -> tuple[Any, int, list[tuple[str, str]], bytes]:
    """(record type, status, headers, body) of the one record in *data*."""
    for record in ArchiveIterator(io.BytesIO(data)):
        http = record.http_headers
        status = int(http.get_statuscode()) if http is not None else 200
        headers = list(http.headers) if http is not None else []
        body = record.content_stream().read() if record.rec_type == "response" else b""
        return record.rec_type, status, headers, body
    raise ValueError("no WARC record at this offset")
