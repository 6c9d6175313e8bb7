"""The date fast path against dateparser: `.venv/bin/python bench/date_parity.py [N]`.

N (2,000) random instants from 1990 to 2060 (seeded, so every run is the same), each written in
the five layouts the fast path takes, read in five time zones and three date orders. Counts the
strings the fast path answers, those where it equals dateparser, and those where it deliberately
does not (the DST fold or a skipped hour; years past 2037): any other difference is a bug.
"""

from __future__ import annotations

import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scraper.cleaning.dates import _ABSOLUTE_PARSERS, _parse_common, _parse_text  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_dates_languages import _ZONES, _deliberately_different, _layouts  # noqa: E402


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rng = random.Random(14)
    start, span = datetime(1990, 1, 1), (datetime(2060, 12, 31) - datetime(1990, 1, 1)).total_seconds()
    answered = equal = documented = other = 0
    for _ in range(count):
        moment = (start + timedelta(seconds=rng.uniform(0, span))).replace(second=0, microsecond=0)
        zone, order = rng.choice(_ZONES), rng.choice([None, "DMY", "MDY"])
        hour12 = moment.hour % 12 or 12
        for text in _layouts(moment, hour12, "PM" if moment.hour >= 12 else "AM"):
            fast = _parse_common(text, order, zone)
            if fast is None:
                continue
            answered += 1
            if fast == _parse_text(text, order, zone, ("en",), _ABSOLUTE_PARSERS):
                equal += 1
            elif _deliberately_different(text, moment, zone):
                documented += 1
            else:
                other += 1
                print("differs:", text, zone, order)
    print(
        f"fast path answered {answered} strings: {equal} equal to dateparser, "
        f"{documented} deliberately not (fold, skipped hour, past 2037), {other} other differences"
    )


if __name__ == "__main__":
    main()
