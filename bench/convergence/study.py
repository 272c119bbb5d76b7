#!/usr/bin/env python3
"""The tables of bench/convergence/tune.sh (it calls this; see its header for the study).

    study.py grid OUT STEPS "LRS" "RATIOS" "DAMPINGS" DEFAULT_DAMPING
        grid.csv and best.json (each optimizer's best setting by final validation loss)
    study.py summary OUT STEPS "SEEDS" BIN MODEL TOKENS_PER_STEP VALID.bin TRAIN.bin VOCAB [STEP_TIMES.csv]
        seeds.csv, summary.md, summary.json and figure7.svg from the seed runs of the best settings;
        beside the targets, the language model's context-free floor (unigram.py: the held-out
        tokens' unigram entropy) and the plateau of a model that learned only the training tokens'
        frequencies (their cross-entropy) against NVLAMB's final language-model validation loss (without
        next-sentence prediction: `pipefisher eval` of each seed's saved weights over the whole
        held-out split), which shows whether NVLAMB left the plateau

    study.py direct OUT DIRECT_OUT NVLAMB_NAME KFAC_NAME
        one seed pair timed on the real pipeline (DIRECT_OUT/records: tune.sh with RANKS > 1): K-FAC's
        step time to NVLAMB's final validation loss over NVLAMB's, beside OUT's steps fraction x step ratio

    study.py curves OUT "STEPS"
        a markdown table of every record's validation loss at STEPS and its final language-model loss

    study.py paired OUT NAME_A NAME_B
        A's final language-model validation loss minus B's over the same held-out micro-batches,
        with the paired standard error, from their records (OUT/records/NAME.json, record.py)

A run's directory is OUT/runs/NAME with NAME as tune.sh's run_name: OPT-lrLR-wW[-dD]-sSEED, the
damping named only in a K-FAC grid over several. STEP_TIMES is bench/pipefisher.sh's CSV: when it
has this study's tokens per step, K-FAC's time is its steps times PipeFisher's best step time over
NVLAMB's (the quiet benchmark); otherwise the runs' own summed step_time_s (the machine's load
during the runs shows in it).
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
    return {"run": name, "exit": status, "steps": len(rows), "final_loss": final, "final_valid_loss": v,
            "diverged": diverged}


def grid(out, steps, lrs, ratios, dampings, default_damping):
    several = dampings != [default_damping]
    table, best = [], {}
    for opt in ("nvlamb", "kfac"):
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
                    if not r["diverged"] and (opt not in best or r["final_valid_loss"] < best[opt]["final_valid_loss"]):
                        best[opt] = r
    with written(f"{out}/grid.csv", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0].keys()))
        w.writeheader()
        w.writerows(table)
    if set(best) != {"nvlamb", "kfac"}:
        sys.exit("tune.sh: every setting of " + " and ".join(o for o in ("nvlamb", "kfac") if o not in best) + " diverged")
    with written(f"{out}/best.json") as f:
        json.dump({o: {"lr": b["lr"], "warmup_steps": b["warmup_steps"], "damping": b["damping"] if several else ""}
                   for o, b in best.items()}, f)
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


def step_time_ratio(path, tokens):
    """PipeFisher's best step time over NVLAMB's from bench/pipefisher.sh's CSV, or None."""
    if not path or not os.path.exists(path):
        return None
    ms = {r["run"]: float(r["best_ms"]) for r in csv.DictReader(open(path)) if int(r["tokens_per_step"]) == tokens}
    return ms["pipefisher"] / ms["nvlamb"] if {"pipefisher", "nvlamb"} <= set(ms) else None


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


def first_valid_crossing(log, target):
    t = 0.0
    for r in log:
        t += r.get("step_time_s", 0.0)
        if r.get("valid_loss") is not None and r["valid_loss"] <= target:
            return r["step"], t
    return None, None


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
    if not os.path.exists(f"{run_dir}/model.safetensors"):
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


