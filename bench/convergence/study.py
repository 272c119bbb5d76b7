#!/usr/bin/env python3
"""The tables of bench/convergence/tune.sh (it calls this; see its header for the study).

    study.py grid OUT STEPS "LRS" "RATIOS" "DAMPINGS" DEFAULT_DAMPING
        grid.csv and best.json (each optimizer's best setting by whole-split masked-LM loss when every
        run has a record with it, else by final validation loss)
    study.py summary OUT STEPS "SEEDS" BIN MODEL TOKENS_PER_STEP VALID.bin TRAIN.bin VOCAB [STEP_TIMES]
        seeds.csv, summary.md, summary.json and figure7.svg from the seed runs of the best settings;
        beside the targets, the language model's context-free floor (unigram.py: the held-out
        tokens' unigram entropy) and the plateau of a model that learned only the training tokens'
        frequencies (their cross-entropy) against NVLAMB's final language-model validation loss (without
        next-sentence prediction: `pipefisher eval` of each seed's saved weights over the whole
        held-out split), which shows whether NVLAMB left the plateau; and the analysis over test seeds
        (below)

    study.py analysis OUT "SEEDS" [STEP_TIMES]
        the analysis over test seeds, from the records alone (no binary): per seed, K-FAC's final
        whole-split masked-LM loss minus NVLAMB's (same seed); their mean, sample standard deviation,
        two-sided 95% t-interval over seeds and one-sided 95% upper bound, the same for budget-matched
        K-FAC runs (records named like the best's with -fF before -sSEED: its schedule shortened to a
        fraction F of the steps), and the one claim the rules of RESULTS's 65,536-token protocol
        allow. Seed 1 (TUNING_SEED: tune.sh's grid runs it) chose the settings: it is reported apart
        and never counted as a test seed.

    study.py direct OUT DIRECT_OUT NVLAMB_NAME KFAC_NAME
        one seed pair timed on the real pipeline (DIRECT_OUT/records: tune.sh with RANKS > 1): K-FAC's
        step time to NVLAMB's final validation loss over NVLAMB's, beside OUT's steps fraction x step ratio

    study.py curves OUT "STEPS"
        a markdown table of every record's validation loss at STEPS and its final language-model loss

    study.py paired OUT NAME_A NAME_B
        A's final language-model validation loss minus B's over the same held-out micro-batches,
        with the paired standard error, from their records (OUT/records/NAME.json, record.py)

A run's directory is OUT/runs/NAME with NAME as tune.sh's run_name: OPT-lrLR-wW[-dD]-sSEED, the
damping named only in a K-FAC grid over several. STEP_TIMES gives the step ratio r (PipeFisher's
step time over NVLAMB's) that turns a steps fraction into a time fraction, never a best-of-N:
either bench/pipefisher.sh's CSV (its median round at this study's tokens per step), or the
directory of a direct pair's records (tune.sh with RANKS=2: one NVLAMB and one K-FAC record, the
ratio of their mean step times). Without it, time is the runs' own summed step_time_s (the
machine's load during the runs shows in it). A crossing (K-FAC's first validation at or below
NVLAMB's final one) is read only at the steps where both optimizers were validated.
"""
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys

from record import final_eval
from unigram import read_ids, unigram_cross_entropy, unigram_entropy


def written(path, newline=None):
    """A file opened for writing under a temporary name, renamed to `path` once closed whole."""
    class Atomic:
        def __enter__(self):
            self.f = open(path + ".tmp", "w", newline=newline)
            return self.f

        def __exit__(self, kind, *_):
            self.f.close()
            if kind is None:
                os.replace(path + ".tmp", path)
            else:
                os.remove(path + ".tmp")
    return Atomic()


def run_name(opt, lr, w, seed, damping=None):
    return f"{opt}-lr{lr}-w{w}" + (f"-d{damping}" if damping else "") + f"-s{seed}"


def read_log(d):
    return [json.loads(l) for l in open(f"{d}/log.jsonl")] if os.path.exists(f"{d}/log.jsonl") else []


def grid_row(out, name):
    d = f"{out}/runs/{name}"
    status = int(open(f"{d}/status").read())
    rows = read_log(d)
    final = rows[-1]["loss"] if rows else float("nan")
    valid = [r["valid_loss"] for r in rows if r.get("valid_loss") is not None]
    v = valid[-1] if valid else float("nan")
    first = rows[0]["loss"] if rows else None
    diverged = status != 0 or not rows or not math.isfinite(v) or first is None or not (v < first)
    rec = f"{out}/records/{name}.json"
    lm = json.load(open(rec)).get("lm_loss") if os.path.exists(rec) else None
    return {"run": name, "exit": status, "steps": len(rows), "final_loss": final, "final_valid_loss": v,
            "lm_loss": lm if lm is not None else "", "diverged": diverged}


def grid_metric(table):
    """The key the best setting is chosen by: the whole-split masked-LM loss (the records' lm_loss,
    the 65,536 study's protocol) when every run has one, else the last validation (8 batches)."""
    return "lm_loss" if table and all(r["lm_loss"] != "" for r in table) else "final_valid_loss"


def earlier_grid(out, optimizers):
    """grid.csv's rows and best.json's settings of the optimizers a grid() call does not tune, kept:
    a probe's grid (SOAP's) beside a study's records leaves the study's K-FAC rows and best as they were."""
    rows = list(csv.DictReader(open(f"{out}/grid.csv"))) if os.path.exists(f"{out}/grid.csv") else []
    best = json.load(open(f"{out}/best.json")) if os.path.exists(f"{out}/best.json") else {}
    return ([r for r in rows if r["optimizer"] not in optimizers],
            {o: b for o, b in best.items() if o not in optimizers})


