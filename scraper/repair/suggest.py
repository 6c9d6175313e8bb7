"""A repair's rules in the spider's own terms: the line to put in its callback."""

from __future__ import annotations

import re

from .rules import JSONLD, OWN, TEXT, Rule

# cssselect's translation of ``.name``, the form induced rules take for a class.
_CLASS = re.compile(r"\[contains\(concat\(' ',\s*normalize-space\(@class\),\s*' '\),\s*' ([\w-]+) '\)\]")
_STEP = re.compile(r"^(?:descendant-or-self::|//)?([\w*-]+)((?:\[[^\[\]]*(?:\[[^\]]*\])?[^\[\]]*\])*)$")
_ATTR_EQ = re.compile(r"\[@([\w:-]+)\s*=\s*'([^']*)'\]")
_ATTR_HAS = re.compile(r"\[@([\w:-]+)\]")


def _css_step(step: str) -> str | None:
    found = _STEP.match(step)
    if not found:
        return None
    tag, predicates = found.group(1), found.group(2)
    out = "" if tag == "*" else tag
    rest = predicates
    for pattern, render in (
        (_CLASS, lambda m: f".{m.group(1)}"),
        (_ATTR_EQ, lambda m: f"[{m.group(1)}={m.group(2)!r}]".replace("'", '"')),
        (_ATTR_HAS, lambda m: f"[{m.group(1)}]"),
    ):
        for m in pattern.finditer(rest):
            out += render(m)
        rest = pattern.sub("", rest)
    if rest.strip():
        return None  # a predicate CSS cannot say (a position, a text test)
    return out or "*"


def as_css(rule: Rule) -> str | None:
    """The rule as a CSS query with ``::text`` / ``::attr()``, when CSS can say it."""
    if rule.read == JSONLD:
        return None
    path = rule.path
    if path.startswith("descendant-or-self::"):
        path = "//" + path[len("descendant-or-self::") :]
    if not path.startswith("//"):
        return None
    steps = []
    for part in re.split(r"/(?![^\[]*\])", path[2:]):
        if part == "":
            steps.append(" ")  # a '//' inside: any depth
            continue
        css = _css_step(part)
        if css is None:
            return None
        steps.append(css)
    text = ""
    for step in steps:
        if step == " ":
            text += " "
        elif text and not text.endswith(" "):
            text += " > " + step
        else:
            text += step
    text = text.strip()
    if rule.read == OWN:
        return f"{text}::text"
    if rule.read.startswith("@"):
        return f"{text}::attr({rule.read[1:]})"
    if rule.read == TEXT:
        return f"{text} ::text"  # every text node below, as string() reads them
    return None


def spider_line(field: str, rules: list[str]) -> str:
    """What a callback writes to read *field* as the repair reads it."""
    parsed = [Rule.parse(r) for r in rules]
    lines = []
    for rule in parsed:
        if rule.read == JSONLD:
            kind, _, keys = rule.path.partition("/")
            lines.append(f"# {field}: the page's JSON-LD {kind or 'object'}, key {keys} (scrapy's response.jmespath)")
            continue
        css = as_css(rule)
        if css is not None:
            getter = ".get()" if not css.endswith(" ::text") else ".getall()"
            expr = f"response.css({css!r}){getter}"
            lines.append(f'"{field}": "".join({expr}),' if getter == ".getall()" else f'"{field}": {expr},')
        elif rule.read == TEXT:
            lines.append(f'"{field}": "".join(response.xpath({rule.path + "//text()"!r}).getall()),')
        else:
            lines.append(f'"{field}": response.xpath({str(rule)!r}).get(),')
    if len(lines) > 1:
        return "\n".join(["# one per template, the first that reads the page:"] + lines)
    return lines[0] if lines else ""
