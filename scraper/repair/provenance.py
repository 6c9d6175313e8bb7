"""Which selector produced each field of each item, learnt without a change to the spider.

While a callback runs, its response hands out *recording* selectors: every ``css()``,
``xpath()`` and ``jmespath()`` call (on the response, and chained on what it returned) labels the
selectors it returns with its query chain, and every value read from them (``get()``,
``getall()``, ``re()``/``re_first()``, ``attrib``) is recorded as (chain, value). When the
callback yields a stored item, each of its raw values (as yielded, before the clean pipeline
turns ``"224,98 €"`` into a price) is matched to the recorded outputs, and the item carries the
answer in ``item._sources`` (field -> source), next to ``_origin``: never a stored column.

A source is the query chain, ``>>`` between chained calls, XPath and JMESPath queries prefixed
(``a.product-link >> xpath:@href``, ``.price::text >> re:[\\d.]+``); or, for a value no selector
gave as it is:

* ``<chain> (derived)``: a recorded output contains the value or is contained in it (stripped,
  split, joined to the page's URL with ``response.urljoin``);
* ``url``: the response's URL; ``request``: a value the request carried (``cb_kwargs``, ``meta``);
* ``unknown``: the value is in the page's text but no selector gave it (a regex on
  ``response.text``, a JSON blob parsed by hand);
* ``constant``: the value is nowhere in the page (a literal, or computed).

A value two selectors both gave: fields are matched in the order the item was filled (the order
a callback reads them in), each to the first read of its value at or after the previous field's
read, else to the first read no other field took, else to the first. So two fields with equal
values (a SKU shown twice) keep their own selectors, and one field's value that a breadcrumb also
shows goes to the read next to it. A value is given one source, never several. Reads since the
page's previous item come first, so a listing page's cards each match their own reads.

Cost: selectors are labelled as they are made and values appended to a list; matching is one dict
of the page's outputs and a lookup per field (see docs/guides/provenance.md for the figures).
The response is lent a subclass of its own class for the callback's duration (its selector stays
lazy: a callback that never selects parses nothing), and given its class back after.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

from parsel import Selector as ParselSelector
from parsel.utils import extract_regex
from scrapy.http import TextResponse
from scrapy.selector import Selector

from ..items.base import StoredItem

URL, REQUEST, UNKNOWN, CONSTANT, MISSING = "url", "request", "unknown", "constant", "missing"
DERIVED = " (derived)"
_SHORTEST_PART = 3  # a containment match shorter than this says nothing
_OLDER_SCANNED = 256  # reads before the page's previous item looked into for a derived value


def _join(chain: str, segment: str) -> str:
    return f"{chain} >> {segment}" if chain else segment


class RecordingSelector(Selector):
    """A Scrapy selector that labels what it returns with its query chain and records what is read."""

    __slots__ = ("_chain", "_rec")

    def _label(self, found: Any, chain: str) -> Any:
        rec = self._rec
        for sel in found:
            sel._chain = chain
            sel._rec = rec
        return found

    def xpath(self, query: str, namespaces: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
        return self._label(
            ParselSelector.xpath(self, query, namespaces, **kwargs), _join(self._chain, f"xpath:{query}")
        )

    def css(self, query: str) -> Any:
        # parsel's css() goes through self.xpath(): called on the base class, the chain names the CSS.
        if self.type not in ("html", "xml", "text"):
            return ParselSelector.css(self, query)
        return self._label(ParselSelector.xpath(self, self._css2xpath(query)), _join(self._chain, query))

    def jmespath(self, query: str, **kwargs: Any) -> Any:
        return self._label(ParselSelector.jmespath(self, query, **kwargs), _join(self._chain, f"jmespath:{query}"))

    def get(self) -> Any:
        value = ParselSelector.get(self)
        self._rec.append((self._chain, value))
        return value

    extract = get

    def getall(self) -> list[str]:
        return [self.get()]

    def re(self, regex: Any, replace_entities: bool = True) -> list[str]:
        found = extract_regex(regex, ParselSelector.get(self), replace_entities=replace_entities)
        chain = _join(self._chain, f"re:{getattr(regex, 'pattern', regex)}")
        self._rec.extend((chain, value) for value in found)
        return found

    @property
    def attrib(self) -> dict[str, str]:
        found = dict(ParselSelector.attrib.fget(self))  # type: ignore[attr-defined]
        self._rec.extend((_join(self._chain, f"@{name}"), value) for name, value in found.items())
        return found


def _recording_selector(self: TextResponse) -> Selector:
    found = self._cached_selector
    if found is None:
        found = RecordingSelector(self)
        found._chain, found._rec = "", []
        self._cached_selector = found
    return found


_LENT: dict[type, type] = {}


def _lent_class(cls: type) -> type:
    lent = _LENT.get(cls)
    if lent is None:
        # Same layout (no slots of its own), so an instance can change class both ways.
        lent = type(cls.__name__, (cls,), {"__slots__": (), "_lent": True, "selector": property(_recording_selector)})
        lent.__module__ = cls.__module__
        _LENT[cls] = lent
    return lent


def lend(response: Any) -> None:
    """Make *response* hand out recording selectors until :func:`give_back`."""
    if not isinstance(response, TextResponse):
        return
    own = type(response)
    if own.__dict__.get("_lent"):
        return  # already lent (a middleware called twice)
    existing = response._cached_selector
    if existing is not None and not isinstance(existing, RecordingSelector):
        # Parsed before the callback (by a middleware): the same tree, recorded from now on.
        lent_sel = RecordingSelector(root=existing.root, type=existing.type)
        lent_sel._chain, lent_sel._rec = "", []
        response._cached_selector = lent_sel
    response.__class__ = _lent_class(own)


def give_back(response: Any) -> None:
    """*response*'s own class back (its selector, with what was recorded, stays until released)."""
    lent = type(response)
    if lent.__dict__.get("_lent"):
        response.__class__ = lent.__base__


