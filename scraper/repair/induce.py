"""Induce the rules that read a field again, from value evidence alone.

The evidence pages are split once: most to learn from, the rest (``holdout``) kept apart to
validate on. Rounds then pick one rule each: among the candidates found on pages no rule reads
yet, those that select exactly one node holding the known value wherever they select anything,
contradict no known value and select one node at most on pages without one; the best covers
the most evidence pages. Several templates (a partial rollout) take a round each. Two
candidates that fit the evidence equally but read different values on any page are a refusal,
never a guess; so is a rule set that misreads a held-out page or leaves too many unread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .candidates import candidates
from .evidence import Evidence, Reader, held_out, variety
from .page import Page, parse
from .rules import JSONLD, Rule

__all__ = ["Check", "Fitted", "Refusal", "Repair", "induce", "verify"]

Reason = Literal["too few pages", "low variety", "no candidate", "contradiction", "validation failed", "ambiguous"]

_MIN_RULE_PAGES = 3  # evidence pages (with as many distinct values) one rule must read
# ... and the share of the learning pages it must read: a handful of pages agreeing by chance
# (a "label" that is one brand's name) is no template.
_MIN_RULE_SHARE = 0.1
_SAMPLE = 12  # pages searched for value-holding nodes per round; verification sees all
_LEARN, _HOLD, _UNKNOWN = 0, 1, 2


@dataclass(frozen=True)
class Check:
    """A rule set on evidence pages: known values read, misread, read from several nodes at
    once, and not read at all."""

    ok: int = 0
    wrong: int = 0
    multiple: int = 0
    missing: int = 0
    examples: tuple[str, ...] = ()  # URLs of the first misreadings

    @property
    def pages(self) -> int:
        return self.ok + self.wrong + self.multiple + self.missing

    @property
    def coverage(self) -> float:
        return self.ok / self.pages if self.pages else 0.0


@dataclass(frozen=True)
class Fitted:
    """One accepted rule and what it was accepted on."""

    rule: Rule
    evidence: int  # pages learnt from where it read the known value
    distinct: int  # distinct known values among them
    contradictions: int  # known values it misread: always 0 for an accepted rule
    validation: Check  # the held-out pages it reads (the first rule that selects reads a page)
    unknown: int  # pages without a stable value where it selects exactly one node
    pages: tuple[str, ...] = field(default=(), repr=False)  # every page whose value it gives


@dataclass(frozen=True)
class Repair:
    """Rules to read *field* with, tried in order: the first that selects a node on a page reads
    it, and reads nothing unless it selects exactly one. ``unchanged``: the rule given as the
    current one still verifies, and nothing was induced."""

    field: str
    rules: tuple[Fitted, ...]
    unchanged: bool = False
    uncovered: tuple[str, ...] = field(default=(), repr=False)  # pages none of the rules reads: held, not guessed
    examined: int = 0  # candidate rules verified
    clean: Callable[[str], Any] | None = field(default=None, repr=False, compare=False)

    def locate(self, html: str | bytes, url: str = "") -> tuple[Rule, str] | None:
        """The rule that reads the page and the raw text it reads, or None."""
        return _first([fitted.rule for fitted in self.rules], parse(url, html))

    def extract(self, html: str | bytes, url: str = "") -> Any:
        """The field's value on the page, cleaned; None when no rule reads exactly one node."""
        found = self.locate(html, url)
        if found is None:
            return None
        return Reader(self.clean)(found[1]) if self.clean is not None else found[1]


@dataclass(frozen=True)
class Refusal:
    field: str
    reason: Reason
    detail: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}: {self.detail}"


@dataclass
class _Pages:
    pages: list[Page]
    known: list[Any]
    role: list[int]
    read: Reader

    def of(self, role: int) -> list[int]:
        return [i for i, r in enumerate(self.role) if r == role]