def grid(out, steps, lrs, ratios, dampings, default_damping, optimizers=("nvlamb", "kfac")):
    several = dampings != [default_damping]
    table, best = [], {}
    for opt in optimizers:
        for lr in lrs:
            for ratio in ratios:
                w = round(float(ratio) * steps)
                for d in (dampings if opt == "kfac" else [None]):
                    name = run_name(opt, lr, w, 1, d if several else None)
                    if not os.path.exists(f"{out}/runs/{name}/status"):
                        continue  # a cross-shaped grid (tune.sh called with parts of it): not run
                    r = {"optimizer": opt, "lr": lr, "warmup_ratio": ratio, "warmup_steps": w,
                         "damping": d or "", **grid_row(out, name)}
                    table.append(r)
    key = grid_metric(table)
    for r in table:
        if not r["diverged"] and (r["optimizer"] not in best or r[key] < best[r["optimizer"]][key]):
            best[r["optimizer"]] = r
    print(f"tune.sh: best settings chosen by {'whole-split masked-LM loss' if key == 'lm_loss' else 'last validation loss'}")
    earlier_rows, earlier_best = earlier_grid(out, optimizers)
    with written(f"{out}/grid.csv", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0].keys()), restval="", extrasaction="ignore")
        w.writeheader()
        w.writerows(earlier_rows + table)
    if set(best) != set(optimizers):
        sys.exit("tune.sh: every setting of " + " and ".join(o for o in optimizers if o not in best) + " diverged")
    with written(f"{out}/best.json") as f:
        json.dump({**earlier_best, **{o: {"lr": b["lr"], "warmup_steps": b["warmup_steps"],
                                          "damping": b["damping"] if several else ""} for o, b in best.items()}}, f)
    for o, b in best.items():
        edge = [k for k, vals in (("lr", lrs), ("warmup_ratio", ratios if len(ratios) > 1 else []),
                                  ("damping", dampings if o == "kfac" and several else []))
                if vals and b[k] in (vals[0], vals[-1])
                and not (k == "warmup_ratio" and float(b[k]) == 0)]  # no warm-up: the axis's bound, not an edge
        if edge:
            print(f"tune.sh: {o}'s best setting is on the grid's edge in {', '.join(edge)}: widen the grid")


def stats(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "n/a"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.4f} ± {sd:.4f} (min {min(xs):.4f}, max {max(xs):.4f})"


def record_rows(r):
    """A record's (record.py) rows as dicts: step, loss, step_time_s, valid_loss."""
    return [dict(zip(r["columns"], row)) for row in r["rows"]]


def arg_value(args, key):
    """The value of `--set KEY=VALUE` in a record's argument string, or None."""
    m = re.search(r"--set " + re.escape(key) + r"=(\S+)", args)
    return m and m.group(1)


def step_ratio(spec, tokens):
    """(r, source): PipeFisher's step time over NVLAMB's at this tokens per step, never a best-of-N.
    spec is bench/pipefisher.sh's CSV (the ratio of its median rounds) or a directory of a direct
    pair's records (tune.sh with RANKS > 1: its one NVLAMB and one K-FAC record, the ratio of their
    mean step times over every step); (None, None) without either."""
    if not spec or not os.path.exists(spec):
        return None, None
    if os.path.isdir(spec):
        recs = {}
        for f in sorted(os.listdir(f"{spec}/records")):
            if f.endswith(".json"):
                recs.setdefault(f.split("-")[0], []).append(json.load(open(f"{spec}/records/{f}")))
        if sorted(recs) != ["kfac", "nvlamb"] or any(len(v) != 1 for v in recs.values()):
            sys.exit(f"study.py: {spec}/records needs exactly one nvlamb and one kfac record")
        mean, shape = {}, set()
        for o, (r,) in recs.items():
            rows = record_rows(r)
            mean[o] = sum(x["step_time_s"] for x in rows) / len(rows)
            shape.add((int(arg_value(r["args"], "parallel.stages")), len(rows),
                       math.prod(int(arg_value(r["args"], k)) for k in
                                 ("parallel.micro_batches", "parallel.micro_batch_size", "model.seq_len"))))
        if len(shape) != 1 or next(iter(shape))[2] != tokens:
            sys.exit(f"study.py: {spec}'s pair is not one shape at {tokens} tokens per step: {shape}")
        ranks, steps, _ = shape.pop()
        return mean["kfac"] / mean["nvlamb"], (
            f"direct {ranks}-rank {steps}-step run, mean step time ({os.path.normpath(spec)}: "
            f"NVLAMB {mean['nvlamb']:.3f} s, K-FAC {mean['kfac']:.3f} s a step)")
    ms = {r["run"]: float(r["median_ms"]) for r in csv.DictReader(open(spec)) if int(r["tokens_per_step"]) == tokens}
    if not {"pipefisher", "nvlamb"} <= set(ms):
        return None, None
    return ms["pipefisher"] / ms["nvlamb"], (f"bench/pipefisher.sh, median round ({spec}: NVLAMB "
                                             f"{ms['nvlamb']:.1f} ms, PipeFisher {ms['pipefisher']:.1f} ms a step)")


