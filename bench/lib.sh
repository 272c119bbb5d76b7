# Shared by the bench/*.sh scripts (source it): the machine line and a training run's speed.
#   pf_machine BIN [THREADS]     prints "machine: CPU, BLAS kernel, threads, OMP_WAIT_POLICY, load"
#   pf_tokens_per_s LOG.jsonl    median tokens/s over steps 3.. of a run's log (steps 1-2 warm up)

pf_machine() { "$1" machine --threads "${2:-0}"; }

pf_tokens_per_s() {
  python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{statistics.median(r['tokens_per_s'] for r in rows if r['step'] >= 3):.0f}")
PY
}
