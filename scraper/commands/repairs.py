"""``scrapy repairs SPIDER [--run N] [--accept ID | --reject ID | --revert ID]``.

Lists the spider's repairs: the field, the selector it replaced and the rules it reads with, the
pages it learnt from and was validated on, its contradictions (always 0 for one in force), its
state, and the line that would read the field that way in the spider itself. ``--accept`` puts a
pending repair (``REPAIR_APPLY=review``) in force, ``--reject`` sets one aside before or after,
``--revert`` sets one aside and sets back every value of its field that the runs since wrote.
"""

from __future__ import annotations

from argparse import ArgumentParser, Namespace

import psycopg2
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from ..items import stored_item_types
from ..repair import store
from ..repair.revert import revert_field
from ..repair.suggest import spider_line
from . import backends_or_report, report_error


def render(rows: list[store.RepairRow]) -> list[str]:
    lines = []
    for row in rows:
        valid = row.validation
        lines.append(f"#{row.id}  {row.name}  {row.status}  (run {row.run_id}; trigger: {row.trigger or '-'})")
        lines.append(f"    was:   {row.old_selector or 'unknown'}")
        if row.rules:
            lines.append(f"    now:   {' | '.join(row.rules)}")
            lines.append(
                f"    evidence: {row.evidence} page(s), {row.distinct_values} distinct value(s), "
                f"{row.contradictions} contradiction(s); validation: {valid.get('ok', 0)} read right, "
                f"{valid.get('wrong', 0)} wrong, {valid.get('multiple', 0)} ambiguous; "
                f"{valid.get('uncovered', 0)} page(s) none of the rules reads (held, never guessed)"
            )
            for n, line in enumerate(spider_line(row.field, row.rules).splitlines()):
                lines.append(f"    {'spider:' if n == 0 else '       '} {line}")
        else:
            lines.append(f"    refused: {row.reason}")
    return lines


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False

    def syntax(self) -> str:
        return "SPIDER [--run N] [--accept ID | --reject ID | --revert ID]"

    def short_desc(self) -> str:
        return "List a spider's repairs of broken fields; accept, reject or revert one"

    def add_options(self, parser: ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--run", type=int, default=None, help="only the repairs learnt in this run")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--accept", type=int, metavar="ID", help="put a pending repair in force")
        group.add_argument("--reject", type=int, metavar="ID", help="set a repair aside (its values stay)")
        group.add_argument("--revert", type=int, metavar="ID", help="set a repair aside and undo the values it wrote")

    def run(self, args: list[str], opts: Namespace) -> None:
        if len(args) != 1:
            raise UsageError("give one spider name")
        spider = args[0]
        found = backends_or_report(self, need_redis=False)
        if found is None:
            return
        conn = psycopg2.connect(found.database_url)
        try:
            with conn, conn.cursor() as cur:
                store.ensure(cur)
                target = opts.accept or opts.reject or opts.revert
                if target is None:
                    rows = store.listed(cur, spider, opts.run)
                    if not rows:
                        report_error(self, f"no repairs recorded for {spider}", status=1)
                        return
                    print("\n".join(render(rows)))
                    return
                row = store.get(cur, target)
                if row is None or row.spider != spider:
                    report_error(self, f"no repair {target} of {spider}", status=1)
                    return
                self._decide(cur, row, opts)
        finally:
            conn.close()

    def _decide(self, cur, row: store.RepairRow, opts: Namespace) -> None:
        if opts.accept:
            if row.status != "pending":
                report_error(self, f"repair {row.id} is {row.status}, not pending", status=1)
                return
            store.decide(cur, row.id, "active")
            print(f"Repair {row.id} of {row.name} is in force: the next pages read it through {' | '.join(row.rules)}")
            return
        if row.status not in ("active", "pending", "superseded"):
            report_error(self, f"repair {row.id} is {row.status} already", status=1)
            return
        if opts.reject:
            store.decide(cur, row.id, "rejected")
            print(f"Repair {row.id} of {row.name} rejected: no longer applied, never learnt again")
            return
        kind = next((t for t in stored_item_types() if t.__name__ == row.item_type), None)
        if kind is None:
            report_error(self, f"item type {row.item_type} is not in the project any more", status=1)
            return
        store.decide(cur, row.id, "reverted")
        undone = revert_field(cur, row.spider, kind, row.field, row.run_id)
        print(
            f"Repair {row.id} of {row.name} reverted: {undone.values} value(s) set back, "
            f"{undone.superseded} left as a later change wrote them; never learnt again"
        )
