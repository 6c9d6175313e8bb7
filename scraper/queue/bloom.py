"""The seen-state as a Bloom filter in Redis (``DUPEFILTER_BACKEND=bloom``).

A set spends about 90 bytes of Redis memory per URL; a Bloom filter sized for n URLs at a false
positive rate p spends ``m = ceil(-n ln p / (ln 2)^2)`` bits whatever it holds, ``-log2(p) /
ln 2`` bits per URL: 1.8 bytes at p = 0.1% (the default), 1.2 bytes at 1%. It never forgets a
URL it has seen; it wrongly calls a new URL seen with probability p once it holds n URLs (less
before, rapidly more after), and that page is then never fetched. Size it for the crawl.

The k = round(m/n ln 2) bit positions of a fingerprint are computed here, not in Redis (whose
Lua has no 64-bit integers), by enhanced double hashing of a 128-bit BLAKE2b digest of the
fingerprint. Hashing it again costs a microsecond and makes the positions uniform whatever
``REQUEST_FINGERPRINTER_CLASS`` returns (a custom fingerprinter may return a URL, not a digest).
One script checks the k bits and, if any is 0, sets them all and queues the request:
atomically, so two nodes that meet the same link queue it once.

The filter is one Redis string, at most 512 MB (2^32 bits): about 298 million URLs at 0.1%.
A capacity that needs more fails at start, naming the setting; shard by spider instead.
The filter is allocated whole when a node opens it (and when a new generation starts), so its
memory is taken at start, not as the crawl goes.

The filter's shape (m, k, capacity, rate, expiry) is stored next to it in ``<key>:params``.
Every node uses the shape found there, so a node started with other settings cannot corrupt
the filter of a crawl in progress; new settings apply once that seen-state is gone.
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
import time
from dataclasses import dataclass
from typing import Any

from ..backends.redis_client import register_script
from ..config import ConfigError, get_float, get_int
from .generations import GenerationalClaims, Generations

logger = logging.getLogger(__name__)

MAX_BITS = 2**32  # SETBIT's largest offset + 1: a Redis string holds at most 512 MB
LAYOUT = "blake2b128-edh"  # how positions are derived; stored with the filter
DEFAULT_CAPACITY = 10_000_000
DEFAULT_ERROR_RATE = 0.001


@dataclass(frozen=True)
class BloomFilter:
    """The shape of a filter: ``bits`` (m) and ``hashes`` (k) for ``capacity`` URLs at ``error_rate``."""

    capacity: int
    error_rate: float
    bits: int
    hashes: int

    @classmethod
    def for_capacity(cls, capacity: int, error_rate: float) -> BloomFilter:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if not 0 < error_rate < 1:
            raise ValueError("error rate must be between 0 and 1")
        bits = math.ceil(-capacity * math.log(error_rate) / math.log(2) ** 2)
        hashes = max(1, round(bits / capacity * math.log(2)))
        return cls(capacity, error_rate, bits, hashes)

    @classmethod
    def from_settings(cls, settings: Any) -> BloomFilter:
        """Read ``DUPEFILTER_BLOOM_CAPACITY`` and ``DUPEFILTER_BLOOM_ERROR_RATE``; raise
        :class:`ConfigError` naming the setting when one is malformed or the filter too big."""
        capacity = get_int(settings, "DUPEFILTER_BLOOM_CAPACITY", DEFAULT_CAPACITY, minimum=1)
        error_rate = get_float(settings, "DUPEFILTER_BLOOM_ERROR_RATE", DEFAULT_ERROR_RATE)
        if not 0 < error_rate < 1:
            raise ConfigError(f"DUPEFILTER_BLOOM_ERROR_RATE: expected a number between 0 and 1, got {error_rate!r}")
        bloom = cls.for_capacity(capacity, error_rate)
        if bloom.bits > MAX_BITS:
            most = int(MAX_BITS * math.log(2) ** 2 / -math.log(error_rate))
            raise ConfigError(
                f"DUPEFILTER_BLOOM_CAPACITY: {capacity} URLs at error rate {error_rate} need a "
                f"{bloom.bytes / 2**20:.0f} MB filter, more than the 512 MB one Redis string holds "
                f"(at most {most} URLs at this rate): lower it or raise DUPEFILTER_BLOOM_ERROR_RATE"
            )
        return bloom

    @property
    def bytes(self) -> int:
        return (self.bits + 7) // 8

    @property
    def bytes_per_url(self) -> float:
        return self.bits / 8 / self.capacity

    def false_positive_rate(self, count: int | None = None) -> float:
        """The expected false-positive rate once *count* (default: capacity) URLs are in."""
        n = self.capacity if count is None else count
        return (1 - math.exp(-self.hashes * n / self.bits)) ** self.hashes

    def positions(self, fingerprint: str) -> list[int]:
        digest = hashlib.blake2b(fingerprint.encode(), digest_size=16).digest()
        x = int.from_bytes(digest[:8], "little")
        y = int.from_bytes(digest[8:], "little")
        m = self.bits
        out = []
        # Enhanced double hashing (Dillinger & Manolios): k positions from two hashes, without
        # the short cycles plain h1 + i*h2 falls into when h2 shares a factor with m.
        for i in range(self.hashes):
            out.append(x % m)
            x += y
            y += i + 1
        return out

    def packed_positions(self, fingerprint: str) -> bytes:
        return struct.pack(f"<{self.hashes}I", *self.positions(fingerprint))

    def estimate_count(self, ones: int, bits_read: int | None = None) -> float:
        """URLs in a filter with *ones* bits set among *bits_read* (default: all of them)."""
        fill = ones / (bits_read or self.bits)
        fill = min(fill, 1 - 1 / self.bits)  # a full filter: "at least this many"
        return max(0.0, -self.bits / self.hashes * math.log(1 - fill))


# Claim a fingerprint and, if it is new, queue its request: one round trip, atomically.
# KEYS: current filter, previous filter (the same key without expiry), parameters, [queue].
# ARGV: expire-at in unix ms (0: never), score, request ('' without a queue), bit positions
# packed as little-endian uint32 (one argument instead of k: the client's encoding of many
# small arguments costs more than the script).
_CLAIM = """
local positions = {struct.unpack('<' .. string.rep('I4', #ARGV[4] / 4), ARGV[4])}
positions[#positions] = nil  -- unpack's last value is the offset after the data
local function holds(key)
  for _, position in ipairs(positions) do
    if redis.call('GETBIT', key, position) == 0 then return false end
  end
  return true
end
if holds(KEYS[1]) or (KEYS[2] ~= KEYS[1] and holds(KEYS[2])) then return 0 end
for _, position in ipairs(positions) do redis.call('SETBIT', KEYS[1], position, 1) end
if ARGV[1] ~= '0' then
  redis.call('PEXPIREAT', KEYS[1], ARGV[1])
  redis.call('PEXPIREAT', KEYS[3], ARGV[1])
end
if KEYS[4] then redis.call('ZADD', KEYS[4], ARGV[2], ARGV[3]) end
return 1
"""

# The first node to open a filter decides its shape; every other node reads it.
_ADOPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HSET', KEYS[1], unpack(ARGV)) end
return redis.call('HGETALL', KEYS[1])
"""

# Allocate the filter whole, now: grown bit by bit, Redis would keep up to 1 MB spare, and a
# Redis without room for it fails here rather than in the middle of the crawl.
# KEYS: filter, parameters. ARGV: its last bit (m - 1), expire-at in unix ms (0: never).
_RESERVE = """
if redis.call('STRLEN', KEYS[1]) * 8 <= tonumber(ARGV[1]) then redis.call('SETBIT', KEYS[1], ARGV[1], 0) end
if ARGV[2] ~= '0' then
  redis.call('PEXPIREAT', KEYS[1], ARGV[2])
  redis.call('PEXPIREAT', KEYS[2], ARGV[2])
end
return 1
"""


class BloomSeen(GenerationalClaims):
    """The seen-state of one spider in a Bloom filter (see :class:`~.dupefilter.SeenSet` for
    the interface both backends share)."""

    # BITCOUNT of a big filter blocks Redis for a while: estimate from a sample this large.
    SAMPLE_BYTES = 1 << 20
    FILL_CHECK_EVERY = 300.0

    def __init__(self, server: Any, key: str, bloom: BloomFilter, expiry: float = 0.0) -> None:
        self.server = server
        self.base = key
        self.params_key = f"{key}:params"
        self.bloom = bloom
        self.generations = Generations(server, expiry)
        self._claim = register_script(server, _CLAIM)
        self._adopt = register_script(server, _ADOPT)
        self._reserve = register_script(server, _RESERVE)
        self._generation: int | None = None
        self._fill_checked = time.monotonic()
        self._overfull_warned: int | None = None

    @property
    def expiry(self) -> float:
        return self.generations.expiry

    # --- the shared interface -------------------------------------------------------------------
    def generation(self) -> int:
        """The current generation; the first call, and each change, (re)reads the shape."""
        generation = self.generations.current()
        if generation != self._generation:
            self._open()
            generation = self.generations.current()
            self._generation = generation
            self._check_fill()
        elif time.monotonic() - self._fill_checked >= self.FILL_CHECK_EVERY:
            self._check_fill()
        return generation

    def push_if_new(self, pipe: Any, fingerprint: str, queue_key: str, score: float, data: bytes) -> None:
        self.generation()
        current, previous, expire_at = self.generations.keys(self.base)
        self._claim(
            keys=[current, previous, self.params_key, queue_key],
            args=[expire_at, score, data, self.bloom.packed_positions(fingerprint)],
            client=pipe,
        )

    def _claim_into(self, fingerprint: str, current: str, previous: str, expire_at: Any, client: Any = None) -> Any:
        return self._claim(
            keys=[current, previous, self.params_key],
            args=[expire_at, "", "", self.bloom.packed_positions(fingerprint)],
            client=client,
        )

    def keys(self) -> list[str]:
        return [*self.generations.live_keys(self.base), self.params_key]

    def run_keys(self) -> list[str]:
        # With an expiry the filter outlives the run: a recrawl skips what is still remembered.
        return [] if self.expiry else self.keys()

    def clear(self) -> None:
        self.server.delete(*self.keys())
        self._generation = None

    def size(self) -> float:
        """Estimated URLs remembered, from the share of bits set (read-only: any process may ask)."""
        stored = self._stored_shape()
        if stored is None:
            return 0.0
        bloom, expiry = stored
        generations = self.generations if expiry == self.expiry else Generations(self.server, expiry)
        return sum(self._estimate(key, bloom) for key in generations.live_keys(self.base))

    # --- internals ------------------------------------------------------------------------------
    def _shape_fields(self) -> list[Any]:
        b = self.bloom
        return [
            "bits",
            b.bits,
            "hashes",
            b.hashes,
            "capacity",
            b.capacity,
            "error_rate",
            repr(b.error_rate),
            "expiry",
            repr(self.expiry),
            "layout",
            LAYOUT,
        ]

    def _stored_shape(self) -> tuple[BloomFilter, float] | None:
        raw = self.server.hgetall(self.params_key)
        if not raw:
            return None
        return _shape_from(raw, self.params_key)

    def _open(self) -> None:
        raw = self._adopt(keys=[self.params_key], args=self._shape_fields())
        bloom, expiry = _shape_from(dict(zip(raw[::2], raw[1::2])), self.params_key)
        if (bloom, expiry) != (self.bloom, self.expiry):
            logger.warning(
                "The Bloom filter %s in Redis was made for %d URLs at error rate %s with expiry %ss; "
                "this node is configured for %d at %s with expiry %ss and uses the stored shape "
                "(a filter cannot be resized). The new settings apply once the crawl's seen-state "
                "is gone (delete %s and its generation keys to start afresh).",
                self.base,
                bloom.capacity,
                bloom.error_rate,
                expiry,
                self.bloom.capacity,
                self.bloom.error_rate,
                self.expiry,
                self.params_key,
            )
            self.bloom = bloom
            self.generations = Generations(self.server, expiry)
        # The shape lives as long as the newest generation it describes, no longer.
        current, _previous, expire_at = self.generations.keys(self.base)
        self._reserve(keys=[current, self.params_key], args=[self.bloom.bits - 1, expire_at])

    def _check_fill(self) -> None:
        self._fill_checked = time.monotonic()
        current = self.generations.live_keys(self.base)[0]
        count = self._estimate(current, self.bloom)
        if count > self.bloom.capacity and self._overfull_warned != self._generation:
            self._overfull_warned = self._generation
            logger.warning(
                "The Bloom filter %s holds about %d URLs, more than its capacity of %d: new pages are "
                "now wrongly taken for seen more often than %s of the time (about %.2g). Raise "
                "DUPEFILTER_BLOOM_CAPACITY for the next crawl.",
                current,
                count,
                self.bloom.capacity,
                self.bloom.error_rate,
                self.bloom.false_positive_rate(int(count)),
            )

    def _estimate(self, key: str, bloom: BloomFilter) -> float:
        pipe = self.server.pipeline(transaction=False)
        pipe.type(key)
        if bloom.bytes <= self.SAMPLE_BYTES:
            pipe.bitcount(key)
            bits_read = bloom.bits
        else:
            # Positions are uniform, so a few spread slices tell the fill of the whole filter.
            slices = 16
            width = self.SAMPLE_BYTES // slices
            stride = bloom.bytes // slices
            for i in range(slices):
                pipe.bitcount(key, i * stride, i * stride + width - 1)
            bits_read = slices * width * 8
        kind, *counts = pipe.execute()
        if kind not in (b"string", "string"):
            return 0.0
        return bloom.estimate_count(sum(counts), bits_read)


def _shape_from(raw: dict, key: str) -> tuple[BloomFilter, float]:
    fields = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()
    }
    if fields.get("layout") != LAYOUT:
        raise RuntimeError(f"{key}: a Bloom filter of layout {fields.get('layout')!r}; this version reads {LAYOUT!r}")
    bloom = BloomFilter(
        int(fields["capacity"]), float(fields["error_rate"]), int(fields["bits"]), int(fields["hashes"])
    )
    return bloom, float(fields["expiry"])
