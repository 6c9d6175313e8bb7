"""Every request the queue takes comes back the same: property-based, over what a spider may set."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import FormRequest

from scraper.queue import serializer
from scraper.queue.requests import request_from_dict, request_to_dict, share_callback


class _Spider(Spider):
    name = "roundtrip"

    def parse(self, response):  # pragma: no cover - only named
        pass

    def failed(self, failure):  # pragma: no cover - only named
        pass


SPIDER = _Spider()
# Strings that look like the serializer's tags ("$b", "$d", …) and plain ones.
text = st.one_of(
    st.text(max_size=8), st.sampled_from(["$b", "$d", "$x", "$", '"$', "utf-8", "GET", "", "verbatim_url"])
)
scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), text, st.floats(allow_nan=False, allow_infinity=False)
)
json_like = st.recursive(
    scalar, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)), max_leaves=8
)
header_name = st.text(alphabet="abcdefXYZ-", min_size=1, max_size=6)
header_value = st.text(alphabet="abc 123;=$", max_size=8)


@st.composite
def requests(draw):
    kwargs = dict(
        # A rebuilt request takes its stored URL as it is (it was escaped when first built):
        # hosts to encode, spaces, "%", non-ASCII and fragments show that nothing changes.
        url=draw(st.sampled_from(["http://shop.test/", "https://bücher.example/", "http://EXAMPLE.com:8080/a b"]))
        + draw(
            st.one_of(
                st.text(alphabet="abc/?=&", max_size=10),
                st.text(st.characters(blacklist_categories=("Cs",)), max_size=10),
            )
        ),
        callback=draw(st.sampled_from([None, SPIDER.parse])),
        errback=draw(st.sampled_from([None, SPIDER.failed])),
        method=draw(st.sampled_from(["GET", "POST", "HEAD", "PUT"])),
        headers=draw(st.dictionaries(header_name, header_value, max_size=3)),
        body=draw(st.binary(max_size=12)),
        cookies=draw(st.dictionaries(st.text(alphabet="abc", min_size=1, max_size=3), st.text(max_size=4), max_size=2)),
        meta=draw(st.dictionaries(text, json_like, max_size=3)),
        encoding=draw(st.sampled_from(["utf-8", "latin-1"])),
        priority=draw(st.integers(-100, 100)),
        dont_filter=draw(st.booleans()),
        flags=draw(st.lists(st.text(max_size=4), max_size=2)),
        cb_kwargs=draw(st.dictionaries(st.text(alphabet="abc", min_size=1, max_size=3), json_like, max_size=2)),
    )
    cls = draw(st.sampled_from([Request, FormRequest]))
    try:
        return cls(**kwargs)
    except UnicodeEncodeError:  # a URL its own encoding cannot write: no such request exists
        assume(False)


def _state(request: Request) -> dict:
    state = {attr: getattr(request, attr) for attr in request.attributes if attr != "headers"}
    state["headers"] = {k: list(v) for k, v in request.headers.items()}
    state["class"] = type(request)
    return state


@settings(max_examples=300, deadline=None)
@given(requests())
def test_a_queued_request_comes_back_unchanged(request: Request) -> None:
    stored = serializer.dumps(request_to_dict(request, SPIDER, {}))
    back = request_from_dict(serializer.loads(stored), SPIDER)
    assert _state(back) == _state(request)
    # Equal is not enough where types differ (b"" and "", 0 and False): each value keeps its type.
    for attr in ("body", "priority", "dont_filter", "method", "encoding"):
        assert type(getattr(back, attr)) is type(getattr(request, attr)), attr


headers_like = st.dictionaries(
    st.one_of(st.binary(max_size=6), text),
    st.one_of(st.lists(st.binary(max_size=6), max_size=3), json_like),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(text, st.one_of(json_like, st.binary(max_size=4)), max_size=4), headers_like)
def test_the_request_shortcuts_write_and_read_what_the_general_walk_does(fields: dict, headers: dict) -> None:
    # The serializer takes shortcuts for the fields every request has (headers above all);
    # whatever shape a request dict has, it stores and reads the same as the general walk.
    import orjson

    data = {"url": "http://shop.test/", **fields, "headers": headers}
    stored = serializer.dumps(data)
    assert stored == orjson.dumps(serializer._encode(data))
    assert serializer.loads(stored) == serializer._decode(orjson.loads(stored))


@settings(max_examples=300, deadline=None)
@given(requests())
def test_a_queued_request_comes_back_unchanged_from_its_compact_entry(request: Request) -> None:
    data = request_to_dict(request, SPIDER, {})
    stored = serializer.dumps_compact(data)
    back = request_from_dict(serializer.loads(stored), SPIDER)
    assert _state(back) == _state(request)
    for attr in ("body", "priority", "dont_filter", "method", "encoding"):
        assert type(getattr(back, attr)) is type(getattr(request, attr)), attr
    # The very dict the full form reads back as: whatever reads one form reads the other.
    assert serializer.loads(stored) == serializer.loads(serializer.dumps(data))


def test_every_field_away_from_its_default_comes_back_from_the_compact_entry() -> None:
    import orjson

    request = Request(
        "http://shop.test/search?q=lamp",
        callback=SPIDER.parse,
        errback=SPIDER.failed,
        method="PUT",
        headers={"Referer": "http://shop.test/", "Accept": ["text/html", "*/*"]},
        body=b"\x00\xff{}",
        cookies={"session": "1"},
        meta={"depth": 3, "$": {"$": 1}, "raw": b"\x01", "pair": [1, 2.5]},
        encoding="latin-1",
        priority=-7,
        dont_filter=True,
        flags=["cached"],
        cb_kwargs={"page": 2},
    )
    stored = serializer.dumps_compact(request_to_dict(request, SPIDER, {}))
    written = orjson.loads(stored)
    assert set(written) == {"url", "$", *serializer.SHORT_KEYS.values()} - {"y"}  # every field, short
    assert written["h"] == {"Referer": "http://shop.test/", "Accept": ["text/html", "*/*"]}
    assert written["b"] == "\x00\xff{}" and written["$"] == "parse" and written["e"] == "failed"
    back = request_from_dict(serializer.loads(stored), SPIDER)
    assert _state(back) == _state(request)

    # At every default a request is its URL and callback: nothing else is written.
    plain = Request("http://shop.test/p/1.html")
    alone = b'{"url":"http://shop.test/p/1.html","$":null}'
    assert serializer.dumps_compact(request_to_dict(plain, SPIDER, {})) == alone
    assert _state(request_from_dict(serializer.loads(alone), SPIDER)) == _state(plain)

    # A subclass keeps every field (its defaults may differ) and names its class.
    form = FormRequest("http://shop.test/f", formdata={"a": "1"}, callback=SPIDER.parse)
    stored = serializer.dumps_compact(request_to_dict(form, SPIDER, {}))
    assert orjson.loads(stored)["y"] == "scrapy.http.request.form.FormRequest"
    assert _state(request_from_dict(serializer.loads(stored), SPIDER)) == _state(form)


def test_what_the_compact_form_cannot_hold_exactly_is_written_in_the_full_form() -> None:
    base = {"url": "http://shop.test/", "callback": None, "errback": None, "headers": {}}
    for data in (
        {**base, "meta": {"ratio": float("nan")}},  # orjson has no NaN
        {**base, "meta": {"big": 2**70}},  # nor ints beyond 64 bits
        {**base, "body": "text, not bytes"},  # would come back as bytes
        {**base, "headers": {"Referer": [b"x"]}},  # a str name: would come back as bytes
        {**base, "v": "a field of the compact form's own name"},
        {"url": "http://shop.test/", "callback": None},  # not every field request_to_dict writes
    ):
        stored = serializer.dumps_compact(data)
        assert stored == serializer.dumps(data)
        back = serializer.loads(stored)
        assert back.keys() == data.keys() and back["url"] == data["url"]
    # A request dict of someone else's with a "$" key of its own never reads as compact.
    for data in ({"url": "u", "$": "not a callback"}, {"url": "u", "meta": {"$": 1}}):
        assert serializer.loads(serializer.dumps(data)) == data


def test_requests_rebuilt_share_one_bound_method_per_callback() -> None:
    """Scrapy caches its check of a callback's source weakly by the callable: requests rebuilt
    from the queue hand it one object per callback, which the cache keeps, not one per request."""
    spider = _Spider()
    stored = [request_to_dict(Request(f"https://example.com/{i}", callback=spider.parse, errback=spider.failed), spider, {}) for i in range(3)]  # fmt: skip
    back = [request_from_dict(serializer.loads(serializer.dumps(d)), spider) for d in stored]
    assert back[0].callback is back[1].callback is back[2].callback
    assert back[0].errback is back[2].errback
    assert back[0].callback == spider.parse and back[0].errback == spider.failed
    # Another spider object's requests get its own methods.
    other = _Spider()
    assert request_from_dict(serializer.loads(serializer.dumps(stored[0])), other).callback.__self__ is other
    with pytest.raises(ValueError, match="has no method"):
        request_from_dict({**stored[0], "callback": "missing"}, spider)


def test_a_request_handed_back_as_it_is_calls_the_shared_bound_method_too() -> None:
    spider = _Spider()
    kept = [Request(f"https://example.com/{i}", callback=spider.parse, errback=spider.failed) for i in range(2)]
    rebuilt = request_from_dict(request_to_dict(kept[0], spider, {}), spider)
    back = [share_callback(r, spider) for r in kept]
    assert back[0].callback is back[1].callback is rebuilt.callback
    assert back[0].callback == spider.parse and back[0].errback == spider.failed
    # Another spider's method, a plain function or no callback: left as they are.
    other, func = _Spider(), lambda response: None
    for callback in (other.parse, func, None):
        assert share_callback(Request("https://example.com/", callback=callback), spider).callback is callback
