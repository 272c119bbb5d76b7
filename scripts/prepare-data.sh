#!/usr/bin/env bash
# Fetches the corpus and vocabularies (scripts/fetch-data.sh), then tokenizes
# data/corpus/{train,valid}.txt with both vocabularies into data/corpus/{train,valid}.{bert,gpt2}.bin,
# and for BERT the document index data/corpus/{train,valid}.bert.docs (next-sentence prediction).
# A token file is remade only when it is missing or older than its text; `pipefisher tokenize`
# writes it under a temporary name and renames it, so an interrupted run leaves no half file.
# Idempotent: takes well under a second when everything is there.
# Usage: scripts/prepare-data.sh PIPEFISHER_BINARY
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 PIPEFISHER_BINARY" >&2; exit 2; }
BIN="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[[ -x $BIN ]] || { echo "prepare-data: $1 is not an executable (build pipefisher first)" >&2; exit 2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

bash "$ROOT/scripts/fetch-data.sh"
cd "$ROOT"
for split in train valid; do
  txt="data/corpus/$split.txt"
  for vocab in bert gpt2; do
    bin="data/corpus/$split.$vocab.bin"
    docs=()  # BERT's next-sentence pairs (data.nsp) read the document index beside the token file
    [[ $vocab == bert ]] && docs=(--docs "data/corpus/$split.$vocab.docs")
    if [[ ! -f $bin || $bin -ot $txt || ( $vocab == bert && ! -f data/corpus/$split.$vocab.docs ) ]]; then
      "$BIN" tokenize --vocab "$vocab" --vocab-dir data/vocab --in "$txt" --out "$bin" "${docs[@]}"
    fi
  done
done
echo "prepare-data: token files in data/corpus ($(ls data/corpus/*.bin | wc -l) present)" >&2
