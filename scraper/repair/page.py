"""A page parsed once for repair: its element tree and its JSON-LD items.

Induction evaluates dozens of candidate rules on every page, so each page is parsed once, and
the JSON-LD read once, whatever the number of rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lxml.etree
import lxml.html

# extruct is imported when a repair first reads JSON-LD: importing it pulls in rdflib, requests
# and html5lib (~0.17 s of CPU), which every crawl node would otherwise pay at start.
_JSONLD: Any = None


@dataclass
class Page:
    url: str
    root: Any  # lxml.html.HtmlElement, or None for a page that does not parse
    _jsonld: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def jsonld(self) -> list[dict[str, Any]]:
        """Every JSON-LD object on the page, ``@graph`` members as objects of their own."""
        if self._jsonld is None:
            self._jsonld = _flatten(_read_jsonld(self.root)) if self.root is not None else []
        return self._jsonld


def parse(url: str, html: str | bytes) -> Page:
    try:
        root = lxml.html.document_fromstring(html)
    except (lxml.etree.ParserError, ValueError):  # empty or unparseable: a page with no nodes
        root = None
    return Page(url, root)


def _read_jsonld(root: Any) -> list[Any]:
    global _JSONLD
    if _JSONLD is None:
        from extruct.jsonld import JsonLdExtractor

        _JSONLD = JsonLdExtractor()
    try:
        return _JSONLD.extract_items(root)
    except Exception:  # one broken script must not cost the page its HTML evidence
        return []


def _flatten(items: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        graph = item.get("@graph")
        if isinstance(graph, list):
            out.extend(_flatten(graph))
        else:
            out.append(item)
    return out
