"""Repair by value evidence, per kind of redesign: `.venv/bin/python bench/repair_induce.py`.

For each layout change of ``tests/test_repair_induce.py``, on ~200 demo-shop pages (60 for the
WooCommerce-like shop): the CPU seconds ``induce`` takes for the price field, the rules it
returns or why it refuses, and what they read on every page of the new layout (churned pages
included): right, wrong, unread.

Side by side with scrapling (installed by requirements-dev.txt, never a runtime requirement), its
adaptive relocation, given every advantage: the element is
saved on the same product's page in the old layout (one identifier per product), then looked
up with the old selector, relocating when it finds nothing; the first element's whole text is
cleaned by our own price cleaner.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scraper.repair import Evidence, Refusal, induce  # noqa: E402

_spec = importlib.util.spec_from_file_location("layouts", ROOT / "tests" / "test_repair_induce.py")
layouts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layouts)

OLD = "span.price::text"


def cases(shop: Any) -> list[tuple[str, Callable[[], tuple[list, dict, list]]]]:
    """(name, build) -> (new evidence, truth per URL, old-layout pages for scrapling)."""

    def demo(change: Callable, **options: Any) -> Callable[[], tuple[list, dict, list]]:
        def make() -> tuple[list, dict, list]:
            evidence, truth = layouts.build(shop, change, **options)
            before, _ = layouts.build(shop, lambda text, product: text)
            return evidence, truth, before

        return make

    def woo() -> tuple[list, dict, list]:
        evidence, truth = layouts.woo_pages(60, "product-price")
        return evidence, truth, layouts.woo_pages(60, "price")[0]

    return [
        ("class rename", demo(layouts.rename)),
        ("wrapper elements", demo(layouts.wrap)),
        ("moved element", demo(layouts.move)),
        ("facts table, rows vary", demo(layouts.table)),
        ("data-price attribute", demo(layouts.attribute)),
        ("itemprop content", demo(layouts.meta)),
        ("JSON-LD only", demo(layouts.jsonld_only, jsonld=True)),
        ("related products decoy", demo(layouts.related(shop[1]))),
        ("60% churn + wrapper", demo(layouts.wrap, churn=0.6)),
        ("60% churn + was/now decoy", demo(lambda t, p: t, churn=0.6, decoy=layouts.was_now(0.3))),
        ("same, decoy fits all", demo(lambda t, p: t, churn=0.6, decoy=layouts.was_now(0.0))),
        ("partial rollout", demo(layouts.half)),
        ("WooCommerce-like", woo),
    ]


def tally(read: Callable[[Evidence], Any], evidence: list[Evidence], truth: dict[str, Any]) -> tuple[int, int, int]:
    right = wrong = unread = 0
    for page in evidence:
        value = read(page)
        if value is None:
            unread += 1
        elif value == truth[page.url]:
            right += 1
        else:
            wrong += 1
    return right, wrong, unread


def scrapling_reader(before: list[Evidence], selector: str) -> Callable[[Evidence], Any] | None:
    try:
        from scrapling.parser import Selector
    except ImportError:
        return None
    storage = {"storage_file": tempfile.mktemp(suffix=".db"), "url": "http://shop.test/"}
    for page in before:
        old = Selector(page.html, url=page.url, adaptive=True, storage_args=storage)
        old.css(selector, auto_save=True, identifier=page.url)

    def read(page: Evidence) -> Any:
        new = Selector(page.html, url=page.url, adaptive=True, storage_args=storage)
        found = new.css(selector, adaptive=True, identifier=page.url)
        return layouts.price(found[0].get_all_text()) if found else None

    return read


def main() -> None:
    shop = layouts.make_shop(230)
    print(f"{'layout':28} {'pages':>5} {'cpu s':>6}  {'ours right/wrong/unread':24} {'scrapling':18} rules or refusal")
    for name, make in cases(shop):
        evidence, truth, before = make()
        started = time.process_time()
        result = induce("price", evidence, layouts.price, current=OLD if name != "WooCommerce-like" else None)
        cpu = time.process_time() - started
        if isinstance(result, Refusal):
            ours, what = "refused", f"{result.reason}: {result.detail[:90]}"
        else:
            ours = "/".join(map(str, tally(lambda page, repair=result: repair.extract(page.html), evidence, truth)))
            what = " | ".join(str(f.rule) for f in result.rules)
        reader = scrapling_reader(before, "p.price span.amount" if name == "WooCommerce-like" else ".price")
        theirs = "/".join(map(str, tally(reader, evidence, truth))) if reader else "not installed"
        print(f"{name:28} {len(evidence):5} {cpu:6.2f}  {ours:24} {theirs:18} {what}")


if __name__ == "__main__":
    main()
