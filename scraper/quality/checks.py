"""The checks of a finished run against the spider's last finished runs (its baseline).

Pure functions over figures (a run's summed quality figures, see :mod:`.monitor` for the
names), so they are the same whoever runs them. Each check yields one :class:`Check`: passed,
failed, or skipped with the reason (no baseline, no data, too few items) rather than passed
silently. Baselines take the median of the last runs, so one odd run does not move them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from statistics import mean, median

from . import coverage
from .settings import QualitySettings

NO_BASELINE = "skipped: no finished run to compare with"


@dataclass
class Check:
    check: str
    subject: str
    expected: str
    observed: str
    passed: bool | None  # None: skipped, see note
    note: str = ""

    @property
    def status(self) -> str:
        return "skipped" if self.passed is None else "passed" if self.passed else "failed"


@dataclass
class ItemExpectations:
    """What a run's items of one type must show: declared shares and required fields."""

    fields: list[str]
    required: list[str]
    declared: dict[str, float]


Figures = dict[str, float]


def stored(f: Figures) -> float:
    """Items the run saw: stored, or (a revisit run) confirmed unchanged by a 304."""
    return f.get("items/stored", 0.0) + f.get("revisit/confirmed_items", 0.0)


def _ratio(x: float, y: float) -> float:
    return x / y if y > 0 else 0.0


def _skip(check: str, subject: str, note: str) -> Check:
    return Check(check, subject, "", "", None, note)


def check_coverage(
    current: Figures, baseline: list[Figures], expectations: dict[str, ItemExpectations], conf: QualitySettings
) -> Iterable[Check]:
    counts = coverage.item_counts(current)
    for item_type, expect in sorted(expectations.items()):
        items = counts.get(item_type, 0.0)
        if items <= 0:
            continue  # nothing of this type stored: the items check speaks for it
        now = coverage.ratios(current, {item_type: expect.fields})
        before = [
            coverage.ratios(f, {item_type: expect.fields})
            for f in baseline
            if coverage.item_counts(f).get(item_type, 0) > 0
        ]
        for field in expect.fields:
            subject = f"{item_type}.{field}"
            observed = now[(item_type, field)]
            if field in expect.declared:
                wanted, note = expect.declared[field], "declared"
            elif field in expect.required:
                wanted, note = 1.0, "required"
            elif before:
                average = mean(r[(item_type, field)] for r in before)
                wanted = max(0.0, average - conf.coverage_tolerance)
                note = f"average {average:.2f} of {len(before)} run(s) - {conf.coverage_tolerance:g}"
            else:
                yield Check("coverage", subject, "", f"{observed:.2f}", None, NO_BASELINE)
                continue
            if items < conf.min_items:
                yield Check(
                    "coverage",
                    subject,
                    f">= {wanted:.2f}",
                    f"{observed:.2f}",
                    None,
                    f"skipped: {items:.0f} items, fewer than QUALITY_MIN_ITEMS={conf.min_items}",
                )
                continue
            yield Check("coverage", subject, f">= {wanted:.2f}", f"{observed:.2f}", observed >= wanted - 1e-9, note)


def _reject_fields(f: Figures) -> set[str]:
    return {k.split("/", 1)[1] for k in f if k.startswith("rejects/")}


def _reject_share(f: Figures, field: str) -> float:
    return _ratio(f.get(f"rejects/{field}", 0.0), stored(f) + f.get("items/rejected", 0.0))


