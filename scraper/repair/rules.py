"""A rule: where a field's value is on a page, written as a spider would write it.

``str(rule)`` is the rule's spec and :meth:`Rule.parse` reads it back, along with the forms a
spider already uses: CSS (``span.price::text``, ``meta[itemprop=price]::attr(content)``), XPath
(``//span[@class="price"]/text()``, ``//div/@data-price``, or a bare path whose nodes are read
whole, as ``string()`` reads them), and ``jsonld:Product/offers.price`` for a JSON-LD leaf.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import lxml.etree
from cssselect import HTMLTranslator

from .page import Page

__all__ = ["Rule"]

TEXT = "text"  # the node's whole text, descendants included (XPath's string())
OWN = "own"  # the node's own text nodes only
JSONLD = "jsonld"

_CSS_ATTR = re.compile(r"::attr\(([^)]+)\)\s*$")
_XPATH_ATTR = re.compile(r"/@([\w:.-]+)$")
_LEAF = (str, int, float)


@dataclass(frozen=True)
class Rule:
    """``path`` is an XPath (or, for ``read == "jsonld"``, ``Type/key.key``); ``read`` is
    ``text``, ``own``, ``@name`` (an attribute) or ``jsonld``."""

    path: str
    read: str

    @classmethod
    def parse(cls, spec: str) -> Rule:
        spec = spec.strip()
        if spec.startswith("jsonld:"):
            return cls(spec[len("jsonld:") :], JSONLD)
        if spec.startswith(("/", "(", "./", "descendant")):
            if spec.endswith("/text()"):
                return cls(spec[: -len("/text()")], OWN)
            attr = _XPATH_ATTR.search(spec)
            if attr:
                return cls(spec[: attr.start()], "@" + attr.group(1))
            return cls(spec, TEXT)
        attr = _CSS_ATTR.search(spec)
        if attr:
            return cls(_css(spec[: attr.start()]), "@" + attr.group(1).strip())
        if spec.endswith("::text"):
            return cls(_css(spec[: -len("::text")]), OWN)
        return cls(_css(spec), TEXT)

    def __str__(self) -> str:
        if self.read == JSONLD:
            return f"jsonld:{self.path}"
        if self.read == OWN:
            return f"{self.path}/text()"
        if self.read.startswith("@"):
            return f"{self.path}/{self.read}"
        return self.path

    def values(self, page: Page) -> list[str]:
        """The raw text of every node the rule selects on *page*, in document order."""
        if page.root is None:
            return []
        if self.read == JSONLD:
            return _jsonld_values(page.jsonld, self.path)
        try:
            nodes = _compiled(self.path)(page.root)
        except lxml.etree.XPathError:
            return []
        if not isinstance(nodes, list):
            return [str(nodes)]
        out: list[str] = []
        for node in nodes:
            if isinstance(node, str):
                out.append(str(node))
            elif self.read == TEXT:
                out.append("".join(node.itertext()))
            elif self.read == OWN:
                out.append(own_text(node))
            else:
                value = node.get(self.read[1:])
                if value is not None:
                    out.append(value)
        return out

    @property
    def positional(self) -> int:
        """How many steps pick a node by its position: what breaks first when a page changes."""
        return len(re.findall(r"\[\d+\]", self.path))

    @property
    def named(self) -> bool:
        """Whether the node itself is named (class, id, itemprop, attribute, label), not only its
        tag: ``//meta/@content`` reads one node today and the next ``og:`` tag tomorrow."""
        last = self.path.rsplit("/", 1)[-1]
        if self.read.startswith("@"):  # [@content] when reading @content names nothing
            last = last.replace(f"[{self.read}]", "")
        return self.read == JSONLD or bool(re.search(r"\[(?!\d+\])", last)) or "following-sibling" in last


def own_text(node: Any) -> str:
    return (node.text or "") + "".join(child.tail or "" for child in node)


@lru_cache(maxsize=4096)
def _compiled(path: str) -> lxml.etree.XPath:
    return lxml.etree.XPath(path)


def _css(css: str) -> str:
    return HTMLTranslator().css_to_xpath(css.strip(), prefix="//")


def _jsonld_values(items: list[dict[str, Any]], spec: str) -> list[str]:
    kind, _, keys = spec.partition("/")
    out: list[str] = []
    for item in items:
        if kind != "*" and kind not in _types(item):
            continue
        _walk(item, keys.split(".") if keys else [], out)
    return out


def _types(item: dict[str, Any]) -> tuple[str, ...]:
    kind = item.get("@type")
    if isinstance(kind, str):
        return (kind,)
    if isinstance(kind, list):
        return tuple(k for k in kind if isinstance(k, str))
    return ()


# schema.org's amounts whose currency is their object's priceCurrency (Offer, PriceSpecification).
_AMOUNTS = frozenset({"price", "lowPrice", "highPrice", "minPrice", "maxPrice"})


def leaf_text(parent: dict[str, Any], key: str, value: Any) -> str:
    """What a JSON-LD leaf says: an amount with its object's ``priceCurrency`` ("190.93 EUR"),
    as a page shows a price with its mark; anything else as it is."""
    currency = parent.get("priceCurrency")
    if key in _AMOUNTS and isinstance(currency, str) and currency.strip():
        return f"{value} {currency.strip()}"
    return str(value)


def _walk(value: Any, keys: list[str], out: list[str]) -> None:
    if isinstance(value, list):
        for element in value:
            _walk(element, keys, out)
    elif not keys:
        if isinstance(value, _LEAF) and not isinstance(value, bool):
            out.append(str(value))
    elif isinstance(value, dict) and keys[0] in value:
        inner = value[keys[0]]
        if len(keys) == 1 and isinstance(inner, _LEAF) and not isinstance(inner, bool):
            out.append(leaf_text(value, keys[0], inner))
        else:
            _walk(inner, keys[1:], out)


def jsonld_type(item: dict[str, Any]) -> str:
    """The name a rule gives *item*'s kind: its first ``@type``, ``*`` for an untyped object."""
    kinds = _types(item)
    return kinds[0] if kinds else "*"
