#!/usr/bin/env python3
"""K-FAC's steps and time to the tuned NVLAMB's final validation loss, as fractions of NVLAMB's,
against tokens per step: every study's summary.json (bench/convergence/tune.sh) beside the
paper's Figure 7 point (BERT-Base, 8,192 x 128 tokens per step: 42.0% of the steps, 48.7% of the
time).

    bench/convergence/fraction_plot.py OUT.svg STUDY_DIR...

Prints the tables it draws. One row per study (tokens per step, upward), the fraction along the
horizontal axis. Every seed is drawn: a filled mark where it reached the target, an open mark in
the "not reached" column at the plot's right edge where it never did; the tuning seed (the one
that chose the settings: summary.json's tuning_seed, else seed 1, which tune.sh's grids run) as a
diamond, the test seeds as circles. A study whose seeds all reached the target also shows their
mean (a tick) and range (a line); one whose seeds did not all reach it has no mean.

Below, for each study whose summary.json has an analysis over test seeds (study.py analysis),
K-FAC's final masked-LM loss minus NVLAMB's: d (both full runs) and, with budget-matched runs, b
(K-FAC with its schedule shortened to a fraction f of the steps, against NVLAMB's full run), each
as the test seeds' mean and its 95% t-interval.
"""
import json
import math
import os
import statistics
import sys

PAPER = {"tokens_per_step": 8192 * 128, "steps_fraction": 0.420, "time_fraction": 0.487}
W, H, L, R, T, B = 720, 420, 90, 190, 56, 56  # size and margins (px)
NR = 64  # the "not reached" column at the plot's right edge (px)
SERIES = (("steps_fraction", "steps", "#1f77b4", -5), ("time_fraction", "time", "#d62728", 5))
DH = 240  # the loss-difference panel's height (px), below the fractions
DIFF = (("d", "#1f77b4", -7), ("b", "#d62728", 7))  # equal steps; budget-matched


def load(dirs):
    studies = []
    for d in dirs:
        s = json.load(open(os.path.join(d, "summary.json")))
        s["name"] = os.path.basename(os.path.normpath(d))
        studies.append(s)
    return sorted(studies, key=lambda s: s["tokens_per_step"])


def scales(studies):
    ys = [math.log2(s["tokens_per_step"]) for s in studies] + [math.log2(PAPER["tokens_per_step"])]
    y0, y1 = math.floor(min(ys)) - 0.8, math.ceil(max(ys)) + 0.8
    xs = [v for s in studies for k, *_ in SERIES for v in s.get(k + "_per_seed", []) if v is not None] + [1.2]
    x1 = math.ceil(max(xs) * 5) / 5
    right = W - R - NR  # the fraction axis ends here; the not-reached column follows
    return ((lambda x: L + x / x1 * (right - L)), (lambda t: H - B - (math.log2(t) - y0) / (y1 - y0) * (H - T - B)),
            x1, right)