class Study:
    def __init__(self, out, steps, seeds, binary, model):
        self.out, self.steps, self.seeds, self.binary, self.model = out, steps, seeds, binary, model
        self.best = json.load(open(f"{out}/best.json"))
        self.runs = {o: [f"{out}/runs/{run_name(o, b['lr'], b['warmup_steps'], s, b.get('damping') or None)}"
                         for s in seeds] for o, b in self.best.items()}

    def report(self, dirs, labels, target=None, svg=None):
        cmd = [self.binary, "report", *dirs, "--json", "--title",
               f"{self.model}: NVLAMB vs K-FAC (PipeFisher), tuned, {len(self.seeds)} seed{'s' if len(self.seeds) > 1 else ''}"]
        for l in labels:
            cmd += ["--label", l]
        if target is not None:
            cmd += ["--target", repr(target)]
        cmd += ["--out", svg or f"{self.out}/.scratch.svg"]
        return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)

    def per_seed(self):
        per = {}
        for o, dirs in self.runs.items():
            r = self.report(dirs, [f"s{s}" for s in self.seeds])["runs"]
            per[o] = [{"seed": s, "smoothed": x["final_smoothed_loss"], "final": x["final_loss"],
                       "valid": x["final_valid_loss"], "time_s": x["time_s"], "log": read_log(d)}
                      for s, d, x in zip(self.seeds, dirs, r)]
        return per


def first_valid_crossing(log, target, at=None):
    """The first step whose validation loss is at most target, and the summed step time to it; only
    the steps in `at` are read when given (the other optimizer's validation steps: both optimizers
    read at one cadence, as K-FAC validated more often in some studies)."""
    t = 0.0
    for r in log:
        t += r.get("step_time_s", 0.0)
        if r.get("valid_loss") is not None and r["valid_loss"] <= target and (at is None or r["step"] in at):
            return r["step"], t
    return None, None


def validated_steps(log):
    return {r["step"] for r in log if r.get("valid_loss") is not None}


def mean_or_none(xs):
    return None if not xs or any(x is None for x in xs) else statistics.mean(xs)


def pct(v):
    return "not reached" if v is None else f"{100 * v:.1f}%"


def final_lm_loss(binary, run_dir):
    """The language-model part of a run's final validation loss over the whole held-out split, its
    standard error and its micro-batches' shares with their positions (from the run's record, or a
    restored record's lm_loss and lm_shares.json, else `pipefisher eval` of its saved weights),
    or Nones without any of them."""
    record = os.path.join(os.path.dirname(os.path.dirname(run_dir)), "records", os.path.basename(run_dir) + ".json")
    if os.path.exists(record):  # record.py evaluated the final weights once, when the run ended
        r = json.load(open(record))
        if r.get("lm_loss") is not None:
            return r["lm_loss"], r["lm_loss_se"], r.get("lm_shares") and (r["lm_shares"], r["batch_positions"])
    if os.path.exists(f"{run_dir}/lm_loss"):
        lm, se = open(f"{run_dir}/lm_loss").read().split()
        per = json.load(open(f"{run_dir}/lm_shares.json")) if os.path.exists(f"{run_dir}/lm_shares.json") else {}
        return float(lm), float(se), per.get("lm_shares") and (per["lm_shares"], per["batch_positions"])
    if binary is None or not os.path.exists(f"{run_dir}/model.safetensors"):  # study.py analysis: records only
        return None, None, None
    j = final_eval(binary, run_dir)
    return j["lm_loss"], j["lm_loss_se"], j.get("lm_shares") and (j["lm_shares"], j["batch_positions"])


def paired_difference(a, b):
    """a's loss minus b's over the same micro-batches, (shares, positions) each, and its standard
    error: batch_mean_standard_error (src/train/trainer.hpp) of the micro-batches' differences, as
    `pipefisher eval --baseline` gives it. None when either lacks its shares or they differ in batches."""
    if not a or not b or a[1] != b[1]:
        return None
    d = [x - y for x, y in zip(a[0], b[0])]
    batches, all_pos, m = len(d), sum(a[1]), sum(d)
    se = math.sqrt(batches / (batches - 1) * sum((x - n * m / all_pos) ** 2 for x, n in zip(d, a[1])))
    return m, se


# Student's t quantiles t_{0.975,df} (two-sided 95%) and t_{0.95,df} (one-sided 95%), df = 1..10:
# the analysis over seeds needs no scipy. Each checked by integrating the t density (Simpson's
# rule): its probability below the value is 0.975 or 0.95 to within 4e-5.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
T_95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812}
LABEL = {"nvlamb": "NVLAMB", "kfac": "K-FAC", "soap": "SOAP"}  # the optimizers' names in text
TUNING_SEED = 1  # tune.sh's grids run seed 1: it chose the settings, so it is never a test seed
GOAL = (0.50, 0.55)  # issue 46's goal: at most these fractions of NVLAMB's steps and time


def over_seeds(xs):
    """Mean, sample standard deviation, standard error over seeds, two-sided 95% t-interval and
    one-sided 95% upper bound of per-seed differences xs (2 to 11 of them)."""
    n = len(xs)
    if not 2 <= n <= len(T_975) + 1:
        sys.exit(f"study.py: an interval over seeds needs 2 to {len(T_975) + 1} seeds, not {n}")
    mean, sd = statistics.mean(xs), statistics.stdev(xs)
    se = sd / math.sqrt(n)
    return {"n": n, "mean_difference": mean, "sd": sd, "se": se, "df": n - 1,
            "t975": T_975[n - 1], "t95": T_95[n - 1],
            "ci95": [mean - T_975[n - 1] * se, mean + T_975[n - 1] * se], "upper95": mean + T_95[n - 1] * se}


def fraction_text(v):
    return f"{100 * v:.1f}%"


