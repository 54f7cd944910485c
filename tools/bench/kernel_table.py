#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel device times by kernel name.

Reads the CSV that `ncu --metrics gpu__time_duration.sum --csv --log-file F.csv` writes and
prints one row per kernel name (template arguments dropped): launches, total time, share.
Usage: kernel_table.py F.csv [--steps N] (N: how many steps the capture spans, so the
times are shown per step).
"""
import csv
import re
import sys
from collections import defaultdict


def short_name(name):
    # Drop template arguments and parameter lists: "void f<...>(...)" -> "f".
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    s = "".join(out).strip()
    s = re.sub(r"^void ", "", s)
    return s.split("::")[-1] or name[:60]


def main():
    path = sys.argv[1]
    steps = 1
    if "--steps" in sys.argv:
        steps = int(sys.argv[sys.argv.index("--steps") + 1])
    times, counts = defaultdict(float), defaultdict(int)
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # skip ncu's own messages
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0,
                 "msecond": 1.0}.get(unit, 1e-6)
        k = short_name(row["Kernel Name"])
        times[k] += value * scale
        counts[k] += 1
    total = sum(times.values())
    print(f"{'kernel':60s} {'launches':>9s} {'ms/step':>9s} {'share':>7s}")
    for k, t in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"{k[:60]:60s} {counts[k] / steps:9.1f} {t / steps:9.2f} {100 * t / total:6.1f}%")
    print(f"{'total':60s} {sum(counts.values()) / steps:9.1f} {total / steps:9.2f}")


if __name__ == "__main__":
    main()