def summary(out, steps, seeds, binary, model, tokens, floors, step_times):
    floor, plateau, train_tokens = floors
    st = Study(out, steps, seeds, binary, model)
    per = st.per_seed()
    nv_evals = [final_lm_loss(binary, d) for d in st.runs["nvlamb"]]
    nv_lm = mean_or_none([lm for lm, _, _ in nv_evals])
    # The mean of independent seeds' losses: its standard error from theirs.
    nv_lm_se = None if nv_lm is None else math.sqrt(sum(se * se for _, se, _ in nv_evals)) / len(nv_evals)
    # Each seed's K-FAC final LM loss minus NVLAMB's, paired over the same held-out micro-batches.
    kf_evals = [final_lm_loss(binary, d) for d in st.runs["kfac"]]
    diffs = [paired_difference(k[2], n[2]) for k, n in zip(kf_evals, nv_evals)]
    # Each K-FAC seed against NVLAMB's run of the same seed: the validation batches' masks and
    # sentence pairs, and the training batches, are drawn from data.seed, which the seed sets.
    nv = per["nvlamb"]
    targets_train = [x["smoothed"] for x in nv]
    targets_valid = [x["valid"] for x in nv]
    target_train, target_valid = statistics.mean(targets_train), statistics.mean(targets_valid)
    nv_time = statistics.mean(x["time_s"] for x in nv)
    ratio = step_time_ratio(step_times, tokens)
    rows = []
    for x, d, tt, tv, nvx in zip(per["kfac"], st.runs["kfac"], targets_train, targets_valid, nv):
        c = st.report([d], [x["seed"]], tt)["runs"][0]["reaches_target"]
        vstep, vtime = first_valid_crossing(x["log"], tv)
        vs = None if vstep is None else vstep / steps
        ts = c and c["step"] / steps
        rows.append({"seed": x["seed"], "target_valid": tv, "ts": ts,
                     "tt": c and (ts * ratio if ratio else c["time_s"] / nvx["time_s"]),
                     "vs": vs, "vt": None if vs is None else (vs * ratio if ratio else vtime / nvx["time_s"])})
    write_seeds_csv(out, per)
    js = {"model": model, "tokens_per_step": tokens, "steps": steps, "seeds": [int(s) for s in seeds],
          "best": st.best, "target_valid_loss": target_valid, "target_valid_loss_per_seed": targets_valid,
          "unigram_entropy": floor,
          "unigram_cross_entropy": plateau, "epochs": steps * tokens / train_tokens,
          "nvlamb_final_lm_valid_loss": nv_lm, "nvlamb_final_lm_valid_loss_se": nv_lm_se,
          "target_smoothed_training_loss": target_train,
          "steps_fraction": mean_or_none([r["vs"] for r in rows]),
          "time_fraction": mean_or_none([r["vt"] for r in rows]),
          "steps_fraction_per_seed": [r["vs"] for r in rows], "time_fraction_per_seed": [r["vt"] for r in rows],
          "time_from": "bench/pipefisher.sh best step times" if ratio else "the runs' summed step_time_s",
          "step_time_ratio": ratio,
          "final_lm_diff_per_seed": [d and d[0] for d in diffs],
          "final_lm_diff_se_per_seed": [d and d[1] for d in diffs]}
    with written(f"{out}/summary.json") as f:
        json.dump(js, f, indent=1)
    write_summary_md(st, per, rows, (target_train, target_valid, floor, nv_lm, nv_lm_se, plateau), nv_time, ratio,
                     diffs, steps * tokens / train_tokens)


def write_seeds_csv(out, per):
    with written(f"{out}/seeds.csv", newline="") as f:
        w = csv.writer(f)
        w.writerow(["optimizer", "seed", "final_loss", "final_smoothed_loss", "final_valid_loss", "time_s"])
        for o in per:
            for x in per[o]:
                w.writerow([o, x["seed"], x["final"], x["smoothed"], x["valid"], x["time_s"]])


def write_summary_md(st, per, rows, targets, nv_time, ratio, diffs, epochs):
    target_train, target_valid, floor, nv_lm, nv_lm_se, plateau = targets
    lm = ("not measured (the runs kept no weights)" if nv_lm is None else
          f"{nv_lm:.4f} (standard error {nv_lm_se:.4f} over the held-out micro-batches), {floor - nv_lm:.4f} below it")
    best = ", ".join(f"{o} lr {b['lr']}, warm-up {b['warmup_steps']} steps" +
                     (f", damping {b['damping']}" if b.get("damping") else "") for o, b in st.best.items())
    time_note = (f"time = steps x PipeFisher's step time / NVLAMB's ({ratio:.3f}, bench/pipefisher.sh)" if ratio
                 else "time = the runs' summed step_time_s")
    lines = [f"# {st.model}: NVLAMB vs K-FAC with PipeFisher, tuned with the same budget", "",
             open(f"{st.out}/machine.txt").read().strip(), "",
             f"{st.steps} steps ({epochs:.2f} epochs of the training split's tokens); best settings by final "
             f"validation loss (grid.csv): {best}", "",
             "## Final losses over seeds " + " ".join(st.seeds), "",
             "| optimizer | training loss (smoothed) | validation loss | training time (s) |", "|---|---|---|---|"]
    for o in per:
        lines.append(f"| {o} | {stats([x['smoothed'] for x in per[o]])} | {stats([x['valid'] for x in per[o]])} | "
                     f"{stats([x['time_s'] for x in per[o]])} |")
    lines += ["", f"## K-FAC reaching the tuned NVLAMB's final loss of the same seed (mean over seeds: smoothed "
              f"training {target_train:.4f}, validation {target_valid:.4f}; NVLAMB: {st.steps} steps, {nv_time:.1f} s mean)", "",
              f"Time: {time_note}. The unigram plateau (the held-out tokens' cross-entropy under the "
              f"training tokens' frequencies: a model that learned only those): {plateau:.4f}; the context-free "
              f"floor (their own unigram entropy, which no such model reaches): {floor:.4f}; NVLAMB's final "
              f"language-model validation loss "
              f"(whole held-out split, no next-sentence prediction; mean over seeds): {lm}.", "",
              "| seed | NVLAMB's final validation | steps (training loss) | time (training loss) | steps (validation) | time (validation) |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['target_valid']:.4f} | {pct(r['ts'])} | {pct(r['tt'])} | {pct(r['vs'])} | {pct(r['vt'])} |")
    lines.append("| mean | | " + " | ".join(pct(mean_or_none([r[k] for r in rows])) for k in ("ts", "tt", "vs", "vt")) + " |")
    paired = [f"seed {s}: {d[0]:+.4f} (paired standard error {d[1]:.4f}, {abs(d[0]) / d[1]:.0f}x)"
              for s, d in zip(st.seeds, diffs) if d]
    lines += ["", "K-FAC's final language-model validation loss minus NVLAMB's, over the same held-out "
              "micro-batches (`pipefisher eval --baseline`): " + ("; ".join(paired) or "not measured")]
    grid_rows = list(csv.DictReader(open(f"{st.out}/grid.csv")))
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