def verify(rules: Sequence[Rule | str], evidence: Sequence[Evidence], clean: Callable[[str], Any]) -> Check:
    """How *rules* (tried in order) read the known values of *evidence*."""
    read = Reader(clean)
    parsed = [(parse(e.url, e.html), e.known) for e in evidence if e.known is not None]
    return _check([_rule(r) for r in rules], parsed, read)


def induce(
    field: str,
    evidence: Sequence[Evidence],
    clean: Callable[[str], Any],
    *,
    current: Rule | str | None = None,
    holdout: float = 0.3,
    min_pages: int = 5,
    min_distinct: int = 5,
    max_share: float = 0.5,
    min_coverage: float = 0.9,
    max_rules: int = 3,
) -> Repair | Refusal:
    """Rules that read *field* on the pages of *evidence*, or why there are none.

    *clean* is the project's cleaner for the field: a node holds the value when ``clean`` reads
    exactly the known value from it. *current*, the rule in use, is returned unchanged when it
    still reads every known value it finds and finds ``min_coverage`` of them. Values that
    repeat (``min_distinct``, ``max_share``) prove nothing: an "In stock" badge reads the same
    on every page.
    """
    known = [e for e in evidence if e.known is not None]
    if len(known) < min_pages:
        return Refusal(field, "too few pages", f"{len(known)} pages with a stable value, {min_pages} needed")
    distinct, share = variety([_hashable(e.known) for e in known])
    if distinct < min_distinct or share > max_share:
        return Refusal(
            field,
            "low variety",
            f"{distinct} distinct values over {len(known)} pages, the commonest on {share:.0%}: no evidence alone",
        )
    read = Reader(clean)
    kept = held_out([e.url for e in known], holdout)
    data = _Pages(
        [parse(e.url, e.html) for e in evidence],
        [e.known for e in evidence],
        [_UNKNOWN if e.known is None else _HOLD if e.url in kept else _LEARN for e in evidence],
        read,
    )
    if current is not None:
        unchanged = _unchanged(field, _rule(current), data, min_coverage, clean)
        if unchanged is not None:
            return unchanged
    return _Induction(field, data, min_coverage, max_rules, clean).run()


def _unchanged(field: str, rule: Rule, data: _Pages, min_coverage: float, clean: Callable[[str], Any]) -> Repair | None:
    evidence = [(data.pages[i], data.known[i]) for i, role in enumerate(data.role) if role != _UNKNOWN]
    check = _check([rule], evidence, data.read)
    if check.wrong or check.multiple or check.coverage < min_coverage:
        return None
    learnt = [(data.pages[i], data.known[i]) for i in data.of(_LEARN)]
    held = [(data.pages[i], data.known[i]) for i in data.of(_HOLD)]
    unknown = [data.pages[i] for i in data.of(_UNKNOWN)]
    reads = [page.url for page in unknown if len(rule.values(page)) == 1]
    fitted = Fitted(
        rule,
        evidence=_check([rule], learnt, data.read).ok,
        distinct=len({_hashable(k) for _, k in learnt}),
        contradictions=0,
        validation=_check([rule], held, data.read),
        unknown=len(reads),
        pages=tuple(page.url for page, _ in evidence if len(rule.values(page)) == 1) + tuple(reads),
    )
    uncovered = tuple(page.url for page in data.pages if len(rule.values(page)) != 1)
    return Repair(field, (fitted,), unchanged=True, uncovered=uncovered, examined=1, clean=clean)


