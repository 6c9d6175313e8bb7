"""The figures of one bench run, kept in ``bench/results.json`` so that runs can be compared."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "load_average_at_start": list(os.getloadavg())}


class Results:
    """Each figure: name, value, unit and the comparison it belongs to (P1, P3, ...). Written
    after every figure, so a run cut short still leaves what it measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.run = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine()}
        self.figures: list[dict[str, Any]] = []
        # A run of some parts (--only) keeps the other comparisons' latest figures, each marked
        # with the run it came from, so the file always holds the latest of every comparison.
        self.earlier: list[dict[str, Any]] = []
        try:
            before = json.loads(path.read_text())
            self.earlier = [{**f, "run_started": f.get("run_started", before.get("started"))}
                            for f in before.get("figures", [])]
        except (OSError, ValueError, AttributeError):
            pass

    def add(self, comparison: str, name: str, value: float, unit: str, **detail: Any) -> float:
        self.figures.append({"comparison": comparison, "name": name, "value": round(float(value), 4),
                             "unit": unit, **detail})
        self.save()
        return value

    def save(self) -> None:
        measured = {f["comparison"] for f in self.figures}
        kept = [f for f in self.earlier if f.get("comparison") not in measured]
        self.path.write_text(json.dumps({**self.run, "figures": self.figures + kept}, indent=1) + "\n")