def claim(d, b, tokens, fraction=None, ratio=None):
    """The one claim RESULTS's 65,536-token protocol allows ("The claims each outcome allows"), with
    its outcome's number: d and b are over_seeds() of the full runs' and the budget-matched runs'
    differences (b None without budget-matched runs: outcomes 2-4 only)."""
    at = f"At {tokens:,} tokens per step"
    n = d["n"]
    if b is not None and b["upper95"] <= 0:
        time = (f" and {fraction_text(fraction * ratio)} of its time" if ratio
                else "; its time fraction needs the step ratio, not measured")
        return 1, (f"{at}, K-FAC with PipeFisher reaches the tuned NVLAMB's final masked-LM loss in "
                   f"{fraction_text(fraction)} of its steps{time} (one-sided 95%, {b['n']} test seeds).")
    lo, hi = d["ci95"]
    interval = (f"[{lo:+.4f}, {hi:+.4f}] nats (K-FAC's final masked-LM loss minus NVLAMB's, mean "
                f"{d['mean_difference']:+.4f}, 95% t-interval over {n} test seeds)")
    if d["upper95"] < 0:
        fewer = (f"at most {fraction_text(fraction)} of the steps or {fraction_text(fraction * ratio)} of the time"
                 if fraction and ratio else "fewer steps or less time")
        return 2, f"{at}, K-FAC ends lower at the same number of steps by {interval}; that it needs {fewer} is not shown."
    if lo <= 0:
        return 3, f"{at}, no difference at equal steps is shown: {interval}."
    return 4, f"{at}, NVLAMB ends lower: {interval}."


def probe_claim(d, tokens, other, base):
    """A probe's one sentence (RESULTS, SOAP's probe at 16,384 tokens per step): its interval over
    its few test seeds, and that it is a probe."""
    lo, hi = d["ci95"]
    interval = (f"[{lo:+.4f}, {hi:+.4f}] nats ({other}'s final masked-LM loss minus {base}'s, mean "
                f"{d['mean_difference']:+.4f}, 95% t-interval over {d['n']} test seeds)")
    at = f"At {tokens:,} tokens per step, in a probe of {d['n']} test seeds"
    if lo <= 0 <= hi:
        return 3, f"{at}, no difference between {other} and {base} is shown: {interval}."
    return (2 if hi < 0 else 4), f"{at}, {other if hi < 0 else base} ends lower: {interval}."


def record_of(out, name):
    path = f"{out}/records/{name}.json"
    return json.load(open(path)) if os.path.exists(path) else None


def matched_names(out, kfac_best):
    """Budget-matched K-FAC records by seed: the best K-FAC setting's rate and damping, a fraction
    -fF in the name before -sSEED (its warm-up may be shortened with the schedule)."""
    found = {}
    for f in sorted(os.listdir(f"{out}/records")) if os.path.isdir(f"{out}/records") else []:
        m = RUN_NAME.match(f[:-5]) if f.endswith(".json") else None
        if m and m.group(1) == "kfac" and m.group(5) and m.group(2) == kfac_best["lr"] \
                and (m.group(4) or "") == (kfac_best.get("damping") or ""):
            found.setdefault(int(m.group(6)), []).append((f[:-5], float(m.group(5))))
    for seed, names in found.items():
        if len(names) > 1:
            sys.exit(f"study.py: several budget-matched records of seed {seed}: {names}")
    return {seed: names[0] for seed, names in found.items()}


def seed_pair(out, best, seed, binary=None, other="kfac", base="nvlamb"):
    """One seed's final whole-split losses (record.py's lm_loss, lm_loss_se, nsp_loss) of each best,
    and `other`'s masked-LM loss minus `base`'s with its paired standard error over the held-out
    micro-batches; None when either run has no final loss."""
    pair = {}
    for o in (base, other):
        b = best[o]
        name = run_name(o, b["lr"], b["warmup_steps"], seed, b.get("damping") or None)
        lm, se, shares = final_lm_loss(binary, f"{out}/runs/{name}")
        if lm is None:
            return None
        r = record_of(out, name)
        pair[o] = {"name": name, "lm_loss": lm, "lm_loss_se": se, "shares": shares,
                   "nsp_loss": r.get("nsp_loss") if r else None}
    p = paired_difference(pair[other]["shares"], pair[base]["shares"])
    pair["d"] = pair[other]["lm_loss"] - pair[base]["lm_loss"]
    pair["paired_se"] = p and p[1]
    nsp = [pair[o]["nsp_loss"] for o in (other, base)]
    pair["nsp_d"] = None if None in nsp else nsp[0] - nsp[1]
    return pair


def curve_lines(out, pairs, other="kfac", base="nvlamb"):
    """The validation curves during training, read at the steps both optimizers validated: `base`'s
    minus `other`'s, mean over the seeds of `pairs` (seed_pair()s), and one such validation's standard
    error (a few held-out batches, train.eval_batches: the whole split's standard error scaled by
    the root of its micro-batches over those batches). Secondary: not the primary metric."""
    logs = {s: {o: {x["step"]: x["valid_loss"] for x in record_rows(record_of(out, p[o]["name"]))
                    if x.get("valid_loss") is not None} for o in (base, other)}
            for s, p in pairs.items() if record_of(out, p[base]["name"]) and record_of(out, p[other]["name"])}
    if len(logs) != len(pairs):
        return []
    steps = sorted(set.intersection(*(set(v[base]) & set(v[other]) for v in logs.values())))
    gaps = " ".join(f"{k}: {statistics.mean(v[base][k] - v[other][k] for v in logs.values()):+.3f}" for k in steps)
    if len(steps) < 2:
        return []
    lines = [f"  validation during training, {LABEL[base]} minus {LABEL[other]}, mean over seeds {' '.join(map(str, pairs))} "
             f"(read every {steps[1] - steps[0]} steps, the common cadence): {gaps}"]
    r = record_of(out, next(iter(pairs.values()))[base]["name"])
    batches = arg_value(r["args"], "train.eval_batches")
    if batches and r.get("lm_shares"):
        n = len(r["lm_shares"])
        lines.append(f"  one validation during training ({batches} batches) has a standard error of about "
                     f"{r['lm_loss_se']:.4f} x sqrt({n} / {batches}) = {r['lm_loss_se'] * math.sqrt(n / int(batches)):.3f} "
                     f"(the whole split's over its {n} micro-batches, scaled): a crossing read off these curves is noisy")
    return lines