def mark(x, y, colour, diamond, filled):
    fill = colour if filled else "white"
    if diamond:
        return (f'<polygon points="{x:.1f},{y - 4.5:.1f} {x + 4.5:.1f},{y:.1f} {x:.1f},{y + 4.5:.1f} {x - 4.5:.1f},{y:.1f}" '
                f'fill="{fill}" stroke="{colour}" stroke-width="1.3"/>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{fill}" stroke="{colour}" stroke-width="1.3"/>'


def axes(studies, px, py, x1, right):
    out = [f'<line x1="{L}" y1="{H - B}" x2="{right}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<rect x="{right + 6}" y="{T}" width="{NR - 6}" height="{H - T - B}" fill="#f4f4f4" stroke="#bbb"/>',
           f'<text x="{right + NR / 2 + 3:.1f}" y="{T - 6}" font-size="11" text-anchor="middle">not reached</text>',
           f'<line x1="{px(1):.1f}" y1="{T}" x2="{px(1):.1f}" y2="{H - B}" stroke="#888" stroke-dasharray="4 3"/>',
           f'<text x="{px(1):.1f}" y="{T - 6}" font-size="11" text-anchor="middle">NVLAMB = 1</text>']
    for k in range(0, int(round(x1 * 5)) + 1):
        x = px(k / 5)
        out.append(f'<text x="{x:.1f}" y="{H - B + 16}" font-size="11" text-anchor="middle">{20 * k}%</text>')
    rows = sorted({s["tokens_per_step"] for s in studies} | {PAPER["tokens_per_step"]})
    for t in rows:
        out.append(f'<line x1="{L}" y1="{py(t):.1f}" x2="{right + NR}" y2="{py(t):.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{L - 6}" y="{py(t) + 4:.1f}" font-size="11" text-anchor="end">{t:,}</text>')
    out.append(f'<text x="{(L + right) / 2:.1f}" y="{H - 16}" font-size="12" text-anchor="middle">'
               f"K-FAC / NVLAMB to NVLAMB's final validation loss (same seed)</text>")
    out.append(f'<text x="16" y="{(T + H - B) / 2}" font-size="12" text-anchor="middle" '
               f'transform="rotate(-90 16 {(T + H - B) / 2})">tokens per step</text>')
    return out


def marks(studies, px, py, right):
    out = []
    for key, label, colour, dy in SERIES:
        for s in studies:
            if key + "_per_seed" not in s:  # a study without crossings (its analysis is below)
                continue
            y = py(s["tokens_per_step"]) + dy
            seeds = s.get("seeds") or list(range(1, len(s[key + "_per_seed"]) + 1))
            tuning = s.get("tuning_seed", 1)
            values = list(zip(seeds, s[key + "_per_seed"]))
            reached = [v for _, v in values if v is not None]
            if s[key] is not None and len(reached) > 1:  # every seed reached: their range and mean
                out.append(f'<line x1="{px(min(reached)):.1f}" y1="{y:.1f}" x2="{px(max(reached)):.1f}" y2="{y:.1f}" '
                           f'stroke="{colour}" stroke-width="1.5"/>')
            if s[key] is not None:
                out.append(f'<line x1="{px(s[key]):.1f}" y1="{y - 6:.1f}" x2="{px(s[key]):.1f}" y2="{y + 6:.1f}" '
                           f'stroke="{colour}" stroke-width="2"/>')
            unreached = [seed for seed, v in values if v is None]
            for seed, v in values:
                if v is not None:
                    out.append(mark(px(v), y, colour, seed == tuning, True))
                else:  # at the plot's right edge, side by side when several
                    i = unreached.index(seed)
                    x = right + 6 + (NR - 6) / 2 + (i - (len(unreached) - 1) / 2) * 10
                    out.append(mark(x, y, colour, seed == tuning, False))
        p = PAPER
        out.append(f'<rect x="{px(p[key]) - 4:.1f}" y="{py(p["tokens_per_step"]) + dy - 4:.1f}" width="8" height="8" fill="{colour}"/>')
    x, y = W - R + 14, T + 4
    legend = [(mark(x, y, SERIES[0][2], False, True), "steps fraction"),
              (mark(x, y, SERIES[1][2], False, True), "time fraction"),
              (mark(x, y, "#555", False, True), "test seed"),
              (mark(x, y, "#555", True, True), "tuning seed"),
              (mark(x, y, "#555", False, False), "not reached (right edge)"),
              (f'<line x1="{x}" y1="{y - 6}" x2="{x}" y2="{y + 6}" stroke="#555" stroke-width="2"/>', "mean, all seeds reached"),
              (f'<rect x="{x - 4}" y="{y - 4}" width="8" height="8" fill="#555"/>', "paper, Figure 7")]
    for i, (shape, text) in enumerate(legend):
        dy = 18 * i
        out.append(f'<g transform="translate(0 {dy})">{shape}</g>'
                   f'<text x="{x + 10}" y="{y + dy + 4}" font-size="11">{text}</text>')
    return out


def intervals(s):
    """A study's final-loss differences over its test seeds: (label, colour, dy, stats) for d (both
    full runs) and b (budget-matched K-FAC against NVLAMB's full run), each with its ci95."""
    a = s.get("analysis") or {}
    out = [("d", DIFF[0][1], DIFF[0][2], a)] if "ci95" in a else []
    b = a.get("budget_matched")
    if b and "ci95" in b:
        out.append((f"b, f = {b['fraction']:g}", DIFF[1][1], DIFF[1][2], b))
    return out


def difference_panel(studies, top):
    """K-FAC's final masked-LM loss minus NVLAMB's, mean over test seeds and 95% t-interval, one row
    per study with an analysis; below the fractions, at y offset `top`."""
    rows = [s for s in studies if intervals(s)]
    if not rows:
        return []
    ends = [abs(v) for s in rows for *_, st in intervals(s) for v in st["ci95"]]
    x1 = max(0.2, math.ceil(max(ends) * 10) / 10)
    right = W - R - NR
    px = lambda v: L + (v + x1) / (2 * x1) * (right - L)
    ys = {s["tokens_per_step"]: top + DH - B - (i + 0.5) * (DH - T - B) / len(rows) for i, s in enumerate(rows)}  # upward
    out = [f'<line x1="{L}" y1="{top + DH - B}" x2="{right}" y2="{top + DH - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{top + T}" x2="{L}" y2="{top + DH - B}" stroke="black"/>',
           f'<line x1="{px(0):.1f}" y1="{top + T}" x2="{px(0):.1f}" y2="{top + DH - B}" stroke="#888" stroke-dasharray="4 3"/>',
           f'<text x="{(L + right) / 2:.1f}" y="{top + DH - 16}" font-size="12" text-anchor="middle">'
           "final masked-LM loss, K-FAC minus NVLAMB (nats): test seeds' mean, 95% t-interval</text>",
           f'<text x="16" y="{top + (T + DH - B) / 2}" font-size="12" text-anchor="middle" '
           f'transform="rotate(-90 16 {top + (T + DH - B) / 2})">tokens per step</text>']
    for k in range(-int(round(x1 * 10)), int(round(x1 * 10)) + 1, max(1, int(round(x1 * 10)) // 4)):
        out.append(f'<text x="{px(k / 10):.1f}" y="{top + DH - B + 16}" font-size="11" text-anchor="middle">{k / 10:+.1f}</text>')
    for s in rows:
        y = ys[s["tokens_per_step"]]
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{s["tokens_per_step"]:,}</text>')
        for label, colour, dy, st in intervals(s):
            lo, hi = (max(-x1, min(x1, v)) for v in st["ci95"])
            out.append(f'<line x1="{px(lo):.1f}" y1="{y + dy:.1f}" x2="{px(hi):.1f}" y2="{y + dy:.1f}" stroke="{colour}" stroke-width="1.5"/>')
            out.append(mark(px(st["mean_difference"]), y + dy, colour, False, True))
            out.append(f'<text x="{right + 8}" y="{y + dy + 4:.1f}" font-size="10" fill="{colour}">{label}, {st["n"]} seeds</text>')
    return out


def table(studies):
    def cell(s, key):
        if key + "_per_seed" not in s:
            return "not read (see the differences below)"
        seeds = s[key + "_per_seed"]
        reached = [v for v in seeds if v is not None]
        if s[key] is not None:
            sd = statistics.stdev(reached) if len(reached) > 1 else 0.0
            return f"{100 * s[key]:.1f}% ± {100 * sd:.1f}"
        others = f" (the others: {', '.join(f'{100 * v:.1f}%' for v in reached)})" if reached else ""
        return f"not reached by {len(seeds) - len(reached)} of {len(seeds)} seeds{others}"
    rows = ["| study | model | tokens per step | steps | time |", "|---|---|---|---|---|"]
    rows += [f"| {s['name']} | {s['model']} | {s['tokens_per_step']:,} | {cell(s, 'steps_fraction')} | {cell(s, 'time_fraction')} |"
             for s in studies]
    rows.append(f"| paper, Figure 7 | BERT-Base | {PAPER['tokens_per_step']:,} | 42.0% | 48.7% |")
    diffs = [f"| {s['name']} | {s['tokens_per_step']:,} | {label} | {st['n']} | {st['mean_difference']:+.4f} | "
             f"[{st['ci95'][0]:+.4f}, {st['ci95'][1]:+.4f}] | {st['upper95']:+.4f} |"
             for s in studies for label, _, _, st in intervals(s)]
    if diffs:
        rows += ["", "| study | tokens per step | difference | test seeds | mean (nats) | 95% t-interval | one-sided 95% bound |",
                 "|---|---|---|---|---|---|---|"] + diffs
    return "\n".join(rows)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: fraction_plot.py OUT.svg STUDY_DIR...")
    studies = load(sys.argv[2:])
    px, py, x1, right = scales(studies)
    diff = difference_panel(studies, H)
    height = H + (DH if diff else 0)
    body = axes(studies, px, py, x1, right) + marks(studies, px, py, right) + diff
    title = "K-FAC with PipeFisher against the tuned NVLAMB: fraction of NVLAMB's steps and time"
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif">'
           f'<rect width="{W}" height="{height}" fill="white"/><text x="{W / 2}" y="22" font-size="13" text-anchor="middle">{title}</text>'
           + "".join(body) + "</svg>\n")
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "w") as f:
        f.write(svg)
    os.replace(tmp, sys.argv[1])
    print(table(studies))


if __name__ == "__main__":
    main()
