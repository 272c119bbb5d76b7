#!/usr/bin/env python3
"""A finished study run's small record, the part of it that the repository keeps (tune.sh calls this).

    record.py save RUN_DIR RECORD.json BIN     after a run that exited 0
    record.py restore RECORD.json RUN_DIR      a kept run on a machine that has only its record
    record.py shares RUN_DIR RECORD.json BIN   adds the per-batch losses to a record saved without them

A run directory (weights, checkpoints, the whole log) is too large to commit; its record is what
study.py and `pipefisher report` read from it: the arguments, the exit status, one row a step
(step, training loss to 8 significant digits, step_time_s to 0.1 ms, validation loss where
measured) and the language-model loss of the final weights over the whole held-out split with its
standard error over the micro-batches (the number study.py compares with the unigram entropy;
the next-sentence loss beside it, `nsp_loss`, zero without next-sentence prediction;
`pipefisher eval`, computed once here while the weights exist), and each micro-batch's share of
that loss (`eval --per-batch`), so that study.py can pair two runs' losses over the same batches. Restoring writes status, args, log.jsonl and lm_loss into RUN_DIR, so a study that
spans several machines or sessions resumes from its records: tune.sh keeps a restored run as done.
"""
import json
import os
import subprocess
import sys

COLUMNS = ["step", "loss", "step_time_s", "valid_loss"]


def short(x, digits):
    return None if x is None else float(f"{x:.{digits}g}")


def final_eval(binary, run_dir, per_batch=True, sets=()):
    """`pipefisher eval` of the final weights over the whole held-out split: its JSON object (lm_loss,
    lm_loss_se, and lm_shares and batch_positions when the binary has --per-batch)."""
    cmd = [binary, "eval", "--config", f"{run_dir}/config.toml", "--init", f"{run_dir}/model.safetensors",
           "--batches", "0", "--json"] + [x for kv in sets for x in ("--set", kv)]
    help_text = subprocess.run([binary, "eval", "--help"], capture_output=True, text=True).stdout
    if per_batch and "--per-batch" in help_text:
        cmd.append("--per-batch")
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def write_record(rec, record):
    tmp = record + ".tmp"
    with open(tmp, "w") as f:
        # One row a line: a record reads (and diffs) like the table it is.
        f.write(json.dumps({k: v for k, v in rec.items() if k != "rows"})[:-1] + ', "rows": [\n')
        f.write(",\n".join(json.dumps(r) for r in rec["rows"]) + "\n]}\n")
    os.replace(tmp, record)


def save(run_dir, record, binary):
    rows = []
    for line in open(f"{run_dir}/log.jsonl"):
        r = json.loads(line)
        rows.append([r["step"], short(r["loss"], 8), round(r["step_time_s"], 4), short(r.get("valid_loss"), 8)])
    j = final_eval(binary, run_dir)
    rec = {"format": "pipefisher-study-record", "args": open(f"{run_dir}/args").read().strip(),
           "status": int(open(f"{run_dir}/status").read()), "lm_loss": j["lm_loss"], "lm_loss_se": j["lm_loss_se"],
           "nsp_loss": j["loss"] - j["lm_loss"], "columns": COLUMNS}
    if "lm_shares" in j:
        rec.update(lm_shares=j["lm_shares"], batch_positions=j["batch_positions"])
    rec["rows"] = rows
    write_record(rec, record)


def data_files_from_here(run_dir):
    """--set data.*_file as absolute paths: a run written before config.toml stored them absolute
    named them relative to the directory tune.sh ran in (this one), not to the file's directory."""
    sets = []
    for line in open(f"{run_dir}/config.toml"):
        key, _, value = line.partition("=")
        if key.strip() in ("train_file", "valid_file"):
            path = value.strip().strip("'\"")
            if path and not os.path.isabs(path):
                sets.append(f"data.{key.strip()}={os.path.abspath(path)}")
    return sets


def shares(run_dir, record, binary):
    rec = json.load(open(record))
    j = final_eval(binary, run_dir, sets=data_files_from_here(run_dir))
    if "lm_shares" not in j:
        sys.exit(f"record.py: {binary} has no eval --per-batch")
    if j["lm_loss"] != rec["lm_loss"]:
        sys.exit(f"record.py: {run_dir} scores {j['lm_loss']!r} now, its record {rec['lm_loss']!r}: "
                 "not the recorded weights, or another BLAS kernel family")
    rows = rec.pop("rows")
    rec.update(lm_shares=j["lm_shares"], batch_positions=j["batch_positions"], rows=rows)
    write_record(rec, record)


def restore(record, run_dir):
    rec = json.load(open(record))
    os.makedirs(run_dir, exist_ok=True)
    with open(f"{run_dir}/log.jsonl", "w") as f:
        for row in rec["rows"]:
            r = dict(zip(rec["columns"], row))
            if r["valid_loss"] is None:
                del r["valid_loss"]
            f.write(json.dumps(r) + "\n")
    open(f"{run_dir}/lm_loss", "w").write(f"{rec['lm_loss']!r} {rec['lm_loss_se']!r}\n")
    if "lm_shares" in rec:
        with open(f"{run_dir}/lm_shares.json", "w") as f:
            json.dump({"lm_shares": rec["lm_shares"], "batch_positions": rec["batch_positions"]}, f)
    open(f"{run_dir}/args", "w").write(rec["args"] + "\n")
    open(f"{run_dir}/status", "w").write(f"{rec['status']}\n")


def main():
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "save":
        save(*a)
    elif cmd == "restore":
        restore(*a)
    elif cmd == "shares":
        shares(*a)
    else:
        sys.exit(f"record.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