def analyse(out, best, seeds, tokens, ratio=None, binary=None, other="kfac", base="nvlamb"):
    """The analysis over test seeds (RESULTS, the 65,536-token study's "Analysis"): prints it and
    returns (its lines, summary.json's fields). seeds: the seeds of the best settings that were run;
    TUNING_SEED among them is reported apart and counted in no claim. other, base: the optimizers
    compared (d = other's loss minus base's); the protocol's claims are K-FAC's against NVLAMB's,
    any other pair (SOAP's probe) gets probe_claim()."""
    O, B = LABEL[other], LABEL[base]
    seeds = [int(s) for s in seeds]
    test = [s for s in seeds if s != TUNING_SEED]
    pairs = {s: seed_pair(out, best, s, binary, other, base) for s in sorted(set(seeds) | {TUNING_SEED})}
    missing = [s for s in test if pairs[s] is None]
    if missing:
        sys.exit(f"study.py: no final loss of both bests in test seed(s) {missing}")
    matched = matched_names(out, best["kfac"]) if (other, base) == ("kfac", "nvlamb") else {}
    lines = [f"analysis, {os.path.normpath(out)}: d = {O}'s final whole-split masked-LM loss minus {B}'s, "
             f"same seed; test seeds {' '.join(map(str, test))}; tuning seed {TUNING_SEED} reported apart"]

    def seed_line(s, p, note=""):
        se = "" if p["paired_se"] is None else f" (paired SE {p['paired_se']:.4f})"
        return (f"  seed {s}{note}: {O} {p[other]['lm_loss']:.4f} - {B} {p[base]['lm_loss']:.4f} = "
                f"{p['d']:+.4f}{se}")

    for s in test:
        lines.append(seed_line(s, pairs[s]))
    if pairs[TUNING_SEED]:
        lines.append(seed_line(TUNING_SEED, pairs[TUNING_SEED], " (tuning seed: chose the settings, in no claim)"))
    lines.append("  (the paired SE covers only which held-out micro-batches were drawn, for fixed weights: "
                 "it enters no claim)")

    def stats_line(name, a, which="test seeds"):
        return (f"  {name} over {which} {' '.join(map(str, a['seeds']))}: mean {a['mean_difference']:+.4f}, "
                f"sd {a['sd']:.4f}, SE over seeds {a['se']:.4f}; 95% t-interval [{a['ci95'][0]:+.4f}, "
                f"{a['ci95'][1]:+.4f}] (t {a['t975']:.3f}, {a['df']} df); one-sided 95% upper bound "
                f"{a['upper95']:+.4f} (t {a['t95']:.3f})")

    d = {"seeds": test, **over_seeds([pairs[s]["d"] for s in test])}
    lines.append(stats_line("d", d))
    b, fraction = None, None
    if matched:
        fractions = {f for _, f in matched.values()}
        if len(fractions) != 1:
            sys.exit(f"study.py: budget-matched records of several fractions: {sorted(fractions)}")
        fraction = fractions.pop()
        bm = {}
        for s in test:
            if s not in matched:
                continue
            name = matched[s][0]
            lm, se, shares = final_lm_loss(binary, f"{out}/runs/{name}")
            if lm is not None:
                bm[s] = (name, lm - pairs[s]["nvlamb"]["lm_loss"])
        lines.append(f"  budget-matched K-FAC (f = {fraction:g}), b = its final masked-LM loss minus NVLAMB's full run: "
                     + "; ".join(f"seed {s} {v:+.4f}" for s, (_, v) in bm.items()))
        if sorted(bm) == test:
            b = {"seeds": test, "fraction": fraction, **over_seeds([bm[s][1] for s in test])}
            lines.append(stats_line("b", b))
        else:
            lines.append(f"  b: not every test seed has a budget-matched run ({' '.join(map(str, sorted(bm)))} of "
                         f"{' '.join(map(str, test))}): not analysed")
    outcome, text = (claim(d, b, tokens, fraction, ratio) if (other, base) == ("kfac", "nvlamb")
                     else probe_claim(d, tokens, O, B))
    lines.append(f"  claim (outcome {outcome}): {text}")
    if outcome == 1:
        met = fraction <= GOAL[0] and ratio is not None and fraction * ratio <= GOAL[1]
        lines.append(f"  goal ({fraction_text(GOAL[0])} of the steps, {fraction_text(GOAL[1])} of the time): "
                     + ("met" if met else "not met"))
    nsp = [pairs[s]["nsp_d"] for s in test]
    if None in nsp:
        lines.append("  next-sentence loss: not in every record (records made before record.py kept it)")
    else:
        a = over_seeds(nsp)
        lines.append(f"  next-sentence loss, {O} minus {B} (reported, not claimed on): mean {a['mean_difference']:+.4f}, "
                     f"95% t-interval [{a['ci95'][0]:+.4f}, {a['ci95'][1]:+.4f}]")
    js = {"tuning_seed": TUNING_SEED, "test_seeds": test,
          "analysis": {**d, "outcome": outcome, "claim": text, **({"budget_matched": b} if b else {})}}
    t = pairs[TUNING_SEED]
    if t:
        js["tuning_seed_final_lm_loss"] = {base: t[base]["lm_loss"], other: t[other]["lm_loss"],
                                           "difference": t["d"], "paired_se": t["paired_se"]}
    withtuning = [s for s in seeds if pairs[s]] if TUNING_SEED in seeds else []
    if len(withtuning) > len(test):
        a = {"seeds": withtuning, **over_seeds([pairs[s]["d"] for s in withtuning])}
        lines.append(stats_line("d with the tuning seed (not a claim)", a, "seeds"))
        js["analysis_with_tuning_seed"] = a
    for group in ([test, withtuning] if withtuning else [test]):
        ds = [pairs[s]["d"] for s in group]
        pse = [pairs[s]["paired_se"] for s in group]
        if None not in pse and statistics.mean(pse) > 0:  # 0: the same run twice
            lines.append(f"  seeds {' '.join(map(str, group))}: sd of d over seeds {statistics.stdev(ds):.4f} = "
                         f"{statistics.stdev(ds) / statistics.mean(pse):.1f} x the mean paired SE {statistics.mean(pse):.4f}")
        sd = {o: statistics.stdev(pairs[s][o]["lm_loss"] for s in group) for o in (other, base)}
        lines.append(f"  seeds {' '.join(map(str, group))}: sd of the final masked-LM loss over seeds: {O} {sd[other]:.4f}, "
                     f"{B} {sd[base]:.4f} ({sd[base] / sd[other]:.1f}x {O}'s)")
    lines += curve_lines(out, {s: pairs[s] for s in (withtuning or test)}, other, base)
    per = {o: [pairs[s][o]["lm_loss"] if pairs[s] else None for s in seeds] for o in (base, other)}
    if matched:
        per["kfac_budget_matched"] = [(final_lm_loss(binary, f"{out}/runs/{matched[s][0]}")[0] if s in matched else None)
                                      for s in seeds]
    js.update(final_lm_loss_per_seed=per,
              final_lm_diff_per_seed=[pairs[s]["d"] if pairs[s] else None for s in seeds],
              final_lm_diff_paired_se_per_seed=[pairs[s]["paired_se"] if pairs[s] else None for s in seeds],
              final_nsp_loss_per_seed={o: [pairs[s][o]["nsp_loss"] if pairs[s] else None for s in seeds]
                                       for o in (base, other)})
    print("\n".join(lines))
    return lines, js


