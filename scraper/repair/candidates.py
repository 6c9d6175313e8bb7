"""Candidate rules: from the nodes that hold a page's known value, the rules that select them.

A node holds the value when the field's own cleaner reads exactly the known value from its
whole text, its own text, one of its attributes, or a JSON-LD leaf. Each such node is then
described in several ways (its tag and classes, id, itemprop, an attribute it carries, a
classed ancestor above it, the label beside it, its position under a stable parent), since
which of them survived the redesign is exactly what is not known yet. Nothing here judges a
rule: that is verification's job, on every page.
"""

from __future__ import annotations

from typing import Any

from .evidence import Reader
from .page import Page
from .rules import JSONLD, OWN, TEXT, Rule, jsonld_type, leaf_text, own_text

__all__ = ["candidates"]

_SKIP = frozenset({"script", "style", "noscript", "template", "svg"})
# Attributes that name or style a node, or point elsewhere: a value there is a coincidence.
_NOT_VALUES = frozenset({"class", "style", "id", "href", "src", "srcset", "rel", "type", "lang"})
_NAMING = ("itemprop", "property", "name")
_ANCESTORS = 2  # classed ancestors to anchor on; farther ones add length, not meaning
_CLASSES = 3
_LABEL = 40  # longest label text taken as a field's caption ("Price", "Unit price:")


def candidates(page: Page, known: Any, read: Reader, longest: int) -> set[Rule]:
    """Every rule that selects a node holding *known* on *page*. *longest* bounds the text
    tried: a node whose text is far longer than any known value holds more than the value."""
    found: set[Rule] = set()
    if page.root is None:
        return found
    for node in page.root.iter():
        tag = node.tag
        if not isinstance(tag, str) or tag in _SKIP or not tag.replace("-", "").isalnum():
            continue
        for name, value in node.attrib.items():
            if name not in _NOT_VALUES and len(value) <= longest and read(value) == known:
                found.update(_describe(node, "@" + name))
        if len(node):
            whole = "".join(node.itertext())
            if len(whole) <= longest and read(whole) == known:
                found.update(_describe(node, TEXT))
            own = own_text(node)
            if own.strip() and own != whole and len(own) <= longest and read(own) == known:
                found.update(_describe(node, OWN))
        elif node.text and len(node.text) <= longest and read(node.text) == known:
            found.update(_describe(node, TEXT))
    for item in page.jsonld:
        _jsonld(item, jsonld_type(item), [], known, read, found)
    return found


def _describe(node: Any, how: str) -> list[Rule]:
    own = _steps(node, how)
    paths = [f"//{step}" for step in own]
    label = _label(node)
    if label:
        paths.append(label)
    anchored = 0
    child = node
    ancestor = node.getparent()
    indexed: list[str] = [_indexed(node)]
    plain: list[str] = [node.tag]
    while ancestor is not None and anchored < _ANCESTORS and ancestor.tag not in ("body", "html"):
        marks = _marks(ancestor)
        if marks:
            anchored += 1
            for mark in marks:
                paths.extend(f"//{mark}//{step}" for step in own)
                paths.append(f"//{mark}/" + "/".join(reversed(indexed)))
                paths.append(f"//{mark}/" + "/".join(reversed(plain)))
        child = ancestor
        ancestor = ancestor.getparent()
        indexed.append(_indexed(child))
        plain.append(child.tag)
    return [Rule(path, how) for path in dict.fromkeys(paths)]


def _steps(node: Any, how: str) -> list[str]:
    tag = node.tag
    steps = [tag]
    if node.get("id"):
        steps.append(f"{tag}[@id={_literal(node.get('id'))}]")
    steps.extend(f"{tag}[{_has_class(c)}]" for c in _classes(node))
    for name in _NAMING:
        if node.get(name):
            steps.append(f"{tag}[@{name}={_literal(node.get(name))}]")
    if how.startswith("@"):
        steps.append(f"{tag}[{how}]")
    return steps


def _marks(node: Any) -> list[str]:
    """The ways to name an ancestor that do not depend on its position."""
    if node.get("id"):
        return [f"{node.tag}[@id={_literal(node.get('id'))}]"]
    return [f"{node.tag}[{_has_class(c)}]" for c in _classes(node)[:2]]


def _classes(node: Any) -> list[str]:
    return [c for c in (node.get("class") or "").split() if "'" not in c and '"' not in c][:_CLASSES]


def _has_class(name: str) -> str:
    return f"contains(concat(' ',normalize-space(@class),' '),' {name} ')"


def _indexed(node: Any) -> str:
    """*node*'s step with its position among its parent's children of its tag."""
    parent = node.getparent()
    if parent is None:
        return node.tag
    same = [child for child in parent if child.tag == node.tag]
    return node.tag if len(same) == 1 else f"{node.tag}[{same.index(node) + 1}]"


def _label(node: Any) -> str | None:
    """A caption just before the node (``<dt>Price</dt><dd>…``, ``<th>Price</th><td>…``)."""
    before = node.getprevious()
    while before is not None and not isinstance(before.tag, str):
        before = before.getprevious()
    if before is None:
        return None
    text = " ".join("".join(before.itertext()).split())
    if not text or len(text) > _LABEL or not any(ch.isalpha() for ch in text):
        return None
    return f"//{before.tag}[normalize-space(.)={_literal(text)}]/following-sibling::{node.tag}[1]"


def _literal(text: str) -> str:
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    parts = ', "\'", '.join(f"'{part}'" for part in text.split("'"))
    return f"concat({parts})"


def _jsonld(value: Any, kind: str, keys: list[str], known: Any, read: Reader, found: set[Rule]) -> None:
    if isinstance(value, list):
        for element in value:
            _jsonld(element, kind, keys, known, read, found)
    elif isinstance(value, dict):
        for key, inner in value.items():
            if key.startswith("@"):
                continue
            if isinstance(inner, (str, int, float)) and not isinstance(inner, bool):
                if read(leaf_text(value, key, inner)) == known:
                    found.add(Rule(f"{kind}/{'.'.join([*keys, key])}", JSONLD))
            else:
                _jsonld(inner, kind, [*keys, key], known, read, found)
    elif keys and isinstance(value, (str, int, float)) and not isinstance(value, bool):  # in a list
        if read(str(value)) == known:
            found.add(Rule(f"{kind}/{'.'.join(keys)}", JSONLD))