def records_of(response: Any) -> list[tuple[str, Any]]:
    """What the callback read from *response* so far: (query chain, value), in call order."""
    sel = getattr(response, "_cached_selector", None)
    return sel._rec if isinstance(sel, RecordingSelector) else []


def _present(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, (list, tuple)):
        return any(_present(v) for v in value)
    return True


class _Page:
    """What one page's callback read, indexed as it grows: an item is matched against the reads
    so far without indexing or scanning a long listing page again for each of its items."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self.records = records_of(response)
        self.index: dict[str, list[int]] = {}
        self.indexed = 0
        self._in_text: dict[str, bool] = {}

    def catch_up(self) -> None:
        # The records list is the selector's; made on the first read, so looked up again here.
        if not self.records:
            self.records = records_of(self.response)
        records, index = self.records, self.index
        for i in range(self.indexed, len(records)):
            out = records[i][1]
            if type(out) is str:
                found = index.get(out)
                if found is None:
                    index[out] = [i]
                else:
                    found.append(i)
        self.indexed = len(records)

    def in_text(self, value: str) -> bool:
        found = self._in_text.get(value)
        if found is None:
            text = self.response.text if isinstance(self.response, TextResponse) else ""
            found = self._in_text[value] = value in text
        return found


class _Matcher:
    """One item's fields, matched to its page's reads.

    Fields are matched in the order the item was filled, which is the order a callback reads them
    in: a value goes to its first read at or after the previous field's (the reads since the
    page's previous item first), else to its first read no other field took, else to its first.
    """

    def __init__(self, page: _Page, start: int) -> None:
        self.page = page
        self.records = page.records
        self.start = start
        self.cursor = start
        self.claimed: set[int] = set()

    def pick(self, found: list[int]) -> int:
        claimed = self.claimed
        for k in range(bisect_left(found, self.cursor), len(found)):
            if found[k] not in claimed:
                return found[k]
        return next((i for i in found if i not in claimed), found[0])

    def take(self, *taken: int) -> None:
        self.claimed.update(taken)
        self.cursor = max(self.cursor, max(taken) + 1)

    def exact(self, value: str) -> str | None:
        found = self.page.index.get(value)
        if not found:
            return None
        i = self.pick(found)
        self.take(i)
        return self.records[i][0]

    def one(self, value: Any) -> str:
        if isinstance(value, str):
            found = self.exact(value)
            return found if found is not None else self.unmatched(value)
        if isinstance(value, (list, tuple)):
            return self.many([v for v in value if _present(v)])
        if isinstance(value, (bool, dict)):
            return CONSTANT if isinstance(value, bool) else UNKNOWN
        # A number or date read from the page by the callback itself: its text form was read.
        text = str(value)
        found = self.exact(text)
        return found + DERIVED if found is not None else self.unmatched(text)

    def many(self, parts: list[Any]) -> str:
        """A list (``getall()``, or a slice of it): one chain that gave every part, in order."""
        if not all(isinstance(p, str) for p in parts):
            return UNKNOWN
        records, index = self.records, self.page.index
        first = index.get(parts[0]) or []
        if len(first) > 1:
            cursor, claimed = self.cursor, self.claimed
            first = sorted(first, key=lambda i: (i < cursor, i in claimed))
        for i in first:
            chain = records[i][0]
            taken = [i]
            for part in parts[1:]:
                found = index.get(part) or []
                k = bisect_right(found, taken[-1])
                j = next((j for j in found[k:] if records[j][0] == chain), None)
                if j is None:
                    break
                taken.append(j)
            else:
                self.take(*taken)
                return chain
        source = self.unmatched(parts[0])
        return source if source.endswith(DERIVED) or source in (URL, REQUEST, CONSTANT) else UNKNOWN

    def unmatched(self, value: str) -> str:
        response = self.page.response
        if value == getattr(response, "url", None):
            return URL
        request = getattr(response, "request", None)
        if request is not None and (value in request.cb_kwargs.values() or value in request.meta.values()):
            return REQUEST
        derived = self.derived(value)
        if derived is not None:
            return derived + DERIVED
        return UNKNOWN if self.page.in_text(value) else CONSTANT

    def derived(self, value: str) -> str | None:
        stripped = value.strip()
        if len(stripped) < _SHORTEST_PART:
            return None
        records, start, cursor = self.records, self.start, self.cursor
        # The reads since the previous item, then the page's first reads (its header, say): a
        # listing page's other cards are not scanned for every card.
        older = range(min(start, _OLDER_SCANNED))
        for i in (*range(cursor, len(records)), *range(start, cursor), *older):
            out = records[i][1]
            # Padding on either side is no difference: the one inside the other, as they are.
            if type(out) is str and len(out) >= _SHORTEST_PART and (stripped in out or out in value):
                self.take(i)
                return records[i][0]
        return None


def _match(page: _Page, values: Mapping[str, Any], start: int) -> dict[str, str]:
    page.catch_up()
    matcher = _Matcher(page, start)
    records, index, claimed = page.records, page.index, matcher.claimed
    out: dict[str, str] = {}
    for name, value in values.items():
        # A one-element list (``getall()[-1:]``, a one-paragraph text) is its one element to
        # many(): the same chain and the same read taken.
        one = value[0] if type(value) is list and len(value) == 1 else value
        if type(one) is str:
            found = index.get(one)
            if found is not None and len(found) == 1 and one.strip():
                # The common case, inlined (one read of the value on the page): ~0.3 µs a field.
                i = found[0]
                claimed.add(i)
                if i >= matcher.cursor:
                    matcher.cursor = i + 1
                out[name] = records[i][0]
                continue
        if _present(value):
            out[name] = matcher.one(value)
    return out


def sources(values: Mapping[str, Any], response: Any, start: int = 0) -> dict[str, str]:
    """Field -> source for each present value of *values*, from what was read of *response* so
    far (the reads from position *start* on first: those since the page's previous item)."""
    return _match(_Page(response), values, start)


class PageRecorder:
    """What one response's callback yields, annotated: each stored item gets ``_sources``."""

    def __init__(self, response: Any, on_item: Any = None) -> None:
        self.page = _Page(response)
        self.on_item = on_item
        self.start = 0

    def annotate(self, obj: Any) -> None:
        if not isinstance(obj, StoredItem):
            return
        page = self.page
        obj._sources = _match(page, obj._values, self.start)
        self.start = len(page.records)
        if self.on_item is not None:
            self.on_item(obj)

    def each(self, result: Iterable[Any]) -> Iterator[Any]:
        for obj in result:
            self.annotate(obj)
            yield obj

    async def each_async(self, result: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for obj in result:
            self.annotate(obj)
            yield obj


def item_sources(item: Any) -> dict[str, str]:
    """The sources an item was given when its callback yielded it ({} when none were recorded)."""
    return getattr(item, "_sources", None) or {}


def split_source(source: str) -> tuple[str, bool]:
    """(selector chain or label, whether the value was derived from that selector's output)."""
    if source.endswith(DERIVED):
        return source[: -len(DERIVED)], True
    return source, False
