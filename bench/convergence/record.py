#!/usr/bin/env python3
"""A finished study run's small record, the part of it that the repository keeps (tune.sh calls this).

    record.py save RUN_DIR RECORD.json BIN     after a run that exited 0
    record.py restore RECORD.json RUN_DIR      a kept run on a machine that has only its record

A run directory (weights, checkpoints, the whole log) is too large to commit; its record is what
study.py and `pipefisher report` read from it: the arguments, the exit status, one row a step
(step, training loss to 8 significant digits, step_time_s to 0.1 ms, validation loss where
measured) and the language-model loss of the final weights over the whole held-out split with its
standard error over the micro-batches (the number study.py compares with the unigram entropy;
`pipefisher eval`, computed once here while the weights exist). Restoring writes status, args, log.jsonl and lm_loss into RUN_DIR, so a study that
spans several machines or sessions resumes from its records: tune.sh keeps a restored run as done.
"""
import json
import os
import subprocess
import sys

COLUMNS = ["step", "loss", "step_time_s", "valid_loss"]


def short(x, digits):
    return None if x is None else float(f"{x:.{digits}g}")


def final_eval(binary, run_dir):
    """`pipefisher eval` of the final weights over the whole held-out split: lm_loss, lm_loss_se."""
    cmd = [binary, "eval", "--config", f"{run_dir}/config.toml", "--init", f"{run_dir}/model.safetensors",
           "--batches", "0", "--json"]
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return j["lm_loss"], j["lm_loss_se"]


def save(run_dir, record, binary):
    rows = []
    for line in open(f"{run_dir}/log.jsonl"):
        r = json.loads(line)
        rows.append([r["step"], short(r["loss"], 8), round(r["step_time_s"], 4), short(r.get("valid_loss"), 8)])
    lm, se = final_eval(binary, run_dir)
    rec = {"format": "pipefisher-study-record", "args": open(f"{run_dir}/args").read().strip(),
           "status": int(open(f"{run_dir}/status").read()), "lm_loss": lm, "lm_loss_se": se,
           "columns": COLUMNS, "rows": rows}
    tmp = record + ".tmp"
    with open(tmp, "w") as f:
        # One row a line: a record reads (and diffs) like the table it is.
        f.write(json.dumps({k: v for k, v in rec.items() if k != "rows"})[:-1] + ', "rows": [\n')
        f.write(",\n".join(json.dumps(r) for r in rows) + "\n]}\n")
    os.replace(tmp, record)


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
    open(f"{run_dir}/args", "w").write(rec["args"] + "\n")
    open(f"{run_dir}/status", "w").write(f"{rec['status']}\n")


def main():
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "save":
        save(*a)
    elif cmd == "restore":
        restore(*a)
    else:
        sys.exit(f"record.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
