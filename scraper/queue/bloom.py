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

The filter is at most 2^32 bits (512 MB): about 298 million URLs at 0.1%. A capacity that
needs more fails at start, naming the setting; shard by spider instead. It is kept in slices of
a little under 1 MiB (``<key>``, ``<key>#1``, ``<key>#2``...), each its own Redis string: Redis'
allocator hands a string a block of one of its size classes, a quarter apart between powers of
two, so one 18 MB string (10 million URLs at 0.1%) took a 20 MiB block, 2.10 bytes a URL; slices
sized to a class waste only the last one's rounding (1.80 bytes a URL). A position's slice is
its bit number over the slice's size, computed by the scripts; the slices share the key's hash
tag, so they live in its slot on a cluster. A filter of one slice is the key alone, as filters
made before slicing are (their shape has no ``slice_bits``: one slice of all the bits).
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
from . import lists
from .generations import GenerationalClaims, Generations

logger = logging.getLogger(__name__)

MAX_BITS = 2**32  # SETBIT's largest offset + 1: a Redis string holds at most 512 MB
LAYOUT = "blake2b128-edh"  # how positions are derived; stored with the filter
# The same positions kept in slices: a name of its own, so that a node of a version before
# slicing refuses such a filter by name instead of reading it as one key.
SLICED_LAYOUT = "blake2b128-edh-sliced"
# A slice's bytes: a string's block is its bytes + its header (9 at this length) + 1, so a slice
# of 1 MiB - 16 bytes fills jemalloc's 1 MiB class (the size classes of Redis' default allocator).
SLICE_BITS = (2**20 - 16) * 8
DEFAULT_CAPACITY = 10_000_000
DEFAULT_ERROR_RATE = 0.001


@dataclass(frozen=True)
class BloomFilter:
    """The shape of a filter: ``bits`` (m) and ``hashes`` (k) for ``capacity`` URLs at ``error_rate``."""

    capacity: int
    error_rate: float
    bits: int
    hashes: int
    slice_bits: int = SLICE_BITS

    @classmethod
    def for_capacity(cls, capacity: int, error_rate: float) -> BloomFilter:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if not 0 < error_rate < 1:
            raise ValueError("error rate must be between 0 and 1")
        bits = math.ceil(-capacity * math.log(error_rate) / math.log(2) ** 2)
        hashes = max(1, round(bits / capacity * math.log(2)))
        return cls(capacity, error_rate, bits, hashes)

    @property
    def slices(self) -> int:
        return -(-self.bits // self.slice_bits)

    def slice_keys(self, key: str) -> list[str]:
        """The keys of the filter at *key*, slice 0 first."""
        return [key] + [f"{key}#{i}" for i in range(1, self.slices)]

    def slice_sizes(self) -> list[int]:
        """Bits in each slice."""
        full, rest = divmod(self.bits, self.slice_bits)
        return [self.slice_bits] * full + ([rest] if rest else [])

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
# small arguments costs more than the script), bits per slice.
_CLAIM = (
    lists.PUSH_LUA
    + """
local p = {struct.unpack('<' .. string.rep('I4', #ARGV[4] / 4), ARGV[4])}
p[#p] = nil  -- the offset after the data
local per, sl = tonumber(ARGV[5]), {}
for j, q in ipairs(p) do
  local i = math.floor(q / per)
  sl[j], p[j] = i > 0 and '#' .. i, q - i * per
end
local function holds(key)
  for j, q in ipairs(p) do
    if redis.call('GETBIT', sl[j] and key .. sl[j] or key, q) == 0 then return false end
  end
  return true
end
if holds(KEYS[1]) or (KEYS[2] ~= KEYS[1] and holds(KEYS[2])) then return 0 end
local expired = {}
for j, q in ipairs(p) do
  local key = sl[j] and KEYS[1] .. sl[j] or KEYS[1]
  redis.call('SETBIT', key, q, 1)
  if ARGV[1] ~= '0' and not expired[key] then
    redis.call('PEXPIREAT', key, ARGV[1])
    expired[key] = true
  end
end
if ARGV[1] ~= '0' then redis.call('PEXPIREAT', KEYS[3], ARGV[1]) end
if KEYS[4] then q_push(KEYS[4], ARGV[2], ARGV[3], false) end
return 1
"""
)

# The first node to open a filter decides its shape; every other node reads it.
_ADOPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HSET', KEYS[1], unpack(ARGV)) end
return redis.call('HGETALL', KEYS[1])
"""

# Allocate the filter whole, now: grown bit by bit, Redis would keep up to 1 MB spare, and a
# Redis without room for it fails here rather than in the middle of the crawl.
# KEYS: filter, parameters. ARGV: expire-at in unix ms (0: never), bits per slice, bits in all.
_RESERVE = """
local per, bits = tonumber(ARGV[2]), tonumber(ARGV[3])
local i = 0
while i * per < bits do
  local key = KEYS[1]
  if i > 0 then key = key .. '#' .. i end
  local last = math.min(per, bits - i * per) - 1
  if redis.call('STRLEN', key) * 8 <= last then redis.call('SETBIT', key, last, 0) end
  if ARGV[1] ~= '0' then redis.call('PEXPIREAT', key, ARGV[1]) end
  i = i + 1
end
if ARGV[1] ~= '0' then redis.call('PEXPIREAT', KEYS[2], ARGV[1]) end
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
            args=[expire_at, score, data, self.bloom.packed_positions(fingerprint), self.bloom.slice_bits],
            client=pipe,
        )

    def _claim_into(self, fingerprint: str, current: str, previous: str, expire_at: Any, client: Any = None) -> Any:
        return self._claim(
            keys=[current, previous, self.params_key],
            args=[expire_at, "", "", self.bloom.packed_positions(fingerprint), self.bloom.slice_bits],
            client=client,
        )

    def forget_shape(self) -> None:
        """Open the filter again at the next claim. A run's start drops a finished run's filter,
        the one this node opened with it: the next node to open one decides its shape, which
        may not be the dropped one's (a filter made before slicing is one key)."""
        self._generation = None

    def keys(self) -> list[str]:
        bloom = self.bloom
        if self._generation is None:
            # Not opened here: the filter in Redis may have another shape than the settings'
            # (other slices), and its own names its keys.
            stored = self._stored_shape()
            bloom = stored[0] if stored is not None else bloom
        live = self.generations.live_keys(self.base)
        return [key for base in live for key in bloom.slice_keys(base)] + [self.params_key]

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
            LAYOUT if b.slices == 1 else SLICED_LAYOUT,
            "slice_bits",
            b.slice_bits,
        ]

    def _stored_shape(self) -> tuple[BloomFilter, float] | None:
        raw = self.server.hgetall(self.params_key)
        if not raw:
            return None
        return _shape_from(raw, self.params_key)

    def _open(self) -> None:
        raw = self._adopt(keys=[self.params_key], args=self._shape_fields())
        bloom, expiry = _shape_from(dict(zip(raw[::2], raw[1::2])), self.params_key)
        if (bloom.capacity, bloom.error_rate, expiry) != (self.bloom.capacity, self.bloom.error_rate, self.expiry):
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
            self.generations = Generations(self.server, expiry)
        # The stored shape, slices too: a filter made before slicing stays one key.
        self.bloom = bloom
        # The shape lives as long as the newest generation it describes, no longer.
        current, _previous, expire_at = self.generations.keys(self.base)
        self._reserve(keys=[current, self.params_key], args=[expire_at, bloom.slice_bits, bloom.bits])

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
        keys, sizes = bloom.slice_keys(key), bloom.slice_sizes()
        if bloom.bytes <= self.SAMPLE_BYTES:
            for slice_key in keys:
                pipe.bitcount(slice_key)
            bits_read = bloom.bits
        elif len(keys) == 1:
            # Positions are uniform, so a few spread stretches tell the fill of the whole filter.
            width = self.SAMPLE_BYTES // 16
            stride = bloom.bytes // 16
            for i in range(16):
                pipe.bitcount(key, i * stride, i * stride + width - 1)
            bits_read = 16 * width * 8
        else:  # the same: a stretch from the start of each of up to 16 slices spread over them
            bits_read = 0
            for i in sorted({n * len(keys) // 16 for n in range(16)}):
                width = min(self.SAMPLE_BYTES // 16, sizes[i] // 8)
                pipe.bitcount(keys[i], 0, width - 1)
                bits_read += width * 8
        kind, *counts = pipe.execute()
        if kind not in (b"string", "string"):
            return 0.0
        return bloom.estimate_count(sum(counts), bits_read)


def _shape_from(raw: dict, key: str) -> tuple[BloomFilter, float]:
    fields = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()
    }
    layout = fields.get("layout")
    if layout not in (LAYOUT, SLICED_LAYOUT):
        raise RuntimeError(
            f"{key}: a Bloom filter of layout {layout!r}; this version reads {LAYOUT!r} and {SLICED_LAYOUT!r}"
        )
    bits = int(fields["bits"])
    bloom = BloomFilter(
        int(fields["capacity"]),
        float(fields["error_rate"]),
        bits,
        int(fields["hashes"]),
        int(fields["slice_bits"]) if layout == SLICED_LAYOUT else bits,
    )
    return bloom, float(fields["expiry"])
