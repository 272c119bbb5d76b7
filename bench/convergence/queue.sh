#!/usr/bin/env bash
# bench/convergence/queue.sh: one core's queue of study runs, each a call of tune.sh.
#
#   bench/convergence/queue.sh QUEUE-FILE BUILD-DIR OUT-DIR [REPO]
#
# QUEUE-FILE holds one job a line: the environment of one tune.sh call (`NAME=value ...`, values
# without spaces or quoted as the shell would; blank lines and lines starting with # are skipped).
# The queue takes the first job not yet listed in QUEUE-FILE.done, runs it, and lists it there when
# tune.sh exits 0; it reads the file again before each job, so jobs can be appended while it runs.
# A job that fails is listed in QUEUE-FILE.failed and skipped. After each job, the records the run
# left in OUT-DIR/records are committed to REPO (the repository they belong to, one commit a job),
# so a finished run is kept whatever happens to the session. Start one queue per core; tune.sh
# resumes a run from its last checkpoint, so a killed queue started again goes on where it stopped.
set -euo pipefail
[[ $# -ge 3 ]] || { echo "usage: queue.sh QUEUE-FILE BUILD-DIR OUT-DIR [REPO]" >&2; exit 2; }
queue=$1 build=$2 out=$3 repo=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
[[ -f $queue ]] || { echo "queue.sh: no queue file $queue" >&2; exit 2; }
touch "$queue.done" "$queue.failed"

next_job() {
  local line
  while IFS= read -r line; do
    [[ -z ${line// } || $line == \#* ]] && continue
    grep -qxF -- "$line" "$queue.done" "$queue.failed" || { printf '%s\n' "$line"; return 0; }
  done < "$queue"
  return 1
}

commit_records() {  # job line
  [[ -n $repo ]] || return 0
  local rel new
  rel=$(realpath --relative-to="$repo" "$out/records")
  new=$(git -C "$repo" status --porcelain --untracked-files=all -- "$rel" | awk '{print $2}')
  [[ -n $new ]] || return 0
  git -C "$repo" add -- $new
  # Only the records: whatever else is staged in REPO stays out of this commit.
  for attempt in 1 2 3 4 5; do
    git -C "$repo" commit -q -m "$(basename "$out"): record of $(basename "${new%% *}" .json)" -- $new && return 0
    sleep 5  # another git command held the index
  done
  echo "queue.sh: could not commit $new" >&2
}

while job=$(next_job); do
  echo "== $(date -u +%FT%TZ) $job"
  eval "env_args=($job)"
  if env "${env_args[@]}" bash "$here/tune.sh" "$build" "$out"; then
    printf '%s\n' "$job" >> "$queue.done"
  else
    printf '%s\n' "$job" >> "$queue.failed"
  fi
  commit_records "$job"
done
echo "== $(date -u +%FT%TZ) queue $queue: nothing left"
