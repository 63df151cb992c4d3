#!/usr/bin/env python3
"""Start-up time: how long `import pyllama`, `from pyllama import Llama` and
`pyllama --help` take, each as a fresh process, beside a bare `python -c pass` (the
interpreter's own start-up, which every row includes).

Each command runs --warmup times unmeasured (so the files are in the page cache) and then
--runs times; the table gives median and minimum wall time in ms. Targets (issue 23):
import pyllama < 100 ms, from pyllama import Llama < 300 ms, pyllama --help < 300 ms.

    python benchmarks/startup.py [--runs 20] [--warmup 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGETS_MS = {"import pyllama": 100, "from pyllama import Llama": 300, "pyllama --help": 300}


def commands() -> dict[str, list[str]]:
    py = sys.executable
    exe = shutil.which("pyllama", path=str(Path(py).parent)) or shutil.which("pyllama")
    cli = [exe, "--help"] if exe else [py, "-m", "pyllama", "--help"]
    return {
        "python -c pass": [py, "-c", "pass"],
        "import pyllama": [py, "-c", "import pyllama"],
        "from pyllama import Llama": [py, "-c", "from pyllama import Llama"],
        "pyllama --help": cli,
    }


def time_once(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    rows = {}
    for name, cmd in commands().items():
        for _ in range(a.warmup):
            time_once(cmd)
        ts = [time_once(cmd) for _ in range(a.runs)]
        rows[name] = {"median_ms": statistics.median(ts), "min_ms": min(ts), "target_ms": TARGETS_MS.get(name)}
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"| command | median ms | min ms | target ms |\n|---|---:|---:|---:|")
    for name, r in rows.items():
        tgt = r["target_ms"]
        mark = "" if tgt is None else (" (met)" if r["median_ms"] < tgt else " (missed)")
        print(f"| `{name}` | {r['median_ms']:.0f} | {r['min_ms']:.0f} | {tgt if tgt else '-'}{mark} |")


if __name__ == "__main__":
    main()
