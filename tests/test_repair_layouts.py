"""Repair against redesigns that try to mislead it, in real crawls of the demo shop: a decoy
that the old selector reads and that sits where the price was; a partial rollout (two templates
at once) crawled by two nodes, one SIGKILLed while the repair is learnt; a repair reverted.

The redesigned pages lose their JSON-LD (it would give the price away on every page).
"""

from __future__ import annotations

import os
import re
import signal
from decimal import Decimal
from typing import Any

from support.crawls import crawl_env, run_scrapy, run_scrapy_many
from support.processes import start_crawl, wait_for
from test_repair_induce import PRICE_BOX, chance, rename

from scraper.demo_site import Catalog, DemoSite, layout
from scraper.demo_site.catalog import Product

PRODUCTS = 160
_JSONLD = re.compile(r'<script type="application/ld\+json">.*?</script>', re.S)


def prices(query: Any) -> dict[str, Decimal]:
    return dict(query("SELECT sku, price FROM products"))


def served(site: DemoSite) -> dict[str, Decimal]:
    return {p.sku: p.price for p in site._renderer.catalog.valid_products() if p.price is not None}


def repairs(query: Any) -> list[tuple[Any, ...]]:
    return query("SELECT id, status, rules, run_id, reason FROM repairs ORDER BY id")


def env_for(clean: Any, site: DemoSite, **extra: str) -> dict[str, str]:
    return crawl_env(
        clean,
        DEMO_SITE_URL=site.url,
        QUALITY_GUARD_POLL="0.2",
        REPAIR_POLL="0.5",
        QUALITY_FAIL_EXIT="1",
        CONCURRENT_REQUESTS="4",
        **extra,
    )


def crawl(env: dict[str, str], workers: int = 1) -> list[Any]:
    results = run_scrapy_many(env, *[("crawl", "demo")] * workers)
    for result in results:
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return results


def baseline(clean: Any, env: dict[str, str], site: DemoSite) -> dict[str, Decimal]:
    for result in crawl(env) + crawl(env):
        assert result.returncode == 0, result.stderr[-3000:]
    good = prices(clean.query)
    assert good == served(site)
    return good


def related_decoy(catalog: Catalog):
    """The price's class renamed, and a related-products block under it whose prices keep the
    old class: the spider's ``.price::text`` now reads another product's price."""
    others = catalog.valid_products()

    def change(text: str, product: Product) -> str:
        picks = [o for o in others if o.id != product.id and o.price is not None][product.id % 7 : product.id % 7 + 3]
        block = "".join(
            f'<li><a href="/p/{o.id}.html">{o.title}</a> <span class="price">{o.price_display}</span></li>'
            for o in picks
        )
        text = _JSONLD.sub("", rename(text, product))
        return text.replace('<p class="price-box">', f'<ul class="related">{block}</ul>\n<p class="price-box">', 1)

    return change


def test_a_decoy_the_old_selector_reads_is_never_picked_and_a_reverted_repair_is_not_learnt_again(clean) -> None:
    catalog = Catalog(products=PRODUCTS, broken=False)
    layout.define("related-decoy", related_decoy(catalog))
    with DemoSite(catalog, delay_ms=5) as site:
        env = env_for(clean, site)
        good = baseline(clean, env, site)

        site.break_layout(1.0, parts=("related-decoy",))
        (broken,) = crawl(env)
        assert broken.returncode == 3, broken.stderr[-3000:]
        # The old selector read other products' prices: not one reached a row.
        assert prices(clean.query) == good
        ((rid, status, rules, run_id, _),) = repairs(clean.query)
        assert status == "active" and run_id == 3
        assert rules and all("amount" in r and "related" not in r for r in rules), rules

        changed = site.reprice(8)
        (result,) = crawl(env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert prices(clean.query) == served(site)
        assert clean.query("SELECT count(*) FROM item_changes WHERE run_id = 4 AND changes ? 'price'")[0][0] == len(
            changed
        )

        # Reverted: the values it wrote go back, and the same rules are not learnt again.
        reverted = run_scrapy(env, "repairs", "demo", "--revert", str(rid))
        assert reverted.returncode == 0, reverted.stderr[-3000:]
        assert f"{len(changed)} value(s) set back" in reverted.stdout, reverted.stdout
        assert prices(clean.query) == good
        listed = run_scrapy(env, "repairs", "demo")
        assert f"#{rid}  ProductItem.price  reverted" in listed.stdout, listed.stdout
        # The line that reads the field this way in the spider itself.
        assert "response.css('span.amount" in listed.stdout, listed.stdout
        assert clean.query("SELECT count(*) FROM item_changes WHERE run_id = 3")[0][0] == 0

        (again,) = crawl(env)
        assert again.returncode == 3, again.stderr[-3000:]
        assert prices(clean.query) == good, "without the repair, the decoy's prices are held again"
        later = [r for r in repairs(clean.query) if r[3] == 5]
        assert later and all(r[1] == "refused" and f"reverted (repair {rid})" in r[4] for r in later), later


def two_templates(text: str, product: Product) -> str:
    """Half the new pages show the price in a list of facts, the other half under a renamed class."""
    if chance(product, "template", 0.5):
        text = PRICE_BOX.sub(r'<dl class="facts"><dt>Weight</dt><dd>1 kg</dd><dt>Price</dt><dd>\1</dd></dl>\n', text)
    else:
        text = rename(text, product)
    return _JSONLD.sub("", text)


def test_a_partial_rollout_gets_a_rule_per_template_though_a_node_is_killed_while_it_learns(clean) -> None:
    catalog = Catalog(products=PRODUCTS, broken=False)
    layout.define("two-templates", two_templates)
    with DemoSite(catalog, delay_ms=20) as site:
        env = env_for(clean, site, SCHEDULER_LEASE_TIMEOUT="3", SCHEDULER_IDLE_TIMEOUT="5")
        good = baseline(clean, env, site)

        # Half the pages in the new template; the price is required: their items are rejects.
        site.break_layout(0.5, parts=("two-templates",))
        nodes = [start_crawl(env) for _ in range(2)]
        victim = nodes[0]

        def learning() -> bool:
            return b"Learning where ProductItem.price went" in os.pread(victim.log.fileno(), 1 << 22, 0)

        wait_for(learning, timeout=90, step=0.05)
        victim.proc.send_signal(signal.SIGKILL)
        logs = [n.communicate(timeout=180)[1] for n in nodes]
        assert victim.returncode == -signal.SIGKILL
        assert nodes[1].returncode == 3, logs[1][-3000:]
        assert "Traceback" not in logs[1], logs[1][-3000:]
        assert prices(clean.query) == good

        active = [r for r in repairs(clean.query) if r[1] == "active"]
        assert len(active) == 1, (repairs(clean.query), logs[1][-6000:])
        rules = active[0][2]
        # One rule per template where no one rule reads both (the old template reads as it did).
        assert len(rules) == 2 and any("'Price'" in r for r in rules), rules

        changed = site.reprice(10)
        (result,) = crawl(env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert prices(clean.query) == served(site)
        assert clean.query("SELECT count(*) FROM item_changes WHERE run_id = 4 AND changes ? 'price'")[0][0] == len(
            changed
        )
