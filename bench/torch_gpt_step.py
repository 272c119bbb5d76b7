#!/usr/bin/python3
"""The same GPT training step as bench_breakdown's default, in PyTorch eager (Debian's
python3-torch, on the system's OpenBLAS): gpt2-mini's shape (4 layers, hidden 256, 4 heads, ffn
1024, vocabulary 50,257, tied embeddings, tanh GELU, no dropout), 4 micro-batches of 8 x 128
tokens, gradients accumulated, then AdamW (PyTorch has no NVLAMB; both are one pass of the same
memory traffic per parameter, bench/RESULTS.md "Optimizer step"). Random tokens: the products'
time does not depend on them.

    /usr/bin/python3 bench/torch_gpt_step.py [THREADS] [ROUNDS] [STEPS] [WARMUP]

Prints "torch: <median ms per step> ms, <tokens/s> tokens/s" (median over rounds of the mean of
each round's steps) and the torch version and threads.
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

L, C, H, FF, V, T, MBS, MB = 4, 256, 4, 1024, 50257, 128, 8, 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(C, eps=1e-5), torch.nn.LayerNorm(C, eps=1e-5)
        self.c_attn, self.c_proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
        self.c_fc, self.mlp_proj = torch.nn.Linear(C, FF), torch.nn.Linear(FF, C)
        self.register_buffer("causal", torch.ones(T, T, dtype=torch.bool).tril())

    def forward(self, x):
        B = x.shape[0]
        q, k, v = self.c_attn(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-2, -1)) * (C // H) ** -0.5
        a = torch.softmax(s.masked_fill(~self.causal, float("-inf")), dim=-1) @ v
        x = x + self.c_proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, C), torch.nn.Embedding(T, C)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
        self.ln_f = torch.nn.LayerNorm(C, eps=1e-5)

    def forward(self, tokens, labels):
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied decoder
        return F.cross_entropy(logits.view(-1, V), labels.view(-1), reduction="sum")


def step(model, opt, batches):
    opt.zero_grad(set_to_none=False)
    for tokens, labels in batches:
        model(tokens, labels).backward()
    opt.step()


def main():
    defaults = [2, 5, 3, 2]
    args = [int(a) for a in sys.argv[1:5]]
    threads, rounds, steps, warmup = args + defaults[len(args):]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [(torch.randint(0, V, (MBS, T)), torch.randint(0, V, (MBS, T))) for _ in range(MB)]
    for _ in range(warmup):
        step(model, opt, batches)
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            step(model, opt, batches)
        means.append((time.perf_counter() - t0) / steps)
    ms = 1e3 * statistics.median(means)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {rounds} rounds of {steps} steps after {warmup}")
    print(f"torch: {ms:.2f} ms, {MB * MBS * T / ms * 1e3:.1f} tokens/s")


if __name__ == "__main__":
    main()