def check_items(
    current: Figures, baseline: list[Figures], conf: QualitySettings, expects_items: bool = True
) -> Iterable[Check]:
    if current.get("run/revisit"):
        yield from _check_revisit_items(current, conf)
        return
    if not baseline:
        if expects_items and stored(current) <= 0:
            # No baseline says how many, but a spider that stores items and stored none is broken.
            yield Check(
                "items_stored",
                "",
                ">= 1",
                "0",
                False,
                f"the run stored no item ({current.get('pages', 0.0):.0f} page(s), "
                f"{current.get('items/rejected', 0.0):.0f} rejected): content built by JavaScript, a start URL "
                "that links nowhere, selectors that match nothing? A spider meant to store nothing says "
                "expects_items = False",
            )
            return
        yield _skip("items_stored", "", NO_BASELINE)
        return
    base = median(stored(f) for f in baseline)
    wanted = base * (1 - conf.items_drop)
    observed = stored(current)
    rose = sorted(
        (
            (current.get(f"rejects/{field}", 0.0) - median(b.get(f"rejects/{field}", 0.0) for b in baseline), field)
            for field in _reject_fields(current)
        ),
        reverse=True,
    )
    why = ", ".join(f"{field} +{delta:.0f}" for delta, field in rose if delta > 0)
    held = ", ".join(f"{k.split('/', 1)[1]} {v:.0f}" for k, v in sorted(current.items()) if k.startswith("held/"))
    note = (
        f"median of {len(baseline)} run(s): {base:.0f}"
        + (f"; more rejects for {why}" if why else "")
        + (f"; held for {held}" if held else "")
    )
    yield Check("items_stored", "", f">= {wanted:.0f}", f"{observed:.0f}", observed >= wanted, note)


def _check_revisit_items(current: Figures, conf: QualitySettings) -> Iterable[Check]:
    """A revisit run meant to see again the items of the known pages it visited: it is judged
    by those, not by a full run's count."""
    expected = current.get("revisit/expected_items", 0.0)
    if expected <= 0:
        yield _skip("items_stored", "", "skipped: a revisit run that visited no known page with items")
        return
    wanted = expected * (1 - conf.items_drop)
    observed = stored(current)
    yield Check(
        "items_stored",
        "",
        f">= {wanted:.0f}",
        f"{observed:.0f}",
        observed >= wanted - 1e-9,
        f"revisit run: {expected:.0f} item(s) on the known pages it visited; "
        f"{current.get('revisit/confirmed_items', 0.0):.0f} confirmed by 304",
    )


def check_rejects(current: Figures, baseline: list[Figures], conf: QualitySettings) -> Iterable[Check]:
    if not baseline:
        yield _skip("rejects", "", NO_BASELINE)
        return
    for field in sorted(_reject_fields(current) | set().union(*(_reject_fields(f) for f in baseline))):
        base = median(_reject_share(f, field) for f in baseline)
        observed = _reject_share(current, field)
        yield Check(
            "rejects",
            field,
            f"<= {base + conf.rejects_rise:.1%}",
            f"{observed:.1%}",
            observed <= base + conf.rejects_rise + 1e-9,
            f"share of items; median {base:.1%}",
        )


def check_gone(current: Figures, baseline: list[Figures], conf: QualitySettings) -> Iterable[Check]:
    if "gone" not in current:
        yield _skip("gone", "", "skipped: no data (no gone figure recorded for this run)")
        return
    if current.get("run/revisit") and current.get("revisit/expected_items", 0.0) > 0:
        # A revisit run marks gone only among the items it meant to see again.
        of = current["revisit/expected_items"] + current["gone"]
        what = f"the {of:.0f} item(s) the revisit run meant to see again"
    elif not baseline or median(stored(f) for f in baseline) <= 0:
        yield _skip("gone", "", NO_BASELINE)
        return
    else:
        of = median(stored(f) for f in baseline)
        what = f"the baseline's {of:.0f}"
    share = current["gone"] / of
    yield Check(
        "gone",
        "",
        f"<= {conf.gone_spike:.1%}",
        f"{share:.1%}",
        share <= conf.gone_spike + 1e-9,
        f"{current['gone']:.0f} rows gone of {what}",
    )


def _pages_per_item(f: Figures) -> float:
    return f.get("pages", 0.0) / stored(f) if stored(f) > 0 else float("inf")


