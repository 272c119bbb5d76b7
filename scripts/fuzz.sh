#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, CMake option PF_FUZZ)
# in build-fuzz/ and runs each for a bounded time from a small seed corpus made of the
# repository's own files. A finding (crash, sanitizer report, an exception other than
# UsageError, a timeout) stops the script with the target's output; the input is kept as
# build-fuzz/findings/<target>/crash-* for a regression test.
#
#   scripts/fuzz.sh                 # every target, 20 s each
#   FUZZ_SECONDS=60 scripts/fuzz.sh fuzz_safetensors fuzz_config
#   FUZZ_JOBS=2 (parallel build jobs, default 2)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"
seconds="${FUZZ_SECONDS:-20}"
jobs="${FUZZ_JOBS:-2}"

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPF_FUZZ=ON \
  -DPF_BUILD_TESTS=OFF -DPF_BUILD_BENCH=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for f in "$root"/fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi
cmake --build "$build" -j"$jobs" --target "${targets[@]}"

# Seeds: valid examples of each format (the fuzzer mutates from there).
seeds="$build/seeds"
rm -rf "$seeds"
mkdir -p "$seeds"/{fuzz_config,fuzz_config_overrides,fuzz_plan_flags,fuzz_safetensors,fuzz_manifest,fuzz_profile_csv,fuzz_profile_json,fuzz_schedule,fuzz_tokenizer_files,fuzz_tokenize_text,fuzz_token_file,fuzz_run_log,fuzz_tokenize_input,fuzz_refresh_record}
cp "$root"/configs/*.toml "$seeds/fuzz_config/"
# TOML, a NUL, then one `key=value` override per line (pipefisher train --set).
for f in "$root"/configs/*.toml; do
  { cat "$f"; printf '\0model.layers=2\noptim.lr=3e-3\nparallel.partition=[1,1]\nkfac.enabled=true\n'; } \
    > "$seeds/fuzz_config_overrides/$(basename "$f")"
done
printf '[model]\nhidden = 64\n\0optim.lr=inf\ntrain.threads=65536\nmodel.vocab=2000000000\nmodel.init_std=1e39\n' \
  > "$seeds/fuzz_config_overrides/limits"
# One argument per line (pipefisher plan ...).
printf -- '--schedule\n1f1b\n--stages\n4\n--micro-batches\n8\n--tf\n1\n--tb\n2\n--svg\nx\n' > "$seeds/fuzz_plan_flags/1f1b"
printf -- '--schedule\ninterleaved\n--stages\n2\n--micro-batches\n4\n--virtual-stages\n2\n--tcomm\n0.5\n--json\n' \
  > "$seeds/fuzz_plan_flags/interleaved"
printf -- '--kfac\n--schedule\nchimera\n--stages\n4\n--micro-batches\n4\n--tf\n1e308\n--tcurv\n3\n--tinv\n9\n--tprec\n1\n--data-parallel\n2\n--svg\nx\n' \
  > "$seeds/fuzz_plan_flags/kfac"
printf -- '--schedule\ngpipe\n--stages\n100000\n--micro-batches\n4\n--tf\n0\n--tb\n0\n--trace\nx\n' > "$seeds/fuzz_plan_flags/big"
printf -- '--sweep\n--schedule\n1f1b\n--sweep-stages\n2,4\n--tf\ninf\n--csv\nx\n' > "$seeds/fuzz_plan_flags/sweep"
python3 - "$seeds" <<'PY'
import json, struct, sys, os
d = sys.argv[1]
def safetensors(tensors, meta=None):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if meta: header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data
open(f"{d}/fuzz_safetensors/a", "wb").write(safetensors(
    [("w", "F32", [2, 3], struct.pack("<6f", *range(6))), ("b", "F16", [2], b"\x00\x3c\x00\x40"),
     ("c", "BF16", [1], b"\x80\x3f"), ("i", "I64", [1], b"\x01" + b"\x00" * 7)], {"format": "pt"}))
open(f"{d}/fuzz_manifest/a", "w").write(json.dumps({"format": "pipefisher-checkpoint", "version": 1, "step": 100,
    "info": {"train.seed": "42"}, "files": [{"name": "weights-stage-0.safetensors", "bytes": 4180856,
    "sha256": "5b729998b76253d28036013f358147084a1fb6e20468bebe3df28caeaf2ce1b6"}]}, indent=2))
open(f"{d}/fuzz_profile_csv/a", "w").write(
    "bs,time_f,time_b,time_kron,time_inv,time_prec,mem_param,mem_act,mem_peak_err,mem_save_err,mem_kron\n"
    "8,1.5,3.1,2.2,9.8,0.7,85,120,40,30,168\n32,5.5,11.1,8.2,9.8,0.7,85,480,160,120,168\n")
open(f"{d}/fuzz_profile_json/a", "w").write(json.dumps({"format": "pipefisher-profile", "version": 1,
    "micro_batch_size": 16, "stages": [{"forward": 10.4, "backward": 16.3, "curvature": 27.5, "inversion": 80.9,
    "precondition": 8.9, "layers": 3, "mem_param": 85, "activation_bytes": 1572864},
    {"forward": 11, "backward": 17, "input_grad": 8, "weight_grad": 9}],
    "p2p": {"latency": 0.02, "bandwidth": 1.0e7}, "allreduce": {"alpha": 0.05, "beta": 1e-8}}))
open(f"{d}/fuzz_schedule/text", "w").write(
    "\x00# pipefisher schedule name=mine devices=2 stages=2 pipelines=1 micro_batches=2\n# map p0: 0 1\n"
    "0: 0F0 0F1 0B0 0B1\n1: 1F0 1B0 1F1 1B1\n")
open(f"{d}/fuzz_schedule/csv", "w").write(
    "\x01# pipefisher schedule name=gpipe devices=2 stages=2 pipelines=1 micro_batches=2\n"
    "device,t0,t1,t2,t3,t4,t5\n0,0F0,0F1,,0B0,,0B1\n1,,1F0,1B0,1F1,1B1\n")
PY
{ printf '\x01'; head -n 3000 "$root/data/vocab/bert-base-uncased.txt" 2>/dev/null || printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n##b\n'; } \
  > "$seeds/fuzz_tokenizer_files/bert"
{ printf '\x00{"!": 0, "a": 1, "b": 2, "ab": 3, "\\u0120a": 4, "\\u0120": 5}'; printf '\x00'
  printf '#version: 0.2\na b\n\xc4\xa0 a\n'; } > "$seeds/fuzz_tokenizer_files/gpt2"
head -c 2000 "$root/data/sample/moby-dick-1-20.txt" > "$seeds/fuzz_tokenize_text/a"
head -c 6000 "$root/data/sample/moby-dick-1-20.txt" > "$seeds/fuzz_tokenize_input/a"
printf 'One document.\n\nAnother one, after a blank line.\n\n\n  Third\r\n\r\nfourth \xe2\x80\x94 caf\xc3\xa9\n' \
  > "$seeds/fuzz_tokenize_input/docs"
# Run logs as train/run_log.cpp writes them: a skipped step's loss is null, evaluations add
# valid_loss, K-FAC runs more fields, a run cut off mid-write leaves half a line.
printf '%s\n' '{"step":1,"time":"2026-01-01T00:00:00.000Z","elapsed_s":0.06,"loss":10.35,"lr":0.00025,"grad_norm":6.67,"tokens":64,"step_time_s":0.06,"tokens_per_s":1024.0}' \
  '{"step":2,"time":"2026-01-01T00:00:00.100Z","elapsed_s":0.09,"loss":null,"lr":0.0005,"grad_norm":null,"tokens":64,"step_time_s":0.02,"tokens_per_s":2793.9}' \
  '{"step":3,"time":"2026-01-01T00:00:00.200Z","elapsed_s":0.2,"loss":10.48,"lr":0.00075,"grad_norm":6.56,"tokens":64,"step_time_s":0.04,"tokens_per_s":1362.8,"valid_loss":10.49}' \
  > "$seeds/fuzz_run_log/skipped"
for s in $(seq 1 40); do
  printf '{"step":%d,"loss":%s,"step_time_s":0.5,"kfac_curvature":true,"kfac_inversion":false,"kfac_damping_raised":null,"kfac_time_s":0.1%s}\n' \
    "$s" "$(awk -v s="$s" 'BEGIN { printf "%.4f", 10 - s / 10 }')" "$([[ $((s % 10)) == 0 ]] && echo ',"valid_loss":9.1' || true)"
done > "$seeds/fuzz_run_log/kfac"
{ cat "$seeds/fuzz_run_log/skipped"; printf '{"step":4,"loss":10.2,"step_ti'; } > "$seeds/fuzz_run_log/cut"
# Refresh records of real PipeFisher runs (bench/convergence/*/kfac_refresh.json: 1F1B, 2 ranks).
for f in "$root"/bench/convergence/*/kfac_refresh.json; do
  [[ -f $f ]] && cp "$f" "$seeds/fuzz_refresh_record/$(basename "$(dirname "$f")").json"
done
{ printf '\x3a\x77'; head -c 2000 "$root/data/sample/moby-dick-1-20.bert.bin"; } > "$seeds/fuzz_token_file/a"

status=0
for t in "${targets[@]}"; do
  if [[ ($t == fuzz_tokenize_text || $t == fuzz_tokenize_input) && ! -f "$root/data/vocab/gpt2-encoder.json" ]]; then
    echo "== $t: skipped (needs data/vocab: scripts/fetch-data.sh)"
    continue
  fi
  corpus="$build/corpus/$t"
  findings="$build/findings/$t"
  mkdir -p "$corpus" "$findings"
  echo "== $t: ${seconds} s"
  # -rss_limit_mb: a loader must refuse an oversized declaration before allocating it. A refresh
  # record of a real run is about 90 kB.
  max_len=65536
  [[ $t == fuzz_refresh_record ]] && max_len=131072
  if ! ASAN_OPTIONS=detect_leaks=1 "$build/fuzz/$t" "$corpus" "$seeds/$t" -max_total_time="$seconds" \
      -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" -artifact_prefix="$findings/" -print_final_stats=1 \
      >"$findings/log.txt" 2>&1; then
    echo "!! $t found a problem: $findings (log.txt and the crash input)"
    tail -n 40 "$findings/log.txt"
    status=1
  else
    grep -E "^stat::(number_of_executed_units|new_units_added)" "$findings/log.txt" | tr '\n' ' '
    echo
  fi
done
rm -rf /tmp/pf_fuzz_*
exit $status
