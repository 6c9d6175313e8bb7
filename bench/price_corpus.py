"""Price cleaning against price-parser's own test corpus: `.venv/bin/python bench/price_corpus.py`.

The corpus is price-parser 0.5.1's ``tests/test_price_parsing.py`` (1,185 examples from real
pages, BSD licence), vendored as ``tests/data/price_parser/price_parsing_examples.py``. Each
example is read as price-parser's own test reads it: the price text, the nearby text as a
currency hint, and the decimal separator when the example gives one.

* **Amounts**: an amount is right when it equals the expected one rounded to the currency's
  ISO 4217 minor unit (we store ``34.992001`` GBP as ``34.99``); "exact" counts unrounded
  equality. An example with no price is right when nothing is read.
* **Currencies**: for every example whose expected currency string names one ISO code
  (``tests/data/price_parser/currencies.tsv``; strings shared by several currencies, such as
  ``kr`` or ``Rs``, are left out), whether the ISO code we read is that code.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "price_parser"
sys.path.insert(0, str(ROOT))

from price_parser import Price  # noqa: E402

from scraper.cleaning.currency import minor_units  # noqa: E402
from scraper.cleaning.price import read_price  # noqa: E402


@dataclass
class Figures:
    examples: int = 0
    amounts_right: int = 0
    amounts_exact: int = 0
    price_parser_amounts: int = 0
    named: int = 0
    currencies_right: int = 0
    wrong_amounts: list[tuple[Any, ...]] = field(default_factory=list)
    wrong_currencies: list[tuple[Any, ...]] = field(default_factory=list)


def examples() -> list[Any]:
    spec = importlib.util.spec_from_file_location("price_parsing_examples", DATA / "price_parsing_examples.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = sorted(
        n for n in vars(module) if n.startswith("PRICE_PARSING_EXAMPLES") or n.startswith("PRICE_PARSING_DECIMAL")
    )
    return [example for name in names for example in getattr(module, name)]


def currency_truth() -> dict[str, str | None]:
    truth: dict[str, str | None] = {}
    for line in (DATA / "currencies.tsv").read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        mark, iso = line.split("\t")
        truth[mark] = None if iso == "?" else iso
    return truth


def _same(got: Decimal | None, expected: Decimal | None, code: str | None) -> bool:
    if expected is None or got is None:
        return got is expected
    rounded = expected.quantize(Decimal(1).scaleb(-minor_units(code)))
    return got == expected or got == rounded


def measure() -> Figures:
    truth = currency_truth()
    figures = Figures()
    for example in examples():
        figures.examples += 1
        reading = read_price(
            example.price_raw, currency_hint=example.currency_raw, decimal_separator=example.decimal_separator
        )
        iso = truth.get(example.currency) if example.currency else None
        expected = example.amount
        if _same(reading.amount, expected, reading.currency or iso):
            figures.amounts_right += 1
        else:
            figures.wrong_amounts.append((example.price_raw, example.currency_raw, expected, reading))
        if reading.amount == expected:
            figures.amounts_exact += 1
        alone = Price.fromstring(example.price_raw, example.currency_raw, example.decimal_separator)
        if alone.amount == expected:
            figures.price_parser_amounts += 1
        if iso:
            figures.named += 1
            if reading.currency == iso:
                figures.currencies_right += 1
            else:
                figures.wrong_currencies.append((example.price_raw, example.currency_raw, iso, reading))
    return figures


def main() -> None:
    figures = measure()
    verbose = "-v" in sys.argv
    print(f"examples: {figures.examples}")
    print(f"amounts right (at the currency's minor unit): {figures.amounts_right}")
    print(f"amounts exactly equal: {figures.amounts_exact}")
    print(f"price-parser alone, same inputs: {figures.price_parser_amounts}")
    share = figures.currencies_right / figures.named if figures.named else 0
    print(f"ISO currency right: {figures.currencies_right} of {figures.named} naming one ({share:.1%})")
    if verbose:
        for row in figures.wrong_amounts:
            print("amount:", *map(repr, row))
        for row in figures.wrong_currencies:
            print("currency:", *map(repr, row))


if __name__ == "__main__":
    main()
