"""The run report: one readable block, for the log, ``scrapy demo`` and ``scrapy runs --report``."""

from __future__ import annotations

from .checks import Check

_MARK = {"passed": "ok  ", "failed": "FAIL", "skipped": "skip"}


def render(spider: str, run_id: int, outcome: str, baseline: list[int], checks: list[Check]) -> str:
    failed = [c for c in checks if c.passed is False]
    compared = (
        f"compared with run{'s' if len(baseline) != 1 else ''} {', '.join(map(str, baseline))}"
        if baseline
        else "no earlier finished run to compare with"
    )
    lines = [
        f"Data quality of run {run_id} of {spider}: {outcome.upper()} "
        f"({len(failed)} of {len(checks)} checks failed; {compared})"
    ]
    width = max((len(_name(c)) for c in checks), default=10)
    for c in checks:
        detail = (
            f"expected {c.expected}, observed {c.observed}"
            if c.expected
            else f"observed {c.observed}"
            if c.observed
            else ""
        )
        note = c.note if not detail else f"  ({c.note})" if c.note else ""
        lines.append(f"  {_MARK[c.status]}  {_name(c):{width}}  {detail}{note}")
    if failed:
        named = affected(checks)
        lines.append(f"  failed: {', '.join(_name(c) for c in failed)}")
        if named:
            lines.append(f"  affected: {', '.join(named)}")
    return "\n".join(lines)


def affected(checks: list[Check]) -> list[str]:
    """What the failed checks name: fields (``Type.field`` or a rejected field) and currencies."""
    return sorted({c.subject for c in checks if c.passed is False and c.subject})


def _name(c: Check) -> str:
    return f"{c.check} {c.subject}".strip()