def check_pages_per_item(current: Figures, baseline: list[Figures], conf: QualitySettings) -> Iterable[Check]:
    if current.get("run/revisit"):
        # Its pages are whatever was due that day (listings alone one day, products and 304s the
        # next): no ratio of pages to items holds from one revisit run to another.
        yield _skip("pages_per_item", "", "skipped: a revisit run (judged by the items it meant to see again)")
        return
    usable = [f for f in baseline if stored(f) > 0 and not f.get("run/revisit")]
    if not usable:
        yield _skip("pages_per_item", "", NO_BASELINE)
        return
    base = median(_pages_per_item(f) for f in usable)
    wanted = base * (1 + conf.pages_per_item_rise)
    observed = _pages_per_item(current)
    yield Check(
        "pages_per_item", "", f"<= {wanted:.2f}", f"{observed:.2f}", observed <= wanted + 1e-9, f"median {base:.2f}"
    )


def check_unreadable(current: Figures, conf: QualitySettings) -> Iterable[Check]:
    """Values on the page the cleaner could not read (an optional field's value stored empty):
    per field, more than ``QUALITY_UNREADABLE`` of the type's stored items fails, baseline or not."""
    counts = coverage.item_counts(current)
    for key in sorted(k for k in current if k.startswith("unreadable/")):
        subject = key[len("unreadable/") :]
        items = counts.get(subject.split(".", 1)[0], 0.0)
        share = min(1.0, current[key] / items) if items > 0 else 1.0
        yield Check(
            "unreadable",
            subject,
            f"<= {conf.unreadable:.0%}",
            f"{share:.1%}",
            share <= conf.unreadable + 1e-9,
            f"{current[key]:.0f} value(s) on the page could not be read and were stored empty",
        )


def check_dead_letters(current: Figures, conf: QualitySettings) -> Iterable[Check]:
    """Pages set aside as dead letters (throttled past its wait, failing, blocked): a run that
    lost more than ``QUALITY_DEAD_LETTERS`` of its pages that way is not ok, baseline or not."""
    dead = current.get("dead_letters", 0.0)
    pages = current.get("pages", 0.0) + dead
    if pages <= 0:
        yield _skip("dead_letters", "", "skipped: no page")
        return
    share = dead / pages
    yield Check(
        "dead_letters",
        "",
        f"<= {conf.dead_letters:.0%}",
        f"{share:.1%}",
        share <= conf.dead_letters + 1e-9,
        f"{dead:.0f} of {pages:.0f} pages set aside (scrapy dlq list SPIDER)",
    )


def check_responses(current: Figures, baseline: list[Figures], conf: QualitySettings) -> Iterable[Check]:
    for kind in ("error", "blocked", "empty"):
        name = f"{kind}_responses"
        if not baseline:
            yield _skip(name, "", NO_BASELINE)
            continue
        share = lambda f, kind=kind: _ratio(f.get(f"responses/{kind}", 0.0), f.get("responses/total", 0.0))  # noqa: E731
        base = median(share(f) for f in baseline)
        observed = share(current)
        yield Check(
            name,
            "",
            f"<= {base + conf.responses_rise:.1%}",
            f"{observed:.1%}",
            observed <= base + conf.responses_rise + 1e-9,
            f"share of responses; median {base:.1%}",
        )


def run_checks(
    current: Figures,
    baseline: list[Figures],
    expectations: dict[str, ItemExpectations],
    conf: QualitySettings,
    expects_items: bool = True,
) -> list[Check]:
    """Every check of a finished run; *baseline* holds the figures of its last finished runs."""
    return [
        *check_items(current, baseline, conf, expects_items),
        *check_coverage(current, baseline, expectations, conf),
        *check_rejects(current, baseline, conf),
        *check_gone(current, baseline, conf),
        *check_pages_per_item(current, baseline, conf),
        *check_responses(current, baseline, conf),
        *check_dead_letters(current, conf),
        *check_unreadable(current, conf),
    ]


def outcome(checks: list[Check]) -> str:
    return "degraded" if any(c.passed is False for c in checks) else "ok"