class _Induction:
    def __init__(self, field: str, data: _Pages, min_coverage: float, max_rules: int, clean: Callable) -> None:
        self.field = field
        self.data = data
        self.min_coverage = min_coverage
        self.max_rules = max_rules
        self.clean = clean
        # Per candidate, per page: how many nodes it selects, and when it is one, the value it
        # reads and the length of the raw text it reads that from.
        self.outcomes: dict[Rule, list[tuple[int, Any, int]]] = {}
        self.longest = max(200, 3 * max(len(str(k)) for k in data.known if k is not None))
        self.least = max(_MIN_RULE_PAGES, round(_MIN_RULE_SHARE * len(data.of(_LEARN))))

    def run(self) -> Repair | Refusal:
        data = self.data
        region = set(range(len(data.pages)))
        chosen: list[tuple[Rule, list[int]]] = []
        last_problem: Refusal | None = None
        while len(chosen) < self.max_rules:
            unread = [i for i in data.of(_LEARN) if i in region]
            if len(unread) < self.least:
                break
            self._generate(unread)
            picked = self._pick(region)
            if isinstance(picked, Refusal):
                if picked.reason == "ambiguous":
                    return picked
                last_problem = picked
                break
            rule = picked
            claimed = [i for i in region if self.outcomes[rule][i][0] > 0]
            chosen.append((rule, claimed))
            region -= set(claimed)
        learning = data.of(_LEARN)
        # A chosen rule misreads no evidence page it selects on: every one it claims it reads.
        read_ok = sum(1 for _, claimed in chosen for i in claimed if data.role[i] == _LEARN)
        if not chosen or read_ok < self.min_coverage * len(learning):
            if last_problem is not None and (not chosen or last_problem.reason == "contradiction"):
                return last_problem
            return Refusal(
                self.field,
                "no candidate",
                f"the rules found read {read_ok} of {len(learning)} evidence pages"
                f" ({len(self.outcomes)} candidates examined)",
            )
        return self._validate(chosen)

    def _generate(self, unread: list[int]) -> None:
        data = self.data
        seen: set[Any] = set()
        sample: list[int] = []
        for i in unread:  # distinct values first: a repeated value finds the same nodes
            key = _hashable(data.known[i])
            if key not in seen:
                seen.add(key)
                sample.append(i)
            if len(sample) == _SAMPLE:
                break
        for i in sample:
            for rule in candidates(data.pages[i], data.known[i], data.read, self.longest):
                if rule not in self.outcomes:
                    self.outcomes[rule] = [self._outcome(rule, page) for page in data.pages]

    def _outcome(self, rule: Rule, page: Page) -> tuple[int, Any, int]:
        values = rule.values(page)
        if len(values) != 1:
            return len(values), None, 0
        return 1, self.data.read(values[0]), len(values[0])

    def _pick(self, region: set[int]) -> Rule | Refusal:
        data = self.data
        fits: list[tuple[tuple, Rule]] = []
        worst: tuple[int, Rule, str] | None = None
        for rule, outcome in self.outcomes.items():
            ok, covered, values, wrong, extra = 0, 0, set(), [], 0
            for i in region:
                count, value, length = outcome[i]
                if count == 0 or data.role[i] == _HOLD:
                    continue
                covered += count == 1 and value is not None
                if data.role[i] == _UNKNOWN:
                    if count > 1:
                        wrong.append(data.pages[i].url)
                elif count > 1 or value != data.known[i]:
                    wrong.append(data.pages[i].url)
                else:
                    ok += 1
                    extra += length
                    values.add(_hashable(value))
            if wrong:
                if worst is None or ok > worst[0]:
                    worst = (ok, rule, wrong[0])
                continue
            if ok >= self.least and len(values) >= _MIN_RULE_PAGES:
                # More evidence, then more pages read, then what a redesign breaks least: no
                # positions, a node named for itself, what the page shows over its JSON-LD (which
                # can lag it), the node holding least besides the value ("Price: Free" is no
                # price where "Free" is), the shortest path.
                tight = extra / ok if ok else 0
                key = (-ok, -covered, rule.positional, not rule.named, rule.read == JSONLD, tight, len(rule.path))
                fits.append((key, rule))
        if not fits:
            if worst is not None and worst[0] >= self.least:
                return Refusal(
                    self.field,
                    "contradiction",
                    f"{worst[1]} reads {worst[0]} known values but misreads {worst[2]}",
                )
            return Refusal(self.field, "no candidate", f"no rule reads {self.least} of the evidence pages left")
        fits.sort(key=lambda fit: fit[0])
        best = fits[0][0][0]
        tied = [rule for key, rule in fits if key[0] == best]
        clash = self._disagreement(tied, region)
        if clash is not None:
            return clash
        return fits[0][1]

    def _disagreement(self, tied: list[Rule], region: set[int]) -> Refusal | None:
        for i in sorted(region):
            readings: dict[Any, Rule] = {}
            for rule in tied:
                count, value, _ = self.outcomes[rule][i]
                if count == 1 and value is not None:
                    readings.setdefault(_hashable(value), rule)
            if len(readings) > 1:
                (a, ra), (b, rb) = list(readings.items())[:2]
                return Refusal(
                    self.field,
                    "ambiguous",
                    f"{ra} and {rb} fit the evidence equally but read {a!r} and {b!r} on {self.data.pages[i].url}",
                )
        return None

    def _validate(self, chosen: list[tuple[Rule, list[int]]]) -> Repair | Refusal:
        data = self.data
        fitted: list[Fitted] = []
        failures: list[str] = []
        held_read = 0
        for rule, claimed in chosen:
            outcome = self.outcomes[rule]
            learnt = [i for i in claimed if data.role[i] == _LEARN]
            held = [i for i in claimed if data.role[i] == _HOLD]
            ok = [i for i in held if outcome[i][0] == 1 and outcome[i][1] == data.known[i]]
            wrong = [i for i in held if outcome[i][0] == 1 and outcome[i][1] != data.known[i]]
            multiple = [i for i in held if outcome[i][0] > 1]
            failures.extend(
                f"{rule} reads {outcome[i][1]!r} on {data.pages[i].url}, stored {data.known[i]!r}" for i in wrong
            )
            failures.extend(f"{rule} selects {outcome[i][0]} nodes on {data.pages[i].url}" for i in multiple)
            held_read += len(ok)
            if not ok:
                failures.append(f"{rule} reads no held-out page")
            fitted.append(
                Fitted(
                    rule,
                    evidence=len(learnt),
                    distinct=len({_hashable(data.known[i]) for i in learnt}),
                    contradictions=0,
                    validation=Check(len(ok), len(wrong), len(multiple), 0, tuple(data.pages[i].url for i in wrong)),
                    unknown=sum(1 for i in claimed if data.role[i] == _UNKNOWN and outcome[i][0] == 1),
                    pages=tuple(data.pages[i].url for i in claimed if outcome[i][0] == 1),
                )
            )
        holding = data.of(_HOLD)
        if failures or held_read < self.min_coverage * len(holding):
            shown = ", ".join(failures[:3]) or "none misread"
            return Refusal(
                self.field,
                "validation failed",
                f"read {held_read} of {len(holding)} held-out pages; failures: {shown}",
            )
        read = {url for f in fitted for url in f.pages}
        uncovered = tuple(page.url for page in data.pages if page.url not in read)
        return Repair(self.field, tuple(fitted), uncovered=uncovered, examined=len(self.outcomes), clean=self.clean)


def _check(rules: list[Rule], evidence: Sequence[tuple[Page, Any]], read: Reader) -> Check:
    ok = wrong = multiple = missing = 0
    examples: list[str] = []
    for page, known in evidence:
        values = next((v for v in (rule.values(page) for rule in rules) if v), [])
        if not values:
            missing += 1
        elif len(values) > 1:
            multiple += 1
            examples.append(page.url)
        elif read(values[0]) == known:
            ok += 1
        else:
            wrong += 1
            examples.append(page.url)
    return Check(ok, wrong, multiple, missing, tuple(examples[:5]))


def _first(rules: list[Rule], page: Page) -> tuple[Rule, str] | None:
    for rule in rules:
        values = rule.values(page)
        if values:
            return (rule, values[0]) if len(values) == 1 else None
    return None


def _rule(rule: Rule | str) -> Rule:
    return rule if isinstance(rule, Rule) else Rule.parse(rule)


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value
