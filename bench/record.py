"""Where every bench writes its figures: `bench/results/NAME.json` holds the raw numbers and the rows of the docs'
performance table (what, figure), so `python bench/performance_table.py` regenerates that table from measurements."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def save(name: str, rows: list[tuple[str, str]], data: dict[str, Any]) -> Path:
    """Write one bench's results; `rows` are its lines in the docs' performance table."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    machine = {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()}
    path.write_text(json.dumps({"measured": time.strftime("%Y-%m-%d"), "host": machine,
                                "rows": [list(row) for row in rows], "data": data}, indent=1) + "\n")
    print(f"wrote {path.relative_to(RESULTS.parent.parent)}")
    return path
