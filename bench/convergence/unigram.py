#!/usr/bin/env python3
"""The loss of context-free predictors on a token file, in nats.

    bench/convergence/unigram.py TOKENS.bin [--nsp] [--train TRAIN.bin --vocab V]

Token files are raw little-endian uint16 ids (src/data/token_file.hpp). BERT's masking draws the
masked positions uniformly among a sequence's text tokens, so the tokens a masked LM must predict
have the file's own unigram distribution, and a model that ignores the context can do no better
than its entropy H = -sum p log p. With --nsp the loss also carries next-sentence prediction,
whose labels are balanced: chance adds ln 2. Prints one line: `unigram entropy X nats (...)`.

That entropy is a floor no context-free model reaches: it knows the held-out file's own
frequencies. A model that learned word frequencies from training (the plateau a masked LM sits on
before it uses the context) scores their cross-entropy under the training file's frequencies,
add-half smoothed over the vocabulary of V ids (no held-out token gets probability 0): with
--train, a second line `unigram cross-entropy Y nats (...)`.
"""
import math
import sys
from array import array
from collections import Counter


def read_ids(path):
    ids = array("H")
    with open(path, "rb") as f:
        ids.frombytes(f.read())
    if sys.byteorder != "little":
        ids.byteswap()
    return ids


def unigram_entropy(path):
    ids = read_ids(path)
    counts = Counter(ids)
    n = len(ids)
    return -sum(c / n * math.log(c / n) for c in counts.values()), n, len(counts)


def unigram_cross_entropy(path, train_path, vocab, alpha=0.5):
    held_out, train = read_ids(path), Counter(read_ids(train_path))
    total = sum(train.values()) + alpha * vocab
    return -sum(math.log((train.get(t, 0) + alpha) / total) for t in held_out) / len(held_out)


def main():
    args = sys.argv[1:]
    nsp = "--nsp" in args
    args = [a for a in args if a != "--nsp"]
    train = vocab = None
    for flag in ("--train", "--vocab"):
        if flag in args:
            i = args.index(flag)
            if i + 1 >= len(args):
                sys.exit(f"unigram.py: {flag} needs a value")
            if flag == "--train":
                train = args[i + 1]
            else:
                vocab = int(args[i + 1])
            del args[i:i + 2]
    if len(args) != 1 or (train is None) != (vocab is None):
        sys.exit("usage: unigram.py TOKENS.bin [--nsp] [--train TRAIN.bin --vocab V]")
    h, n, distinct = unigram_entropy(args[0])
    extra = f"; with NSP at chance (+ ln 2): {h + math.log(2):.4f}" if nsp else ""
    print(f"unigram entropy {h:.4f} nats ({n} tokens, {distinct} distinct ids, {args[0]}){extra}")
    if train:
        ce = unigram_cross_entropy(args[0], train, vocab)
        print(f"unigram cross-entropy {ce:.4f} nats (under {train}'s frequencies, add-half over {vocab} ids)")


if __name__ == "__main__":
    main()
