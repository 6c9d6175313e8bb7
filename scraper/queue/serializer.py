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

Queue entries use a compact form of the same JSON (:func:`dumps_compact`): every queued request
pays for its entry's length in Redis memory. It keeps ``"url"`` as it is (tools and people read
it with ``jq .url``), holds the callback under ``"$"`` (present, possibly null, in every compact
entry: that key is how :func:`loads` knows the form), leaves out the errback and the headers when
there are none, writes the other fields under one-letter keys (:data:`SHORT_KEYS`), the headers as
``{"Name": "value"}`` (a list for several values) and the body as latin-1 text. :func:`loads`
reads both forms and returns the same request dict. A dict that itself holds a ``"$"`` key is
tagged ``$d`` in either form, so nothing else reads as compact.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from scrapy.utils.datatypes import SequenceExclude

_TAGS = ("$b", "$d", "$x")
# The compact form's callback key, and its mark (see the module's docstring).
_COMPACT = "$"

#: A request dict's fields in the compact form. "url" and the callback ("$") are not here; an
#: attribute of a Request subclass that is not here keeps its own name.
SHORT_KEYS = {
    "errback": "e",
    "headers": "h",
    "meta": "m",
    "method": "v",
    "body": "b",
    "cookies": "c",
    "encoding": "n",
    "priority": "p",
    "dont_filter": "f",
    "flags": "g",
    "cb_kwargs": "k",
    "_class": "y",
}
_LONG_KEYS = {short: name for name, short in SHORT_KEYS.items()}


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
        plain = (
            all(isinstance(k, str) for k in value)
            and not (len(value) == 1 and next(iter(value)) in _TAGS)
            and _COMPACT not in value
        )
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
        if type(key) is not str or key in _TAGS or key == _COMPACT:
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


def dumps_compact(obj: dict[str, Any]) -> bytes:
    """A request dict (``request_to_dict``) in the compact form, for a queue entry; a dict that
    form cannot hold exactly (an unusual shape, a NaN, an int beyond 64 bits) in :func:`dumps`'
    form, which :func:`loads` reads as well. Raises :class:`SerializationError` as :func:`dumps`."""
    try:
        compact = _compact(obj)
        if compact is not None:
            return orjson.dumps(compact)
    except (_Unencodable, _NotFinite, TypeError):  # TypeError: an int beyond 64 bits
        pass
    return dumps(obj)


# The fields request_to_dict always writes: restored by loads when left out.
_ALWAYS = frozenset(("url", "callback", "errback", "headers"))


def _compact(obj: Any) -> dict[str, Any] | None:
    """The compact form of *obj*, or None where it would not read back exactly."""
    # Every queued request pays for this: the fields every request has come first, without a loop.
    if type(obj) is not dict:
        return None
    try:
        url, callback, errback, headers = obj["url"], obj["callback"], obj["errback"], obj["headers"]
    except KeyError:
        return None
    if type(url) is not str or type(headers) is not dict:
        return None
    if (callback is not None and type(callback) is not str) or (errback is not None and type(errback) is not str):
        return None
    out: dict[str, Any] = {"url": url, _COMPACT: callback}
    if errback is not None:
        out["e"] = errback
    if headers:
        compact = _compact_headers(headers)
        if compact is None:
            return None
        out["h"] = compact
    if len(obj) == len(_ALWAYS):
        return out
    for key, value in obj.items():
        if key in _ALWAYS:
            continue
        short = SHORT_KEYS.get(key)
        if short is None:
            if type(key) is not str or key in _LONG_KEYS or key.startswith("$"):
                return None  # it would read back as another field, or as a tag
            short = key
        if key == "body":
            if type(value) is not bytes:
                return None
            value = value.decode("latin-1")
        elif not (value is None or isinstance(value, _SCALARS)):
            value = _encode(value)  # raises _NotFinite for NaN and infinities: dumps' form keeps them
        out[short] = value
    return out


def _compact_headers(headers: dict[Any, Any]) -> dict[str, Any] | None:
    # Names and values are bytes: latin-1 text is lossless, and ASCII (what they mostly are)
    # stays as it is. One value (the usual case) is written alone, several as a list.
    out: dict[str, Any] = {}
    for name, values in headers.items():
        if type(name) is not bytes or type(values) is not list:
            return None
        if len(values) == 1 and type(values[0]) is bytes:
            out[name.decode("latin-1")] = values[0].decode("latin-1")
        elif all(type(v) is bytes for v in values):
            out[name.decode("latin-1")] = [v.decode("latin-1") for v in values]
        else:
            return None
    return out


def _expand(obj: dict[str, Any]) -> dict[str, Any]:
    """The request dict of a compact entry, as request_to_dict made it."""
    out: dict[str, Any] = {"url": obj["url"], "callback": obj[_COMPACT], "errback": None, "headers": {}}
    if len(obj) == 2:  # a URL and a callback: the commonest entry, read once per pop
        return out
    for short, value in obj.items():
        if short == "url" or short == _COMPACT:
            continue
        key = _LONG_KEYS.get(short, short)
        if key == "headers":
            out[key] = _expand_headers(value)
        elif key == "body":
            if type(value) is not str:
                raise ValueError("a compact entry's body is latin-1 text")
            out[key] = value.encode("latin-1")
        elif type(value) is dict or type(value) is list:
            out[key] = _decode(value)
        else:
            out[key] = value
    return out


def _expand_headers(value: Any) -> dict[bytes, list[bytes]]:
    if type(value) is not dict:
        raise ValueError("a compact entry's headers are a JSON object")
    headers = {}
    for name, values in value.items():
        if type(values) is str:
            headers[name.encode("latin-1")] = [values.encode("latin-1")]
        elif type(values) is list and all(type(v) is str for v in values):
            headers[name.encode("latin-1")] = [v.encode("latin-1") for v in values]
        else:
            raise ValueError("a compact entry's header values are text")
    return headers


def loads(data: str | bytes) -> dict[str, Any]:
    """Parse what :func:`dumps` or :func:`dumps_compact` produced. Raises ``ValueError`` on
    anything else."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        obj = json.loads(data)  # NaN, Infinity, huge ints: what the stdlib fallback wrote
    if type(obj) is dict and _COMPACT in obj and "url" in obj:
        return _expand(obj)
    if type(obj) is dict and "url" not in obj and len(obj) == 1 and "$d" in obj:
        obj = _decode(obj)  # a request dict whose own keys had to be tagged (one of them "$")
        if isinstance(obj, dict) and "url" in obj:
            return obj
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