def record_rows(r):
    """A record's (record.py) rows as dicts: step, loss, step_time_s, valid_loss."""
    return [dict(zip(r["columns"], row)) for row in r["rows"]]


RUN_NAME = re.compile(r"^(nvlamb|kfac)-lr(.+?)-w(\d+)(?:-d(.+?))?-s(\d+)$")


def run_key(name):
    """run_name's fields of a run's name: optimizer, lr, warm-up, damping (0 when unnamed), seed."""
    o, lr, w, d, seed = RUN_NAME.match(name).groups()
    return o, float(lr), int(w), float(d) if d else 0.0, int(seed)


def run_label(name):
    """"NVLAMB, lr 1e-2, warm-up 26, damping 3e-3, seed 1" from a run's name."""
    o, lr, w, d, seed = RUN_NAME.match(name).groups()
    return ", ".join([{"nvlamb": "NVLAMB", "kfac": "K-FAC"}[o], f"lr {lr}", f"warm-up {w}"] +
                     ([f"damping {d}"] if d else []) + [f"seed {seed}"])


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
    NVLAMB's final validation loss over NVLAMB's whole summed step time, beside the one-process
    study's (out) fraction of the same seed times the benchmarked step ratio."""
    nv, kf = (record_rows(json.load(open(f"{direct_out}/records/{n}.json"))) for n in (nvlamb, kfac))
    target = [r["valid_loss"] for r in nv if r.get("valid_loss") is not None][-1]
    nv_time = sum(r["step_time_s"] for r in nv)
    step, t = first_valid_crossing(kf, target)
    print(f"direct, {direct_out}: NVLAMB {nvlamb} final validation {target:.4f} in {len(nv)} steps, {nv_time:.1f} s "
          f"of steps ({nv_time / len(nv):.3f} s a step); K-FAC {kfac} {len(kf)} steps, "
          f"{sum(r['step_time_s'] for r in kf) / len(kf):.3f} s a step")
    if step is None:
        return print(f"direct: {kfac} does not reach {target:.4f}")
    direct_steps, direct_time = step / len(nv), t / nv_time
    print(f"direct: K-FAC reaches it at step {step}: {100 * direct_steps:.1f}% of the steps, {t:.1f} s = "
          f"{100 * direct_time:.1f}% of the time")
    s = json.load(open(f"{out}/summary.json")) if os.path.exists(f"{out}/summary.json") else None
    seed = run_key(kfac)[4]
    if s and s.get("step_time_ratio") and seed in s["seeds"]:
        i = s["seeds"].index(seed)
        vs, ratio = s["steps_fraction_per_seed"][i], s["step_time_ratio"]
        if vs is not None:
            print(f"product, {out} seed {seed}: {100 * vs:.1f}% of the steps x {ratio:.3f} = {100 * vs * ratio:.1f}% "
                  f"of the time; direct / product = {direct_time / (vs * ratio):.3f}")


def main():
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "paired":
        return paired(*a)
    if cmd == "direct":
        return direct(*a)
    if cmd == "curves":
        return curves(a[0], [int(x) for x in a[1].split()])
    if cmd == "grid":
        grid(a[0], int(a[1]), a[2].split(), a[3].split(), a[4].split(), a[5])
    elif cmd == "summary":
        floors = (unigram_entropy(a[6])[0], unigram_cross_entropy(a[6], a[7], int(a[8])), len(read_ids(a[7])))
        summary(a[0], int(a[1]), a[2].split(), a[3], a[4], int(a[5]), floors, a[9] if len(a) > 9 else "")
    else:
        sys.exit(f"study.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
