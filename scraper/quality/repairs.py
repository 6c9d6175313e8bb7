"""The run report's lines on the repairs learnt in the run (see :mod:`scraper.repair.live`): a
verified repair is a passed check naming its rules; a refusal is said with its reason."""

from __future__ import annotations

from typing import Any

from .checks import Check


def repair_checks(conn: Any, spider: str, run_id: int) -> list[Check]:
    with conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass('repairs') IS NOT NULL")
        if not cur.fetchone()[0]:
            return []
        cur.execute(
            "SELECT id, item_type, field, status, rules, evidence, contradictions, reason FROM repairs"
            " WHERE spider = %s AND run_id = %s ORDER BY id",
            (spider, run_id),
        )
        rows = cur.fetchall()
    out = []
    for rid, item_type, field, status, rules, evidence, contradictions, reason in rows:
        subject = f"{item_type}.{field}"
        if rules:
            out.append(
                Check(
                    "repair",
                    subject,
                    "verified",
                    f"repair {rid} {status}",
                    True,
                    f"{evidence} evidence pages, {contradictions} contradictions; reads {' | '.join(rules)}"
                    f" (scrapy repairs {spider})",
                )
            )
        else:
            out.append(Check("repair", subject, "", "", None, f"no repair: {reason}"))
    return out
