#!/usr/bin/env python3
"""K-FAC's steps and time to the tuned NVLAMB's final validation loss, as fractions of NVLAMB's,
against tokens per step: every study's summary.json (bench/convergence/tune.sh) beside the
paper's Figure 7 point (BERT-Base, 8,192 x 128 tokens per step: 42.0% of the steps, 48.7% of the
time).

    bench/convergence/fraction_plot.py OUT.svg STUDY_DIR...

Prints the table it draws. A study whose seeds do not all reach the target has no mean: its
reached seeds are drawn as hollow marks and the table says how many reached it. Error bars span
the seeds' minimum to maximum.
"""
import json
import math
import os
import statistics
import sys

PAPER = {"tokens_per_step": 8192 * 128, "steps_fraction": 0.420, "time_fraction": 0.487}
W, H, L, R, T, B = 640, 400, 70, 170, 40, 60  # size and margins (px)
SERIES = (("steps_fraction", "steps", "#1f77b4", -4), ("time_fraction", "time", "#d62728", 4))


def load(dirs):
    studies = []
    for d in dirs:
        s = json.load(open(os.path.join(d, "summary.json")))
        s["name"] = os.path.basename(os.path.normpath(d))
        studies.append(s)
    return sorted(studies, key=lambda s: s["tokens_per_step"])


def scales(studies):
    xs = [math.log2(s["tokens_per_step"]) for s in studies] + [math.log2(PAPER["tokens_per_step"])]
    x0, x1 = math.floor(min(xs)) - 0.5, math.ceil(max(xs)) + 0.5
    ys = [v for s in studies for k, *_ in SERIES for v in s[k + "_per_seed"] if v is not None] + [0, 1.3]
    y1 = math.ceil(max(ys) * 5) / 5
    return (lambda x: L + (math.log2(x) - x0) / (x1 - x0) * (W - L - R)), (lambda y: H - B - y / y1 * (H - T - B)), x0, x1, y1


def axes(px, py, x0, x1, y1):
    out = [f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{py(1):.1f}" x2="{W - R}" y2="{py(1):.1f}" stroke="#888" stroke-dasharray="4 3"/>',
           f'<text x="{W - R + 4}" y="{py(1) + 4:.1f}" font-size="11">NVLAMB = 1</text>']
    for e in range(math.ceil(x0), math.floor(x1) + 1, 2):
        out.append(f'<text x="{px(2 ** e):.1f}" y="{H - B + 16}" font-size="11" text-anchor="middle">{2 ** e:,}</text>')
    for k in range(0, int(y1 * 5) + 1):
        y = k / 5
        out.append(f'<text x="{L - 6}" y="{py(y) + 4:.1f}" font-size="11" text-anchor="end">{100 * y:.0f}%</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 18}" font-size="12" text-anchor="middle">tokens per step</text>')
    out.append(f'<text x="16" y="{(T + H - B) / 2}" font-size="12" text-anchor="middle" '
               f'transform="rotate(-90 16 {(T + H - B) / 2})">K-FAC / NVLAMB to NVLAMB\'s final validation loss</text>')
    return out


def marks(studies, px, py):
    out = []
    for key, label, colour, dx in SERIES:
        for s in studies:
            x = px(s["tokens_per_step"]) + dx
            seeds = [v for v in s[key + "_per_seed"] if v is not None]
            if seeds:
                out.append(f'<line x1="{x:.1f}" y1="{py(min(seeds)):.1f}" x2="{x:.1f}" y2="{py(max(seeds)):.1f}" stroke="{colour}"/>')
            if s[key] is not None:
                out.append(f'<circle cx="{x:.1f}" cy="{py(s[key]):.1f}" r="4" fill="{colour}"/>')
            else:
                out += [f'<circle cx="{x:.1f}" cy="{py(v):.1f}" r="3" fill="white" stroke="{colour}"/>' for v in seeds]
        out.append(f'<rect x="{px(PAPER["tokens_per_step"]) + dx - 4:.1f}" y="{py(PAPER[key]) - 4:.1f}" width="8" height="8" fill="{colour}"/>')
    y = T + 10
    for key, label, colour, _ in SERIES:
        out.append(f'<circle cx="{W - R + 12}" cy="{y}" r="4" fill="{colour}"/><text x="{W - R + 20}" y="{y + 4}" font-size="11">{label} (ours, seeds)</text>')
        y += 16
    out.append(f'<rect x="{W - R + 8}" y="{y - 4}" width="8" height="8" fill="#555"/><text x="{W - R + 20}" y="{y + 4}" font-size="11">paper, Figure 7</text>')
    return out


def table(studies):
    def cell(s, key):
        seeds = s[key + "_per_seed"]
        reached = [v for v in seeds if v is not None]
        if s[key] is not None:
            sd = statistics.stdev(reached) if len(reached) > 1 else 0.0
            return f"{100 * s[key]:.1f}% ± {100 * sd:.1f}"
        return f"not reached by {len(seeds) - len(reached)} of {len(seeds)} seeds"
    rows = ["| study | model | tokens per step | steps | time |", "|---|---|---|---|---|"]
    rows += [f"| {s['name']} | {s['model']} | {s['tokens_per_step']:,} | {cell(s, 'steps_fraction')} | {cell(s, 'time_fraction')} |"
             for s in studies]
    rows.append(f"| paper, Figure 7 | BERT-Base | {PAPER['tokens_per_step']:,} | 42.0% | 48.7% |")
    return "\n".join(rows)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: fraction_plot.py OUT.svg STUDY_DIR...")
    studies = load(sys.argv[2:])
    px, py, x0, x1, y1 = scales(studies)
    body = axes(px, py, x0, x1, y1) + marks(studies, px, py)
    title = "K-FAC with PipeFisher against the tuned NVLAMB: fraction of NVLAMB's steps and time"
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">'
           f'<rect width="{W}" height="{H}" fill="white"/><text x="{W / 2}" y="22" font-size="13" text-anchor="middle">{title}</text>'
           + "".join(body) + "</svg>\n")
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "w") as f:
        f.write(svg)
    os.replace(tmp, sys.argv[1])
    print(table(studies))


if __name__ == "__main__":
    main()