def summary(out, steps, seeds, binary, model, tokens, floors, step_times):
    floor, plateau, train_tokens = floors
    st = Study(out, steps, seeds, binary, model)
    per = st.per_seed()
    nv_evals = [final_lm_loss(binary, d) for d in st.runs["nvlamb"]]
    nv_lm = mean_or_none([lm for lm, _, _ in nv_evals])
    # The mean of independent seeds' losses: its standard error from theirs.
    nv_lm_se = None if nv_lm is None else math.sqrt(sum(se * se for _, se, _ in nv_evals)) / len(nv_evals)
    # Each K-FAC seed against NVLAMB's run of the same seed: the validation batches' masks and
    # sentence pairs, and the training batches, are drawn from data.seed, which the seed sets.
    nv = per["nvlamb"]
    targets_train = [x["smoothed"] for x in nv]
    targets_valid = [x["valid"] for x in nv]
    target_train, target_valid = statistics.mean(targets_train), statistics.mean(targets_valid)
    nv_time = statistics.mean(x["time_s"] for x in nv)
    ratio, ratio_source = step_ratio(step_times, tokens)
    rows, cadence = [], set()
    for x, d, tt, tv, nvx in zip(per["kfac"], st.runs["kfac"], targets_train, targets_valid, nv):
        c = st.report([d], [x["seed"]], tt)["runs"][0]["reaches_target"]
        common = validated_steps(x["log"]) & validated_steps(nvx["log"])  # both read at one cadence
        cadence |= {b - a for a, b in zip(sorted(common), sorted(common)[1:])}
        vstep, vtime = first_valid_crossing(x["log"], tv, common)
        vs = None if vstep is None else vstep / steps
        ts = c and c["step"] / steps
        rows.append({"seed": x["seed"], "target_valid": tv, "ts": ts,
                     "tt": c and (ts * ratio if ratio else c["time_s"] / nvx["time_s"]),
                     "vs": vs, "vt": None if vs is None else (vs * ratio if ratio else vtime / nvx["time_s"])})
    write_seeds_csv(out, per)
    lines, seed_fields = analyse(out, st.best, seeds, tokens, ratio, binary)
    js = {"model": model, "tokens_per_step": tokens, "steps": steps,
          "tuning_seed": seed_fields.pop("tuning_seed"), "test_seeds": seed_fields.pop("test_seeds"),
          "seeds": [int(s) for s in seeds],  # the order of every *_per_seed list
          "best": st.best, "step_ratio": ratio,
          "step_ratio_source": ratio_source or "none: time is the runs' own summed step_time_s",
          "target_valid_loss": target_valid, "target_valid_loss_per_seed": targets_valid,
          "unigram_entropy": floor,
          "unigram_cross_entropy": plateau, "epochs": steps * tokens / train_tokens,
          "nvlamb_final_lm_valid_loss": nv_lm, "nvlamb_final_lm_valid_loss_se": nv_lm_se,
          "target_smoothed_training_loss": target_train,
          "crossing_validation_every": sorted(cadence),
          "steps_fraction": mean_or_none([r["vs"] for r in rows]),
          "time_fraction": mean_or_none([r["vt"] for r in rows]),
          "steps_fraction_per_seed": [r["vs"] for r in rows], "time_fraction_per_seed": [r["vt"] for r in rows],
          **seed_fields}
    with written(f"{out}/summary.json") as f:
        json.dump(js, f, indent=1)
    write_summary_md(st, per, rows, (target_train, target_valid, floor, nv_lm, nv_lm_se, plateau), nv_time,
                     (ratio, ratio_source), sorted(cadence), lines, steps * tokens / train_tokens)


