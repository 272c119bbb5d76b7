#!/usr/bin/env python3
"""The loss of the best context-free predictor on a token file: its unigram entropy in nats.

    bench/convergence/unigram.py TOKENS.bin [--nsp]

Token files are raw little-endian uint16 ids (src/data/token_file.hpp). BERT's masking draws the
masked positions uniformly among a sequence's text tokens, so the tokens a masked LM must predict
have the file's own unigram distribution, and a model that ignores the context can do no better
than its entropy H = -sum p log p. With --nsp the loss also carries next-sentence prediction,
whose labels are balanced: chance adds ln 2. Prints one line: `unigram entropy X nats (...)`.
"""
import math
import sys
from array import array
from collections import Counter


def unigram_entropy(path):
    ids = array("H")
    with open(path, "rb") as f:
        ids.frombytes(f.read())
    if sys.byteorder != "little":
        ids.byteswap()
    counts = Counter(ids)
    n = len(ids)
    return -sum(c / n * math.log(c / n) for c in counts.values()), n, len(counts)


def main():
    args = sys.argv[1:]
    nsp = "--nsp" in args
    paths = [a for a in args if a != "--nsp"]
    if len(paths) != 1:
        sys.exit("usage: unigram.py TOKENS.bin [--nsp]")
    h, n, distinct = unigram_entropy(paths[0])
    extra = f"; with NSP at chance (+ ln 2): {h + math.log(2):.4f}" if nsp else ""
    print(f"unigram entropy {h:.4f} nats ({n} tokens, {distinct} distinct ids, {paths[0]}){extra}")


if __name__ == "__main__":
    main()
