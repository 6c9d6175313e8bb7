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

from scrapy.utils.datatypes import SequenceExclude

_TAGS = ("$b", "$d", "$x")


class SerializationError(TypeError):
    """A value in a request cannot be represented as JSON. The message names where it sits."""


def _encode(value: Any, path: str) -> Any:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$b": bytes(value).decode("latin-1")}
    if isinstance(value, dict):
        plain = all(isinstance(k, str) for k in value) and not (
            len(value) == 1 and next(iter(value)) in _TAGS
        )
        if plain:
            return {k: _encode(v, f"{path}[{k!r}]") for k, v in value.items()}
        return {"$d": [[_encode(k, path), _encode(v, f"{path}[{k!r}]")] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, SequenceExclude) and isinstance(value.seq, (range, list, tuple, set, frozenset)):
        return {"$x": [_encode(v, f"{path}.seq") for v in sorted(value.seq)]}
    raise SerializationError(f"{path} holds a {type(value).__name__}, which cannot be stored as JSON")


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


def dumps(obj: dict[str, Any]) -> str:
    """Serialize a request dict (``Request.to_dict()``) to a JSON string."""
    return json.dumps(_encode(obj, "request"), separators=(",", ":"), ensure_ascii=False)


def loads(data: str | bytes) -> dict[str, Any]:
    """Parse what :func:`dumps` produced. Raises ``ValueError`` on anything else."""
    obj = json.loads(data)
    if not isinstance(obj, dict) or "url" not in obj:
        raise ValueError("not a serialized request")
    return _decode(obj)
