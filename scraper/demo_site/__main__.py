"""Serve the demo shop: ``python -m scraper.demo_site --port 8765 --products 200``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from .catalog import Catalog
from .ref_links import RefLinks
from .server import DemoSite


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scraper.demo_site",
        description="Serve a deterministic demo e-commerce site until SIGINT/SIGTERM.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--products", type=int, default=200)
    parser.add_argument("--categories", type=int, default=8)
    parser.add_argument("--per-page", type=int, default=20)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--reprice", type=int, default=0, help="reprice the first N valid products")
    parser.add_argument("--delay-ms", type=int, default=0, help="extra latency per page, in ms")
    parser.add_argument(
        "--break-layout",
        type=float,
        nargs="?",
        const=0.5,
        default=0.0,
        metavar="SHARE",
        help="serve a share of product pages (0.5) in a new layout the demo spider does not know",
    )
    parser.add_argument(
        "--ref-links",
        choices=("home", "other"),
        nargs="?",
        const="home",
        default=None,
        metavar="FIRST",
        help="link products as /p/ID.html?ref=CATEGORY with no canonical link; FIRST: whose link "
        "answers first for a product in two categories (home, other)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        catalog = Catalog(
            products=args.products,
            categories=args.categories,
            per_page=args.per_page,
            seed=args.seed,
            reprice=args.reprice,
        )
    except ValueError as exc:
        print(f"demo site: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Installed before binding so a signal during startup still exits cleanly.
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)

    site = DemoSite(
        catalog,
        host=args.host,
        port=args.port,
        delay_ms=args.delay_ms,
        break_layout=args.break_layout,
        ref_links=RefLinks(first=args.ref_links) if args.ref_links else None,
    )
    try:
        site.start()
    except OSError as exc:
        print(f"demo site: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    try:
        print(
            f"demo site: {site.url} ({len(catalog.products)} products, {catalog.page_count} pages)",
            flush=True,
        )
        # A timed wait keeps the main thread responsive to signals everywhere.
        while not stop.wait(0.5):
            pass
    finally:
        site.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
