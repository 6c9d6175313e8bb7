"""JSON serialization of requests for the shared Redis queue.

scrapy-redis pickles requests by default, so anyone who can write to Redis can run code on every
worker. This module is a drop-in ``SCHEDULER_SERIALIZER`` (a module with ``dumps``/``loads``)
that only ever produces and accepts plain JSON.

JSON has no bytes and no non-string keys, while Scrapy's request dicts hold both (headers,
body). They are tagged: ``{"$b": "<latin-1 text>"}`` for bytes (lossless and far smaller than
base64 for the ASCII that headers and bodies mostly are) and ``{"$d": [[key, value], ...]}`` for
dicts whose keys are not all strings, or that would be mistaken for a tag. Scrapy's own
meta value ``SequenceExclude`` (``scrapy fetch`` and ``shell`` put one in
``handle_httpstatus_list``) is tagged ``{"$x": [...]}``: the statuses it excludes.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from scrapy.utils.datatypes import SequenceExclude

_TAGS = ("$b", "$d", "$x")


class SerializationError(TypeError):
    """A value in a request cannot be represented as JSON. The message names where it sits."""


class _NotFinite(Exception):
    """A NaN or infinity: orjson would write it as null, the stdlib keeps it."""


_SCALARS = (str, bool, int)


def _encode(value: Any, path: str | None = None, finite: bool = True) -> Any:
    # *path* (where the value sits, for the error message) is only built once something fails:
    # formatting it for every header and meta key cost more than the encoding itself.
    if value is None or isinstance(value, _SCALARS):
        return value
    if isinstance(value, float):
        if finite and value - value != 0.0:  # NaN and ±inf alone fail this
            raise _NotFinite
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$b": bytes(value).decode("latin-1")}
    if isinstance(value, dict):
        plain = all(isinstance(k, str) for k in value) and not (len(value) == 1 and next(iter(value)) in _TAGS)
        if path is None:
            if plain:
                return {k: _encode(v, None, finite) for k, v in value.items()}
            return {"$d": [[_encode(k, None, finite), _encode(v, None, finite)] for k, v in value.items()]}
        if plain:
            return {k: _encode(v, f"{path}[{k!r}]", finite) for k, v in value.items()}
        return {"$d": [[_encode(k, path, finite), _encode(v, f"{path}[{k!r}]", finite)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        if path is None:
            return [_encode(v, None, finite) for v in value]
        return [_encode(v, f"{path}[{i}]", finite) for i, v in enumerate(value)]
    if isinstance(value, SequenceExclude) and isinstance(value.seq, (range, list, tuple, set, frozenset)):
        return {"$x": [_encode(v, None if path is None else f"{path}.seq", finite) for v in sorted(value.seq)]}
    if path is None:
        raise _Unencodable
    raise SerializationError(f"{path} holds a {type(value).__name__}, which cannot be stored as JSON")


class _Unencodable(Exception):
    """Something cannot be stored: encode again, naming where it sits."""


def _encode_request(obj: dict[str, Any]) -> Any:
    """:func:`_encode` of a request dict, in fewer steps for what every request holds: its
    top-level strings and numbers as they are, and its headers (bytes names, lists of bytes
    values). The output is what :func:`_encode` writes."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if type(key) is not str or key in _TAGS:
            return _encode(obj)
        if value is None or isinstance(value, _SCALARS):
            out[key] = value
        elif key == "headers" and type(value) is dict:
            out[key] = _encode_headers(value)
        else:
            out[key] = _encode(value)
    return out


def _encode_headers(headers: dict[Any, Any]) -> Any:
    if not headers:
        return {}
    pairs = []
    for name, values in headers.items():
        if type(name) is not bytes or type(values) is not list or not all(type(v) is bytes for v in values):
            return _encode(headers)
        pairs.append([{"$b": name.decode("latin-1")}, [{"$b": v.decode("latin-1")} for v in values]])
    return {"$d": pairs}


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            if "$b" in value:
                return value["$b"].encode("latin-1")
            if "$d" in value:
                return {_freeze(_decode(k)): _decode(v) for k, v in value["$d"]}
            if "$x" in value:
                return SequenceExclude(frozenset(_decode(value["$x"])))
        return {k: _decode(v) for k, v in value.items()}
    return value


def _freeze(key: Any) -> Any:
    # A key that was a tuple comes back as a list; make it hashable again.
    return tuple(key) if isinstance(key, list) else key


def dumps(obj: dict[str, Any]) -> bytes:
    """Serialize a request dict (``Request.to_dict()``) to JSON (UTF-8 bytes)."""
    try:
        # orjson writes the same compact UTF-8 JSON several times faster than the stdlib;
        # every request queued and every one popped pays for this.
        return orjson.dumps(_encode_request(obj) if type(obj) is dict else _encode(obj))
    except _Unencodable:
        _encode(obj, "request")  # raises SerializationError naming the value
        raise AssertionError("unreachable") from None
    except (_NotFinite, TypeError):  # NaN/inf, or an int beyond 64 bits: the stdlib keeps them
        encoded = _encode(obj, "request", finite=False)
        return json.dumps(encoded, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def loads(data: str | bytes) -> dict[str, Any]:
    """Parse what :func:`dumps` produced. Raises ``ValueError`` on anything else."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        obj = json.loads(data)  # NaN, Infinity, huge ints: what the stdlib fallback wrote
    if not isinstance(obj, dict) or "url" not in obj:
        raise ValueError("not a serialized request")
    # Every tag is a key beginning with "$": JSON without a string that begins so holds none,
    # and needs no second walk.
    if (b'"$' if isinstance(data, (bytes, bytearray)) else '"$') not in data:
        return obj
    return _decode_request(obj)


def _decode_request(obj: dict[str, Any]) -> dict[str, Any]:
    """:func:`_decode` of a request dict (never itself a tag: it holds "url"), its headers in
    fewer steps."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key == "headers" and type(value) is dict and len(value) == 1 and "$d" in value:
            out[key] = _decode_headers(value)
        elif type(value) is dict or type(value) is list:
            out[key] = _decode(value)
        else:
            out[key] = value
    return out


def _decode_headers(tagged: dict[str, Any]) -> Any:
    headers = {}
    for pair in tagged["$d"]:
        if type(pair) is not list or len(pair) != 2:
            return _decode(tagged)
        name, values = pair
        if type(name) is not dict or len(name) != 1 or type(name.get("$b")) is not str or type(values) is not list:
            return _decode(tagged)
        decoded = []
        for v in values:
            if type(v) is not dict or len(v) != 1 or type(v.get("$b")) is not str:
                return _decode(tagged)
            decoded.append(v["$b"].encode("latin-1"))
        headers[name["$b"].encode("latin-1")] = decoded
    return headers
