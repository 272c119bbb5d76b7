#!/usr/bin/env python3
"""An independent reader of a saved run: opens RUN_DIR/config.json and RUN_DIR/model.safetensors
the way Hugging Face's transformers does (no code of ours), checks that the tensors are exactly
the ones BertForPreTraining / GPT2LMHeadModel / LlamaForCausalLM expect for that config, with their
shapes, and for the causal LMs computes the next-token loss of the first validation windows with
PyTorch in float64, written from each model's definition: GPT-2 (Conv1D weights [in, out], pre-LN
blocks, gelu_new, tied LM head); Llama (transformers' modeling_llama: RMSNorm, rotary positions
with rotate_half, repeat_kv for grouped-query attention, SiLU-gated MLP, lm_head or the tied
embedding).

  hf_check.py RUN_DIR [--valid FILE.bin --seq T --sequences N]   prints one JSON line
"""
import argparse
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b : base + end]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).float()
    return out, meta


def bert_expected(c):
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    e = {
        "bert.embeddings.word_embeddings.weight": [V, H],
        "bert.embeddings.position_embeddings.weight": [c["max_position_embeddings"], H],
        "bert.embeddings.token_type_embeddings.weight": [c["type_vocab_size"], H],
        "bert.embeddings.LayerNorm.weight": [H],
        "bert.embeddings.LayerNorm.bias": [H],
        "bert.pooler.dense.weight": [H, H],
        "bert.pooler.dense.bias": [H],
        "cls.predictions.bias": [V],
        "cls.predictions.transform.dense.weight": [H, H],
        "cls.predictions.transform.dense.bias": [H],
        "cls.predictions.transform.LayerNorm.weight": [H],
        "cls.predictions.transform.LayerNorm.bias": [H],
        "cls.seq_relationship.weight": [2, H],
        "cls.seq_relationship.bias": [2],
    }
    for l in range(c["num_hidden_layers"]):
        p = f"bert.encoder.layer.{l}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            e[p + m + ".weight"], e[p + m + ".bias"] = [H, H], [H]
        e[p + "intermediate.dense.weight"], e[p + "intermediate.dense.bias"] = [I, H], [I]
        e[p + "output.dense.weight"], e[p + "output.dense.bias"] = [H, I], [H]
        for m in ("attention.output.LayerNorm", "output.LayerNorm"):
            e[p + m + ".weight"], e[p + m + ".bias"] = [H], [H]
    # cls.predictions.decoder.weight is tied to the word embeddings: transformers does not need it.
    return e, {"cls.predictions.decoder.weight"}


def gpt2_expected(c):
    H, V = c["n_embd"], c["vocab_size"]
    I = c.get("n_inner") or 4 * H
    e = {"transformer.wte.weight": [V, H], "transformer.wpe.weight": [c["n_positions"], H],
         "transformer.ln_f.weight": [H], "transformer.ln_f.bias": [H]}
    for l in range(c["n_layer"]):
        p = f"transformer.h.{l}."
        e[p + "ln_1.weight"] = e[p + "ln_1.bias"] = e[p + "ln_2.weight"] = e[p + "ln_2.bias"] = [H]
        e[p + "attn.c_attn.weight"], e[p + "attn.c_attn.bias"] = [H, 3 * H], [3 * H]
        e[p + "attn.c_proj.weight"], e[p + "attn.c_proj.bias"] = [H, H], [H]
        e[p + "mlp.c_fc.weight"], e[p + "mlp.c_fc.bias"] = [H, I], [I]
        e[p + "mlp.c_proj.weight"], e[p + "mlp.c_proj.bias"] = [I, H], [H]
    return e, {"lm_head.weight"}  # tied to wte


def gpt2_logits(c, w, ids):
    """GPT2LMHeadModel's forward for one sequence of ids (a 1-D LongTensor): logits [T, V]."""
    T, H, nh = ids.shape[0], c["n_embd"], c["n_head"]
    eps = c["layer_norm_epsilon"]
    act = {"gelu_new": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu}[c["activation_function"]]
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(c["n_layer"]):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (H,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: x @ W[in, out]
        q, k, v = (t.reshape(T, nh, H // nh).transpose(0, 1) for t in qkv.split(H, dim=1))
        s = (q @ k.transpose(1, 2)) / math.sqrt(H // nh)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
        a = a.transpose(0, 1).reshape(T, H)
        x = x + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (H,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        m = act(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (H,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return x @ w["transformer.wte.weight"].T


def llama_expected(c):
    H, I, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    D = H // c["num_attention_heads"]
    KV = c.get("num_key_value_heads", c["num_attention_heads"]) * D
    e = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if not c.get("tie_word_embeddings", False):
        e["lm_head.weight"] = [V, H]
    for l in range(L):
        p = f"model.layers.{l}."
        e[p + "input_layernorm.weight"] = e[p + "post_attention_layernorm.weight"] = [H]
        e[p + "self_attn.q_proj.weight"], e[p + "self_attn.o_proj.weight"] = [H, H], [H, H]
        e[p + "self_attn.k_proj.weight"] = e[p + "self_attn.v_proj.weight"] = [KV, H]
        e[p + "mlp.gate_proj.weight"] = e[p + "mlp.up_proj.weight"] = [I, H]
        e[p + "mlp.down_proj.weight"] = [H, I]
    return e, {"lm_head.weight"}  # tied: transformers takes the embedding


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama_logits(c, w, ids):
    """LlamaForCausalLM's forward for one sequence of ids: logits [T, V]."""
    T, H, nh = ids.shape[0], c["hidden_size"], c["num_attention_heads"]
    nkv, D, eps = c.get("num_key_value_heads", nh), H // nh, c["rms_norm_eps"]
    inv_freq = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = w["model.embed_tokens.weight"][ids]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nh, D).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, D).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, D).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, dim=0), v.repeat_interleave(nh // nkv, dim=0)
        s = (q @ k.transpose(1, 2)) / math.sqrt(D)
        a = (torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v).transpose(0, 1).reshape(T, H)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        m = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + m @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--valid")
    ap.add_argument("--seq", type=int)
    ap.add_argument("--sequences", type=int, default=0)
    a = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    with open(a.run_dir + "/config.json") as f:
        c = json.load(f)
    w, meta = read_safetensors(a.run_dir + "/model.safetensors")
    w = {k: v.double() for k, v in w.items()}
    arch = c["architectures"][0]
    expected, optional = {"BertForPreTraining": bert_expected, "GPT2LMHeadModel": gpt2_expected,
                          "LlamaForCausalLM": llama_expected}[arch](c)
    report = {"architecture": arch, "model_type": c["model_type"], "format": meta.get("format"),
              "unexpected": sorted(k for k in w if k not in expected and k not in optional),
              "missing": sorted(k for k in expected if k not in w),
              "wrong_shape": sorted(k for k in w if k in expected and list(w[k].shape) != expected[k])}
    causal = {"GPT2LMHeadModel": gpt2_logits, "LlamaForCausalLM": llama_logits}
    if a.valid and arch in causal:
        # The validation windows of the trainer: sequence i reads tokens [i*T, i*T + T + 1).
        with open(a.valid, "rb") as f:
            raw = f.read()
        toks = torch.tensor(struct.unpack(f"<{len(raw) // 2}H", raw))
        T, total, n = a.seq, 0.0, 0
        for i in range(a.sequences):
            win = toks[torch.arange(i * T, i * T + T + 1) % toks.shape[0]]
            logits = causal[arch](c, w, win[:T])
            total += F.cross_entropy(logits, win[1:], reduction="sum").item()
            n += T
        report["loss"] = total / n
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
