"""The middleware's private HTTP client for API calls.

An API call carries the key (in a header) and the API's own URL. Sent as a Scrapy request it
would pass through every downloader middleware, signal and extension: retried, dead-lettered,
cached, archived or logged with the key in it. So it never is one: this client sends it on the
asyncio loop Scrapy already runs (the asyncio reactor), with its own connection pool, and hands
back only status, headers and body. Nothing outside the scraping-API middleware sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from multidict import CIMultiDictProxy

from ..runtime.secrets import redact
from .providers import ApiCall

if TYPE_CHECKING:
    import aiohttp


class TransportError(Exception):
    """The API did not answer: timeout, refused connection, DNS, a broken or oversized answer.
    The message never holds the key or the API call's headers."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes


class ApiClient:
    def __init__(self, max_connections: int = 100, max_size: int = 0, user_agent: str = "scraper") -> None:
        self.max_connections = max_connections
        self.max_size = max_size  # 0: no limit
        self.user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return "<ApiClient>"

    def _get_session(self) -> aiohttp.ClientSession:
        # Imported at the first API call: every `scrapy` command loads this module (the crawl
        # command's checks), and aiohttp's import is ~0.15 s of CPU (it builds SSL contexts),
        # which `scrapy runs`, `seed` and the other commands that send nothing need not pay.
        import aiohttp

        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=300)
            # trust_env: an HTTPS_PROXY set for the crawl applies to the API too; cookies are the
            # target's business (forwarded explicitly), never the API's.
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=True,
                cookie_jar=aiohttp.DummyCookieJar(),
                headers={"User-Agent": self.user_agent},
                auto_decompress=True,
            )
        return self._session

    async def send(self, call: ApiCall, timeout: float) -> Answer:
        import aiohttp

        session = self._get_session()
        try:
            async with session.request(
                call.method,
                call.url,
                headers=call.headers,
                data=call.body or None,
                timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,
            ) as response:
                body = await self._read(response)
                return Answer(response.status, response.headers, body)
        except TimeoutError:
            raise TransportError("timeout", f"no answer within {timeout:g} s") from None
        except aiohttp.ClientError as exc:
            raise TransportError(type(exc).__name__, redact(str(exc))[:300]) from None

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        if not self.max_size:
            return await response.read()
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(65536):
            size += len(chunk)
            if size > self.max_size:
                raise TransportError("too_large", f"answer larger than DOWNLOAD_MAXSIZE ({self.max_size} bytes)")
            chunks.append(chunk)
        return b"".join(chunks)

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def is_usable() -> bool:
    """The client runs on the asyncio loop, which only the asyncio reactor provides."""
    from scrapy.utils.reactor import is_asyncio_reactor_installed

    try:
        return is_asyncio_reactor_installed()
    except Exception:
        return False