def write_seeds_csv(out, per):
    with written(f"{out}/seeds.csv", newline="") as f:
        w = csv.writer(f)
        w.writerow(["optimizer", "seed", "final_loss", "final_smoothed_loss", "final_valid_loss", "time_s"])
        for o in per:
            for x in per[o]:
                w.writerow([o, x["seed"], x["final"], x["smoothed"], x["valid"], x["time_s"]])


def write_summary_md(st, per, rows, targets, nv_time, ratio, cadence, analysis, epochs):
    target_train, target_valid, floor, nv_lm, nv_lm_se, plateau = targets
    ratio, ratio_source = ratio
    lm = ("not measured (the runs kept no weights)" if nv_lm is None else
          f"{nv_lm:.4f} (standard error {nv_lm_se:.4f} over the held-out micro-batches), {floor - nv_lm:.4f} below it")
    best = ", ".join(f"{o} lr {b['lr']}, warm-up {b['warmup_steps']} steps" +
                     (f", damping {b['damping']}" if b.get("damping") else "") for o, b in st.best.items())
    time_note = (f"time = steps x PipeFisher's step time / NVLAMB's, r = {ratio:.3f} ({ratio_source})" if ratio
                 else "time = the runs' summed step_time_s")
    grid_rows = list(csv.DictReader(open(f"{st.out}/grid.csv")))
    metric = ("whole-split masked-LM loss" if grid_metric([{"lm_loss": g.get("lm_loss", "")} for g in grid_rows]) == "lm_loss"
              else "final validation loss")
    lines = [f"# {st.model}: NVLAMB vs K-FAC with PipeFisher, tuned with the same budget", "",
             open(f"{st.out}/machine.txt").read().strip(), "",
             f"{st.steps} steps ({epochs:.2f} epochs of the training split's tokens); best settings by "
             f"{metric} (grid.csv) on tuning seed {TUNING_SEED}: {best}", "",
             "## Final losses over seeds " + " ".join(st.seeds) + f" (seed {TUNING_SEED} is the tuning seed)", "",
             "| optimizer | training loss (smoothed) | validation loss | training time (s) |", "|---|---|---|---|"]
    for o in per:
        lines.append(f"| {o} | {stats([x['smoothed'] for x in per[o]])} | {stats([x['valid'] for x in per[o]])} | "
                     f"{stats([x['time_s'] for x in per[o]])} |")
    lines += ["", "## The analysis over test seeds (the primary metric: the final weights' masked-LM loss "
              "over the whole held-out split)", "", "    " + "\n    ".join(analysis)]
    lines += ["", f"## K-FAC reaching the tuned NVLAMB's final loss of the same seed (mean over seeds: smoothed "
              f"training {target_train:.4f}, validation {target_valid:.4f}; NVLAMB: {st.steps} steps, {nv_time:.1f} s mean)", "",
              f"Time: {time_note}. Validation is read only at the steps both optimizers were validated "
              f"(every {', '.join(map(str, cadence))} steps), on the few batches of train.eval_batches: a crossing read "
              f"off the middle of an undecayed schedule is noisy and is not the primary metric. The unigram plateau "
              f"(the held-out tokens' cross-entropy under the "
              f"training tokens' frequencies: a model that learned only those): {plateau:.4f}; the context-free "
              f"floor (their own unigram entropy, which no such model reaches): {floor:.4f}; NVLAMB's final "
              f"language-model validation loss "
              f"(whole held-out split, no next-sentence prediction; mean over seeds): {lm}.", "",
              "| seed | NVLAMB's final validation | steps (training loss) | time (training loss) | steps (validation) | time (validation) |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        tuning = " (tuning)" if int(r["seed"]) == TUNING_SEED else ""
        lines.append(f"| {r['seed']}{tuning} | {r['target_valid']:.4f} | {pct(r['ts'])} | {pct(r['tt'])} | {pct(r['vs'])} | {pct(r['vt'])} |")
    lines.append("| mean | | " + " | ".join(pct(mean_or_none([r[k] for r in rows])) for k in ("ts", "tt", "vs", "vt")) + " |")
    div = [g for g in grid_rows if g["diverged"] == "True"]
    lines += ["", "Diverged in the grid: " + (", ".join(f"{g['optimizer']} lr {g['lr']} warm-up {g['warmup_steps']}"
                                                         for g in div) or "none")]
    labels = [f"NVLAMB s{s}" for s in st.seeds] + [f"K-FAC s{s}" for s in st.seeds]
    fig = st.report(st.runs["nvlamb"] + st.runs["kfac"], labels, target_train, f"{st.out}/figure7.svg")
    name = os.path.basename  # the summary is read beside the pictures, on any machine
    lines += ["", f"Figure 7: {name(fig['svg'])}" + (f", {name(fig['png'])}" if fig.get("png") else "")]
    with written(f"{st.out}/summary.md") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def paired(out, a, b):
    """Records a and b (names in out/records, or paths of record files from other studies)."""
    ra, rb = (json.load(open(n if n.endswith(".json") else f"{out}/records/{n}.json")) for n in (a, b))
    d = paired_difference(*((r.get("lm_shares"), r.get("batch_positions")) if r.get("lm_shares") else None
                            for r in (ra, rb)))
    if d is None:
        sys.exit("study.py: both records need lm_shares over the same micro-batches (record.py shares)")
    print(f"{a} minus {b}: final LM validation loss {ra['lm_loss']:.4f} - {rb['lm_loss']:.4f} = {d[0]:+.4f}, "
          f"paired standard error {d[1]:.4f} ({abs(d[0]) / d[1]:.1f}x), over {len(ra['lm_shares'])} micro-batches")


RUN_NAME = re.compile(r"^(nvlamb|kfac|soap)-lr(.+?)-w(\d+)(?:-d(.+?))?(?:-f(.+?))?-s(\d+)$")


def run_key(name):
    """run_name's fields of a run's name: optimizer, lr, warm-up, damping (0 when unnamed), the
    budget-matched runs' fraction of the steps (1 when unnamed), seed."""
    o, lr, w, d, f, seed = RUN_NAME.match(name).groups()
    return o, float(lr), int(w), float(d) if d else 0.0, float(f) if f else 1.0, int(seed)


def run_label(name):
    """"NVLAMB, lr 1e-2, warm-up 26, damping 3e-3, seed 1" from a run's name."""
    o, lr, w, d, f, seed = RUN_NAME.match(name).groups()
    return ", ".join([LABEL[o], f"lr {lr}", f"warm-up {w}"] +
                     ([f"damping {d}"] if d else []) + ([f"budget {f}"] if f else []) + [f"seed {seed}"])


def curves(out, steps):
    """One markdown row per record of out/records: its validation losses at `steps` and its final
    language-model loss with its standard error."""
    print("| run | " + " | ".join(str(s) for s in steps) + " | final masked LM (SE) |")
    print("|---|" + "---|" * (len(steps) + 1))
    names = [f[:-5] for f in os.listdir(f"{out}/records") if f.endswith(".json")]
    for f in (n + ".json" for n in sorted(names, key=lambda n: (run_key(n)[0] != "nvlamb", run_key(n)[1:]))):
        r = json.load(open(f"{out}/records/{f}"))
        valid = {x["step"]: x["valid_loss"] for x in record_rows(r) if x.get("valid_loss") is not None}
        cells = [f"{valid[s]:.4f}" if s in valid else "" for s in steps]
        lm = f"{r['lm_loss']:.4f} ({r['lm_loss_se']:.4f})" if r.get("lm_loss") is not None else ""
        print(f"| {run_label(f[:-5])} | " + " | ".join(cells) + f" | {lm} |")


def direct(out, direct_out, nvlamb, kfac):
    """The direct check of the product steps fraction x step ratio: NVLAMB and PipeFisher of one
    seed pair trained on the real pipeline (records in direct_out), K-FAC's summed step time to
    NVLAMB's final validation loss (read at the steps both validated) over NVLAMB's whole summed
    step time, beside the one-process study's (out) fraction of the same seed times its step ratio."""
    nv, kf = (record_rows(json.load(open(f"{direct_out}/records/{n}.json"))) for n in (nvlamb, kfac))
    target = [r["valid_loss"] for r in nv if r.get("valid_loss") is not None][-1]
    nv_time = sum(r["step_time_s"] for r in nv)
    step, t = first_valid_crossing(kf, target, validated_steps(nv) & validated_steps(kf))
    print(f"direct, {direct_out}: NVLAMB {nvlamb} final validation {target:.4f} in {len(nv)} steps, {nv_time:.1f} s "
          f"of steps ({nv_time / len(nv):.3f} s a step); K-FAC {kfac} {len(kf)} steps, "
          f"{sum(r['step_time_s'] for r in kf) / len(kf):.3f} s a step; step ratio "
          f"{sum(r['step_time_s'] for r in kf) / len(kf) / (nv_time / len(nv)):.3f}")
    if step is None:
        return print(f"direct: {kfac} does not reach {target:.4f}")
    direct_steps, direct_time = step / len(nv), t / nv_time
    print(f"direct: K-FAC reaches it at step {step}: {100 * direct_steps:.1f}% of the steps, {t:.1f} s = "
          f"{100 * direct_time:.1f}% of the time")
    s = json.load(open(f"{out}/summary.json")) if os.path.exists(f"{out}/summary.json") else None
    seed = run_key(kfac)[-1]
    if s and s.get("step_ratio") and seed in s["seeds"]:
        i = s["seeds"].index(seed)
        vs, ratio = s["steps_fraction_per_seed"][i], s["step_ratio"]
        if vs is not None:
            print(f"product, {out} seed {seed}: {100 * vs:.1f}% of the steps x {ratio:.3f} = {100 * vs * ratio:.1f}% "
                  f"of the time; direct / product = {direct_time / (vs * ratio):.3f}")


def analysis(out, seeds, step_times="", other="kfac", base="nvlamb"):
    """study.py analysis OUT SEEDS [STEP_TIMES [OTHER [BASE]]]: the analysis over test seeds from the
    records alone (SOAP's probe: OTHER soap, BASE nvlamb or kfac)."""
    best = json.load(open(f"{out}/best.json"))
    r = record_of(out, run_name("nvlamb", best["nvlamb"]["lr"], best["nvlamb"]["warmup_steps"], int(seeds.split()[0])))
    tokens = math.prod(int(arg_value(r["args"], k)) for k in
                       ("parallel.micro_batches", "parallel.micro_batch_size", "model.seq_len"))
    ratio, source = step_ratio(step_times, tokens)
    if ratio:
        print(f"step ratio r = {ratio:.3f}: {source}")
    analyse(out, best, seeds.split(), tokens, ratio, other=other, base=base)


def main():
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "paired":
        return paired(*a)
    if cmd == "direct":
        return direct(*a)
    if cmd == "analysis":
        return analysis(*a)
    if cmd == "curves":
        return curves(a[0], [int(x) for x in a[1].split()])
    if cmd == "grid":
        grid(a[0], int(a[1]), a[2].split(), a[3].split(), a[4].split(), a[5], *([a[6].split()] if len(a) > 6 else []))
    elif cmd == "summary":
        floors = (unigram_entropy(a[6])[0], unigram_cross_entropy(a[6], a[7], int(a[8])), len(read_ids(a[7])))
        summary(a[0], int(a[1]), a[2].split(), a[3], a[4], int(a[5]), floors, a[9] if len(a) > 9 else "")
    else:
        sys.exit(f"study.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
