"""Signed queue entries: write access to Redis is not fetch authority.

Every entry a node or an operator command puts into the shared queue is
``h1.<HMAC-SHA256 of the JSON, base64url>.<JSON>`` with the fleet secret ``SCHEDULER_SECRET``.
A popped entry whose signature fails is never fetched: it becomes a dead letter ``unsigned``.

The secret: ``SCHEDULER_SECRET``, the same on every node. With no ``REDIS_URL`` (the embedded
Redis under ``DATA_DIR``) one is made once and kept in ``<DATA_DIR>/scheduler-secret`` (0600).
With a shared Redis it is required: the crawl refuses to start without it, or with the
``change-me`` placeholder of ``.env.example``. Rotation: set the new value as
``SCHEDULER_SECRET`` and the old one as ``SCHEDULER_SECRET_PREVIOUS`` on every node; entries
signed with either are accepted; once the queue holds no entry older than the switch, drop
``SCHEDULER_SECRET_PREVIOUS``.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets as _random
from typing import Any

from ..config import ConfigError, refuse_placeholder_password
from ..runtime.secrets import register_secret

PREFIX = b"h1."
_SIG_LEN = 43  # base64url of 32 bytes, unpadded
SECRET_FILE = "scheduler-secret"


class UnsignedEntry(ValueError):
    """A queue entry with no valid signature (forged, or signed with a retired secret)."""


class Signer:
    def __init__(self, secret: str, previous: str = "") -> None:
        self._keys = [s.encode() for s in (secret, previous) if s]
        self._key = self._keys[0]

    def __repr__(self) -> str:
        return "Signer(***)"

    def _mac(self, key: bytes, payload: bytes) -> bytes:
        return base64.urlsafe_b64encode(hmac.digest(key, payload, "sha256"))[:_SIG_LEN]

    def sign(self, payload: bytes) -> bytes:
        return PREFIX + self._mac(self._key, payload) + b"." + payload

    def tag(self, payload: bytes) -> bytes:
        """The signature alone, for records that keep it in a field of their own (the stream)."""
        return self._mac(self._key, payload)

    def check_tag(self, payload: bytes, tag: bytes) -> None:
        if not any(hmac.compare_digest(tag, self._mac(key, payload)) for key in self._keys):
            raise UnsignedEntry("signature does not match" if tag else "no signature")

    def verify(self, data: bytes | str) -> bytes:
        """The JSON inside a signed entry; :class:`UnsignedEntry` if the signature fails."""
        if isinstance(data, str):
            data = data.encode()
        head = len(PREFIX) + _SIG_LEN
        if not data.startswith(PREFIX) or data[head : head + 1] != b".":
            raise UnsignedEntry("no signature")
        mac, payload = data[len(PREFIX) : head], data[head + 1 :]
        for key in self._keys:
            if hmac.compare_digest(mac, self._mac(key, payload)):
                return payload
        raise UnsignedEntry("signature does not match")


def unwrap(data: bytes | str) -> bytes | str:
    """The JSON of an entry, signed or not, without checking: for display and routing only."""
    raw = data.encode() if isinstance(data, str) else data
    if raw.startswith(PREFIX):
        return raw[len(PREFIX) + _SIG_LEN + 1 :]
    return data


def check(settings: Any) -> None:
    """At start: :class:`ConfigError` for a missing or placeholder secret, nothing written."""
    resolve_secret(settings, keep=False)


def resolve_secret(settings: Any, keep: bool = True) -> tuple[str, str]:
    """(secret, previous), or :class:`ConfigError` naming ``SCHEDULER_SECRET``."""
    # The environment too: settings built in code (scrapy.utils.test, tools) skip settings.py.
    secret = str(settings.get("SCHEDULER_SECRET") or os.environ.get("SCHEDULER_SECRET") or "").strip()
    previous = str(
        settings.get("SCHEDULER_SECRET_PREVIOUS") or os.environ.get("SCHEDULER_SECRET_PREVIOUS") or ""
    ).strip()
    for name, value in (("SCHEDULER_SECRET", secret), ("SCHEDULER_SECRET_PREVIOUS", previous)):
        if value.lower().startswith("change-me"):
            raise ConfigError(f"{name}: still the placeholder of .env.example; set a random value")
    for name in ("REDIS_URL", "DATABASE_URL"):
        refuse_placeholder_password(name, str(settings.get(name) or ""))
    if not secret:
        # The embedded Redis (a unix socket under DATA_DIR, see backends.py) is this machine's
        # alone: its nodes share the kept secret. Anything else may be shared.
        redis_url = str(settings.get("REDIS_URL") or "").strip()
        if redis_url and not redis_url.startswith("unix://"):
            raise ConfigError("SCHEDULER_SECRET: required with a shared Redis (REDIS_URL), the same on every node")
        if not keep:
            return "", previous
        secret = _kept_secret(settings)
    register_secret(secret)
    register_secret(previous)
    return secret, previous


def _kept_secret(settings: Any) -> str:
    from ..backends.embedded import data_dir

    folder = data_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SECRET_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(_random.token_urlsafe(32))
    return path.read_text().strip()


_current: Signer | None = None


def install(settings: Any) -> Signer:
    """Make the signer of *settings* the one this process signs and verifies with."""
    global _current
    _current = Signer(*resolve_secret(settings))
    return _current


def current() -> Signer:
    if _current is None:
        from scrapy.utils.project import get_project_settings

        return install(get_project_settings())
    return _current
