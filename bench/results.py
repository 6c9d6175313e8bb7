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
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "load_average_at_start": list(os.getloadavg()),
    }


class Results:
    """Each figure: name, value, unit and the comparison it belongs to (P1, P3, ...). Written
    after every figure, so a run cut short still leaves what it measured."""

    def __init__(self, path: Path, keep_earlier: bool = False) -> None:
        self.path = path
        self.run = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine()}
        self.figures: list[dict[str, Any]] = []
        # A run of some parts only keeps the other parts' figures of earlier runs, each marked
        # with when it was measured, so results.json stays one complete set.
        self.earlier: list[dict[str, Any]] = []
        self.earlier_runs: dict[str, Any] = {}
        if keep_earlier and path.exists():
            try:
                before = json.loads(path.read_text())
            except ValueError:
                before = {}
            for figure in before.get("figures", []):
                self.earlier.append({**figure, "measured": figure.get("measured", before.get("started"))})
            # The machine and load of each earlier run whose figures are kept.
            self.earlier_runs = {
                **before.get("earlier_runs", {}),
                before.get("started"): {
                    k: v for k, v in before.items() if k not in ("figures", "earlier_runs", "started")
                },
            }

    def add(self, comparison: str, name: str, value: float, unit: str, **detail: Any) -> float:
        self.figures.append(
            {"comparison": comparison, "name": name, "value": round(float(value), 4), "unit": unit, **detail}
        )
        self.save()
        return value

    def save(self) -> None:
        measured = {f["comparison"] for f in self.figures}
        kept = [f for f in self.earlier if f["comparison"] not in measured]
        runs = {f["measured"] for f in kept}
        earlier = {"earlier_runs": {k: v for k, v in self.earlier_runs.items() if k in runs}} if kept else {}
        self.path.write_text(json.dumps({**self.run, **earlier, "figures": kept + self.figures}, indent=1) + "\n")
