#!/usr/bin/env python3
"""Turns the output of `compare/run` runs into a markdown table and an SVG plot.

    compare/run | tee run1.txt      # once per run, from the project root
    scripts/compare_plot.py run1.txt run2.txt run3.txt > table.md   # writes compare.svg too

Each input is one run's table (rows `NAME MIX RPS P99 NON2XX CPU/REQ RCV REDIS WRK CMDS/REQ`).
Ratios are taken within a run (ours / handwritten-redis and ours / rustango on Redis, ours-mem /
handwritten in memory): the table gives each run's req/s and CPU per request (receiver + Redis)
and their ratios, and the plot draws req/s per receiver and mix, one bar per run. Standard
library only.
"""
import os
import re
import sys

LINE = re.compile(
    r"^(\S+)\s+(unique|dup)\s+(\d+)\s+(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+(\S+)\s+(\S+)$"
)
PAIRS = [
    ("ours", "handwritten-redis", "Redis"),
    ("ours", "rustango", "Redis"),
    ("ours-mem", "handwritten", "memory"),
]
MIXES = [("unique", "first deliveries"), ("dup", "duplicates")]
COLORS = {
    "ours": "#2b6cb0",
    "rustango": "#c05621",
    "handwritten-redis": "#718096",
    "ours-mem": "#2f855a",
    "handwritten": "#a0aec0",
}


def parse(path):
    run = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                name, mix, rps, p99, bad, cpu, _rcv, _redis, _wrk, cmds = m.groups()
                run[(name, mix)] = {
                    "rps": float(rps),
                    "p99": p99,
                    "non2xx": int(bad),
                    "cpu": float(cpu),
                    "cmds": cmds,
                }
    return run


def table(runs):
    out = [
        "| store | mix | ours req/s | peer | peer req/s | req/s ratio | CPU µs/req (ours, peer) "
        "| CPU ratio | Redis cmds/req (ours, peer) |",
        "|---|---|---:|---|---:|---:|---|---:|---|",
    ]
    for ours, peer, store in PAIRS:
        for mix, label in MIXES:
            for i, run in enumerate(runs, 1):
                a, b = run.get((ours, mix)), run.get((peer, mix))
                if not a or not b:
                    continue
                out.append(
                    f"| {store} | {label} (run {i}) | {a['rps']:,.0f} | {peer} | {b['rps']:,.0f} "
                    f"| **{a['rps'] / b['rps']:.2f}×** | {a['cpu']:.1f}, {b['cpu']:.1f} "
                    f"| {a['cpu'] / b['cpu']:.2f}× | {a['cmds']}, {b['cmds']} |"
                )
    return "\n".join(out)


def svg(runs, path):
    names = list(COLORS)
    groups = [(mix, label) for mix, label in MIXES]
    width, height, left, top, bottom = 900, 380, 70, 40, 70
    plot_w, plot_h = width - left - 20, height - top - bottom
    top_rps = max((r["rps"] for run in runs for r in run.values()), default=1.0) * 1.1
    group_w = plot_w / len(groups)
    bar_w = group_w / (len(names) * len(runs) + len(names) + 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<text x="{left}" y="20" font-size="14">req/s by receiver and mix '
        f"(one bar per run; wrk, 32 connections)</text>",
    ]
    for i in range(6):
        v = top_rps * i / 5
        y = top + plot_h - plot_h * i / 5
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" stroke="#e2e8f0"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v / 1000:.0f}k</text>')
    for g, (mix, label) in enumerate(groups):
        x0 = left + g * group_w + bar_w
        parts.append(
            f'<text x="{left + g * group_w + group_w / 2:.1f}" y="{height - 40}" '
            f'text-anchor="middle">{label}</text>'
        )
        for n, name in enumerate(names):
            for r, run in enumerate(runs):
                cell = run.get((name, mix))
                x = x0 + (n * (len(runs) + 1) + r) * bar_w
                if not cell:
                    continue
                h = plot_h * cell["rps"] / top_rps
                parts.append(
                    f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w * 0.9:.1f}" '
                    f'height="{h:.1f}" fill="{COLORS[name]}"><title>{name} {mix} run {r + 1}: '
                    f'{cell["rps"]:,.0f} req/s</title></rect>'
                )
    for n, name in enumerate(names):
        x = left + n * 165
        parts.append(f'<rect x="{x}" y="{height - 22}" width="12" height="12" fill="{COLORS[name]}"/>')
        parts.append(f'<text x="{x + 18}" y="{height - 12}">{name}</text>')
    parts.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = [parse(p) for p in sys.argv[1:]]
    here = os.path.dirname(os.path.abspath(__file__))
    svg(runs, os.path.join(here, "..", "benches", "results", "compare.svg"))
    print(table(runs))


if __name__ == "__main__":
    main()
