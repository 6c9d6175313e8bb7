"""Request <-> dict conversion for the shared queue, without pickle and without surprises.

Scrapy's ``Request.to_dict`` finds the callback's name by scanning every member of the spider,
once per request; on a crawl that enqueues thousands of requests per second that scan is a
measurable share of the CPU, so names are cached per function here. On the way back a ``_class``
written by someone with Redis access must not make a worker import arbitrary modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scrapy import Request, Spider
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.misc import load_object

from .serializer import SerializationError

# Only these packages may name the request class of a queued request.
_ALLOWED_CLASS_PREFIXES = ("scrapy.", "scraper.")
# How Scrapy's "no spider callback" marker (robots.txt, the components' own requests) is stored:
# not a method name, since no spider method may be called for such a request.
NO_CALLBACK_NAME = "scrapy.http.request.NO_CALLBACK"
# Versions before the scraping-API client was private sent the API's own calls (the key in
# their headers or URL) through the downloader under this meta flag, and on errors they could
# end up queued or dead-lettered. Such an entry is never fetched or shown again: it is deleted.
LEAKED_API_CALL_META = "_scraping_api_call"


def is_leaked_api_call(data: dict[str, Any]) -> bool:
    """A stored request that is a scraping-API call of an earlier version, holding the key."""
    meta = data.get("meta") if isinstance(data, dict) else None
    return isinstance(meta, dict) and bool(meta.get(LEAKED_API_CALL_META))


def _callback_name(spider: Spider, func: Callable[..., Any] | str | None, cache: dict[Any, str]) -> str | None:
    if func is None or isinstance(func, str):
        return func
    if func is NO_CALLBACK:
        return NO_CALLBACK_NAME
    key = getattr(func, "__func__", func)
    name = cache.get(key)
    if name is not None:
        return name
    name = getattr(func, "__name__", None)
    owner = getattr(func, "__self__", None)
    if owner is not spider or name is None or getattr(getattr(spider, name, None), "__func__", None) is not key:
        raise SerializationError(
            f"callback {func!r} is not a method of spider {spider.name!r}; "
            "queued requests can only call the spider's own methods"
        )
    cache[key] = name
    return name


# What a plain Request holds unless told otherwise: left out of the stored dict (a plain GET
# request is then about half as long, and cheaper to encode, store and decode); the
# constructor puts them back. Only for Request itself: a subclass may default otherwise.
_DEFAULTS = {
    "method": "GET",
    "body": b"",
    "cookies": {},
    "meta": {},
    "encoding": "utf-8",
    "priority": 0,
    "dont_filter": False,
    "flags": [],
    "cb_kwargs": {},
}


def request_to_dict(request: Request, spider: Spider, cache: dict[Any, str]) -> dict[str, Any]:
    """Like ``Request.to_dict(spider=...)``, with the callback-name lookup cached and a plain
    Request's default values left out."""
    data: dict[str, Any] = {
        "url": request.url,
        "callback": _callback_name(spider, request.callback, cache),
        "errback": _callback_name(spider, request.errback, cache),
        "headers": dict(request.headers),
    }
    plain = type(request) is Request
    for attr in request.attributes:
        if attr in data:
            continue
        value = getattr(request, attr)
        default = _DEFAULTS.get(attr) if plain else None
        if default is not None and value == default and type(value) is type(default):
            continue
        data[attr] = value
    if not plain:
        data["_class"] = f"{type(request).__module__}.{type(request).__name__}"
    return data


_METHODS = "_queue_methods"


def _spider_method(spider: Spider, name: str) -> Any:
    """*spider*'s method *name*, the same bound method object for every request rebuilt.

    Scrapy checks each callback for a generator's return value from its source, and caches the
    answer weakly by the callable: a bound method made anew per request dies with its request,
    so the check read and parsed the callback's source again about once in 20 pages. One object
    per name, kept on the spider, stays in that cache (and saves a getattr per request)."""
    methods = getattr(spider, "__dict__", {}).get(_METHODS)
    if methods is None:
        methods = {}
        if hasattr(spider, "__dict__"):
            spider.__dict__[_METHODS] = methods
    method = methods.get(name)
    if method is None:
        method = getattr(spider, name, None)
        if not callable(method):
            raise ValueError(f"spider {spider.name!r} has no method {name!r}")
        methods[name] = method
    return method


def share_callback(request: Request, spider: Spider) -> Request:
    """*request* (one this process queued, handed back as it is) calling the spider's shared
    bound method (see :func:`_spider_method`) instead of the one it was built with.

    The spider's ``self.parse`` makes a new bound method each time: Scrapy's cache of its source
    check, weak by the callable, lost it with its request (on the demo shop ~80 more source reads
    and parses a 2,316-page crawl than Scrapy's memory queue, ~6.7M instructions each). Equal to
    the one it replaces: the same function of the same spider."""
    func = request.callback
    if getattr(func, "__self__", None) is spider:
        shared = _spider_method(spider, func.__name__)
        if shared is not func and getattr(shared, "__func__", None) is func.__func__:
            request.callback = shared
    return request


def request_from_dict(data: dict[str, Any], spider: Spider) -> Request:
    """Rebuild a request; refuse request classes from outside Scrapy and this project."""
    cls: type[Request] = Request
    class_path = data.get("_class")
    if class_path:
        if not str(class_path).startswith(_ALLOWED_CLASS_PREFIXES) and not str(class_path).startswith(
            type(spider).__module__ + "."
        ):
            raise ValueError(f"request class {class_path!r} is not allowed")
        cls = load_object(class_path)
        if not (isinstance(cls, type) and issubclass(cls, Request)):
            raise ValueError(f"{class_path!r} is not a Request class")
    kwargs = {k: v for k, v in data.items() if k in cls.attributes}
    for attr in ("callback", "errback"):
        name = data.get(attr)
        if name == NO_CALLBACK_NAME and attr == "callback":
            kwargs[attr] = NO_CALLBACK
        elif name:
            kwargs[attr] = _spider_method(spider, str(name))
    if cls is not Request:
        return cls(**kwargs)
    # The stored URL is a Request's own ``url``, escaped when that request was built: escaping
    # it again (w3lib's safe_url_string, ~18 µs, nearly half of rebuilding a request) changes
    # nothing. ``verbatim_url`` has Scrapy take it as it is; the flag is dropped again after,
    # unless the request had it itself.
    meta = kwargs.get("meta")
    if meta and "verbatim_url" in meta:
        return cls(**kwargs)
    kwargs["meta"] = {**meta, "verbatim_url": True} if meta else {"verbatim_url": True}
    request = cls(**kwargs)
    del request.meta["verbatim_url"]
    return request
