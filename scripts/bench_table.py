#!/usr/bin/env python3
"""Prints criterion results (target/criterion) as a markdown table: one row per bench.

    scripts/bench_table.py [BASELINE ...]     # default: new

Reads $CRITERION_HOME if set. Each column is a saved criterion baseline (`--save-baseline NAME`, or `new`: the last run);
values are the median time per iteration (less sensitive than the mean to
interference from other work on a shared machine). With two baselines, a last column gives the change.
Standard library only.
"""
import json
import os
import sys

ROOT = os.environ.get("CRITERION_HOME") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "target", "criterion")


def fmt(ns):
    if ns is None:
        return "–"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.1f} ns"


def main():
    baselines = sys.argv[1:] or ["new"]
    rows = {}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        if "benchmark.json" not in filenames:
            continue
        with open(os.path.join(dirpath, "benchmark.json")) as f:
            bench = json.load(f)
        name = bench["full_id"]
        base = os.path.dirname(dirpath)
        for b in baselines:
            path = os.path.join(base, b, "estimates.json")
            if os.path.exists(path):
                with open(path) as f:
                    rows.setdefault(name, {})[b] = json.load(f)["median"]["point_estimate"]
    head = "| bench | " + " | ".join(baselines) + (" | change |" if len(baselines) == 2 else " |")
    print(head)
    print("|" + "---|" * (len(baselines) + 1 + (len(baselines) == 2)))
    order = {"first": 0, "duplicate": 1, "in_flight": 2, "record": 3}
    for name in sorted(rows, key=lambda n: (order.get(n.split("/")[0], 9), n.split("/")[-1], n)):
        vals = [rows[name].get(b) for b in baselines]
        line = f"| {name} | " + " | ".join(fmt(v) for v in vals) + " |"
        if len(baselines) == 2:
            a, b = vals
            line += f" {((b - a) / a * 100):+.0f} % |" if a and b else " – |"
        print(line)


if __name__ == "__main__":
    main()
