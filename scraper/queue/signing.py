"""Signed queue entries: write access to Redis is not fetch authority.

Every entry a node or an operator command puts into the shared queue is ``h2<tag><JSON>``: the
tag is the first 128 bits of the JSON's HMAC-SHA256 with the fleet secret ``SCHEDULER_SECRET``,
22 base64url characters (no separator follows: its length is fixed). Entries of earlier
versions, ``h1.<the whole HMAC-SHA256, 43 characters>.<JSON>``, are still verified and read. A
popped entry whose signature fails is never fetched: it becomes a dead letter ``unsigned``.

Why 128 bits are enough: the tag only has to stop someone who can write to Redis but does not
hold the secret from making an entry the fleet accepts. Without the key a tag can be neither
computed nor checked offline, so a forger can only try entries on the fleet, one chance in
2**128 each, every failed one a popped ``unsigned`` dead letter and an alert. The 2**64 of a
collision search do not apply: it needs tags computed at will, which only the key allows.
RFC 2104 (section 5) and NIST SP 800-107 allow truncating an HMAC to half its output. Every
queued request pays for the tag's length in Redis memory (43 characters before, 22 now). The
processing stream's tags (:meth:`Signer.tag`) keep the whole HMAC: one per fetched page, not
per queued request, and read by nodes of every version.

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

PREFIX = b"h2"
_SIG_LEN = 22  # base64url of 16 bytes, unpadded
_MAC_BYTES = 16
# What versions before the compact entry wrote, still read: a rolling deploy shares one queue.
LEGACY_PREFIX = b"h1."
_LEGACY_SIG_LEN = 43  # base64url of 32 bytes, unpadded
#: How a signed entry of any version begins.
PREFIXES = ("h2", "h1.")
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
        return base64.urlsafe_b64encode(hmac.digest(key, payload, "sha256"))[:_LEGACY_SIG_LEN]

    def _short_mac(self, key: bytes, payload: bytes) -> bytes:
        return base64.urlsafe_b64encode(hmac.digest(key, payload, "sha256")[:_MAC_BYTES])[:_SIG_LEN]

    def sign(self, payload: bytes) -> bytes:
        return PREFIX + self._short_mac(self._key, payload) + payload

    def tag(self, payload: bytes) -> bytes:
        """The signature alone, for records that keep it in a field of their own (the stream)."""
        return self._mac(self._key, payload)

    def check_tag(self, payload: bytes, tag: bytes) -> None:
        if not any(hmac.compare_digest(tag, self._mac(key, payload)) for key in self._keys):
            raise UnsignedEntry("signature does not match" if tag else "no signature")

    def verify(self, data: bytes | str) -> bytes:
        """The JSON inside a signed entry (this version's or an earlier one's);
        :class:`UnsignedEntry` if the signature fails."""
        if isinstance(data, str):
            data = data.encode()
        if data.startswith(PREFIX) and len(data) > len(PREFIX) + _SIG_LEN:
            mac, payload = data[len(PREFIX) : len(PREFIX) + _SIG_LEN], data[len(PREFIX) + _SIG_LEN :]
            for key in self._keys:
                if hmac.compare_digest(mac, self._short_mac(key, payload)):
                    return payload
            raise UnsignedEntry("signature does not match")
        end = len(LEGACY_PREFIX) + _LEGACY_SIG_LEN
        if not data.startswith(LEGACY_PREFIX) or data[end : end + 1] != b".":
            raise UnsignedEntry("no signature")
        mac, payload = data[len(LEGACY_PREFIX) : end], data[end + 1 :]
        for key in self._keys:
            if hmac.compare_digest(mac, self._mac(key, payload)):
                return payload
        raise UnsignedEntry("signature does not match")


def unwrap(data: bytes | str) -> bytes | str:
    """The JSON of an entry, signed or not, without checking: for display and routing only."""
    raw = data.encode() if isinstance(data, str) else data
    if raw.startswith(LEGACY_PREFIX):
        return raw[len(LEGACY_PREFIX) + _LEGACY_SIG_LEN + 1 :]
    if raw.startswith(PREFIX):
        return raw[len(PREFIX) + _SIG_LEN :]
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
