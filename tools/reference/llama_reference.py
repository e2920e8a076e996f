#!/usr/bin/env python3
"""Plain-PyTorch reference of torchtitan's Llama 3 model, for loom.

Two uses: `golden` writes logits, loss and gradients that loom's C++ model must
match; `bench` is the "PyTorch eager" training baseline. `self-test` checks the
reference itself. See README.md next to this file.
"""
import time

_T0 = time.perf_counter()  # before importing torch, so bench can report startup cost

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import warnings

# torch warns at import when numpy is absent; nothing here needs numpy.
warnings.filterwarnings("ignore", message=".*Failed to initialize NumPy.*")
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402  (next to this file; speaks both serialize_file APIs)

IGNORE_INDEX = -100


class RefError(Exception):
    """A problem with the inputs; reported as one clear line, exit status 1."""


# ----------------------------------------------------------------------------- args
@dataclasses.dataclass
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int
    max_seq_len: int
    n_kv_heads: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = False

    @property
    def kv_heads(self):
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    @property
    def ffn_hidden(self):
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


def parse_model_args(raw):
    """Validate a JSON object and report every problem at once."""
    if not isinstance(raw, dict):
        raise RefError("model args must be a JSON object")
    fields = {f.name: f for f in dataclasses.fields(ModelArgs)}
    errors = [f"unknown key '{k}'" for k in raw if k not in fields]
    for name, f in fields.items():
        if name not in raw:
            if f.default is dataclasses.MISSING:
                errors.append(f"missing required key '{name}'")
            continue
        v, ok = raw[name], True
        if name in ("n_kv_heads", "ffn_dim_multiplier") and v is None:
            continue
        if name == "use_scaled_rope":
            ok = isinstance(v, bool)
        elif name in ("ffn_dim_multiplier", "norm_eps", "rope_theta"):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        else:
            ok = isinstance(v, int) and not isinstance(v, bool) and v > 0
        if not ok:
            errors.append(f"bad value for '{name}': {v!r}")
    if not errors:
        a = ModelArgs(**raw)
        if a.dim % a.n_heads:
            errors.append(f"dim {a.dim} not divisible by n_heads {a.n_heads}")
        elif a.head_dim % 2:
            errors.append(f"head_dim {a.head_dim} must be even for RoPE")
        if a.n_heads % a.kv_heads:
            errors.append(f"n_heads {a.n_heads} not divisible by n_kv_heads {a.kv_heads}")
    if errors:
        raise RefError("invalid model args: " + "; ".join(errors))
    return a


# loom's llama3 flavors (src/models/llama/args.cpp) in this file's model-args format, for
# `bench --flavor` (tools/bench_train.py, tools/gpu_check.sh).
LOOM_FLAVORS = {
    "debugmodel": dict(dim=256, n_layers=6, n_heads=16, vocab_size=2048, multiple_of=256),
    "100M": dict(dim=768, n_layers=12, n_heads=12, vocab_size=8192, multiple_of=256),
    "8B_4layers": dict(dim=4096, n_layers=4, n_heads=32, n_kv_heads=8, vocab_size=128256,
                       multiple_of=1024, ffn_dim_multiplier=1.3),
}


def flavor_args(flavor, seq_len):
    if flavor not in LOOM_FLAVORS:
        raise RefError(f"unknown flavor '{flavor}' (known: {', '.join(LOOM_FLAVORS)})")
    return parse_model_args(dict(LOOM_FLAVORS[flavor], max_seq_len=seq_len, use_scaled_rope=True))


def load_model_args(path):
    try:
        with open(path) as f:
            return parse_model_args(json.load(f))
    except (OSError, json.JSONDecodeError) as e:
        raise RefError(f"cannot read model args {path}: {e}")


# ----------------------------------------------------------------------------- safetensors io
def save_tensors(path, tensors, metadata=None):
    try:
        safetensors_io.save_tensors(path, tensors, metadata)
    except Exception as e:
        raise RefError(f"cannot write safetensors file {path}: {e}")


def load_tensors(path):
    try:
        return safetensors_io.load_tensors(path)
    except Exception as e:  # safetensors raises several types; all mean "bad file"
        raise RefError(f"cannot read safetensors file {path}: {e}")


# ----------------------------------------------------------------------------- model
def rope_frequencies(head_dim, theta, scaled):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    return llama31_scale(freqs) if scaled else freqs


def llama31_scale(freqs, factor=8.0, low_factor=1.0, high_factor=4.0, orig_ctx=8192):
    # Llama 3.1: long wavelengths slowed by `factor`, short kept, the band between blended.
    wavelen = 2 * math.pi / freqs
    low_wl, high_wl = orig_ctx / low_factor, orig_ctx / high_factor
    base = torch.where(wavelen > low_wl, freqs / factor, freqs)
    smooth = (orig_ctx / wavelen - low_factor) / (high_factor - low_factor)
    blended = (1 - smooth) * base / factor + smooth * base
    return torch.where((wavelen >= high_wl) & (wavelen <= low_wl), blended, base)


def rope_table(args):
    freqs = rope_frequencies(args.head_dim, args.rope_theta, args.use_scaled_rope)
    angles = torch.outer(torch.arange(args.max_seq_len).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)  # complex64 [max_seq_len, head_dim/2]


def apply_rope(x, freqs_cis):
    """x: [bs, seq, heads, head_dim]; adjacent pairs (2i, 2i+1) form one complex number."""
    seq = x.shape[1]
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rot = freqs_cis[:seq].view(1, seq, 1, xc.shape[-1])
    return torch.view_as_real(xc * rot).flatten(3).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Always normalise in float32; F.rms_norm is the fused kernel nn.RMSNorm (torchtitan) uses.
        y = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return y.type_as(x)


class Attention(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = a.n_heads, a.kv_heads, a.head_dim
        self.wq = nn.Linear(a.dim, a.n_heads * a.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.kv_heads * a.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.kv_heads * a.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * a.head_dim, a.dim, bias=False)

    def forward(self, x, freqs_cis):
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, self.n_heads, self.hd)
        k = self.wk(x).view(bs, seq, self.n_kv, self.hd)
        v = self.wv(x).view(bs, seq, self.n_kv, self.hd)
        q, k = apply_rope(q, freqs_cis), apply_rope(k, freqs_cis)
        rep = self.n_heads // self.n_kv  # kv head j serves q heads j*rep .. j*rep+rep-1
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.ffn_hidden, bias=False)
        self.w2 = nn.Linear(a.ffn_hidden, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn_hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.attention, self.feed_forward = Attention(a), FeedForward(a)
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)
        # Not persistent: the state dict holds exactly the parameters loom checkpoints.
        self.register_buffer("freqs_cis", rope_table(a), persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h)).float()


def init_random(model, std=0.02):
    for name, p in model.named_parameters():
        with torch.no_grad():
            p.fill_(1.0) if "norm" in name else p.normal_(0.0, std)


def loss_fn(logits, labels):
    """Mean cross entropy over tokens whose label != -100 (sum / count)."""
    flat = labels.reshape(-1)
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat,
                            ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (flat != IGNORE_INDEX).sum()


# ----------------------------------------------------------------------------- golden
def load_weights_strict(model, weights):
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    errors = [f"missing '{k}' {list(s)}" for k, s in expected.items() if k not in weights]
    errors += [f"unexpected '{k}'" for k in weights if k not in expected]
    for k, t in weights.items():
        if k in expected and tuple(t.shape) != expected[k]:
            errors.append(f"'{k}' has shape {list(t.shape)}, expected {list(expected[k])}")
        elif k in expected and t.dtype != torch.float32:
            errors.append(f"'{k}' has dtype {t.dtype}, expected float32")
    if errors:
        raise RefError("weights do not match the model: " + "; ".join(errors))
    model.load_state_dict(weights, strict=True)


def check_batch(batch, a):
    errors = [f"unexpected key '{k}'" for k in batch if k not in ("inputs", "labels")]
    errors += [f"missing '{k}'" for k in ("inputs", "labels") if k not in batch]
    if errors:
        raise RefError("bad batch: " + "; ".join(errors))
    x, y = batch["inputs"], batch["labels"]
    if x.dtype != torch.int64 or y.dtype != torch.int64:
        errors.append(f"inputs/labels must be int64, got {x.dtype}/{y.dtype}")
    if x.dim() != 2 or x.shape != y.shape or x.numel() == 0:
        errors.append(f"inputs {list(x.shape)} and labels {list(y.shape)} must be equal, non-empty [bs, seq]")
    elif x.shape[1] > a.max_seq_len:
        errors.append(f"seq {x.shape[1]} exceeds max_seq_len {a.max_seq_len}")
    if not errors:
        if x.min() < 0 or x.max() >= a.vocab_size:
            errors.append(f"input ids outside [0, {a.vocab_size})")
        valid = y != IGNORE_INDEX
        if not valid.any():
            errors.append("every label is -100; the loss would be undefined")
        elif y[valid].min() < 0 or y[valid].max() >= a.vocab_size:
            errors.append(f"labels outside [0, {a.vocab_size}) other than -100")
    if errors:
        raise RefError("bad batch: " + "; ".join(errors))
    return x, y


def golden(args_path, weights_path, batch_path, out_path, threads=1):
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(threads)  # one thread by default: reproducible reductions
    torch.use_deterministic_algorithms(True)
    a = load_model_args(args_path)
    model = Transformer(a)
    load_weights_strict(model, load_tensors(weights_path))
    inputs, labels = check_batch(load_tensors(batch_path), a)
    logits = model(inputs)
    loss = loss_fn(logits, labels)
    loss.backward()
    out = {"logits": logits.detach(), "loss": loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        if p.grad is None:
            raise RefError(f"no gradient for '{name}'")
        out["grad." + name] = p.grad
    save_tensors(out_path, out, {"torch_version": torch.__version__, "producer": "llama_reference.py"})
    return out


# ----------------------------------------------------------------------------- bench
def bench(ns):
    torch.set_num_threads(ns.threads)
    a = load_model_args(ns.model_args) if ns.model_args else flavor_args(ns.flavor, ns.seq_len)
    if ns.seq_len > a.max_seq_len:
        raise RefError(f"--seq-len {ns.seq_len} exceeds max_seq_len {a.max_seq_len}")
    if ns.steps < 1 or ns.warmup < 0:
        raise RefError("--steps must be >= 1 and --warmup >= 0")
    if ns.device == "cuda" and not torch.cuda.is_available():
        raise RefError("--device cuda: this PyTorch sees no CUDA device")
    device = torch.device(ns.device)
    torch.manual_seed(0)
    model = Transformer(a)
    init_random(model)
    model.to(device)
    # float32 parameters, bfloat16 compute under autocast (loom's mixed precision on one GPU);
    # fused AdamW on CUDA: the strongest eager baseline.
    opt = torch.optim.AdamW(model.parameters(), lr=ns.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=ns.device == "cuda")
    forward = torch.compile(model) if ns.compile else model
    loss_of = torch.compile(loss_fn) if ns.compile else loss_fn
    # All batches made up front so the timed loop measures only training.
    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, a.vocab_size, (ns.warmup + ns.steps, ns.batch_size, ns.seq_len + 1),
                         generator=g).to(device)

    def step(i):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(ns.device, dtype=torch.bfloat16, enabled=ns.bf16):
            loss = loss_of(forward(data[i, :, :-1]), data[i, :, 1:])
        loss.backward()
        with torch.profiler.record_function("loom::optimizer"):  # tools/step_breakdown.py
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            opt.step()
        return loss.item()

    first_step = None
    for i in range(ns.warmup):
        step(i)
        first_step = first_step or time.perf_counter() - _T0
    profiler = None
    if ns.trace:  # the timed steps under torch.profiler, one ProfilerStep#N scope per step
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                          record_shapes=True)
        profiler.__enter__()
    t0 = time.perf_counter()
    for i in range(ns.warmup, ns.warmup + ns.steps):
        with torch.profiler.record_function(f"ProfilerStep#{i + 1}"):
            last_loss = step(i)
        first_step = first_step or time.perf_counter() - _T0
    elapsed = time.perf_counter() - t0
    if profiler is not None:
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(ns.trace)
    result = {
        "tokens_per_s": ns.batch_size * ns.seq_len * ns.steps / elapsed,
        "step_time_s": elapsed / ns.steps,
        "process_start_to_first_step_s": first_step,
        "threads": ns.threads, "params": sum(p.numel() for p in model.parameters()),
        "torch_version": torch.__version__, "batch_size": ns.batch_size,
        "seq_len": ns.seq_len, "steps": ns.steps, "warmup": ns.warmup, "final_loss": last_loss,
        "device": ns.device, "bf16": ns.bf16, "compile": ns.compile,
        "peak_gib": (torch.cuda.max_memory_allocated() / 2**30) if ns.device == "cuda" else None,
    }
    print(json.dumps(result))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


# ----------------------------------------------------------------------------- self-test
def self_test():
    def check(cond, what):
        if not cond:
            raise RefError(f"self-test failed: {what}")
        print(f"  ok  {what}")

    torch.manual_seed(0)
    cfg = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, multiple_of=32,
               max_seq_len=32)
    a = parse_model_args(cfg)
    check(a.ffn_hidden == 192, "ffn hidden of the tiny model is 192")
    big = parse_model_args(dict(dim=4096, n_layers=1, n_heads=32, vocab_size=8, max_seq_len=8,
                                multiple_of=1024, ffn_dim_multiplier=1.3))
    check(big.ffn_hidden == 14336, "ffn hidden of Llama 3 8B is 14336")

    with tempfile.TemporaryDirectory() as d:
        paths = {k: os.path.join(d, k) for k in ("args.json", "w.st", "b.st", "out.st", "bad.st")}
        with open(paths["args.json"], "w") as f:
            json.dump(cfg, f)
        ref = Transformer(a)
        init_random(ref)
        weights = {k: v.clone() for k, v in ref.state_dict().items()}
        save_tensors(paths["w.st"], weights)
        inputs = torch.randint(0, a.vocab_size, (2, 16))
        labels = torch.randint(0, a.vocab_size, (2, 16))
        labels[0, :3] = IGNORE_INDEX
        save_tensors(paths["b.st"], {"inputs": inputs, "labels": labels})
        golden(paths["args.json"], paths["w.st"], paths["b.st"], paths["out.st"])
        out = load_tensors(paths["out.st"])

        loss = out["loss"]
        check(loss.shape == (1,) and loss.dtype == torch.float32, "loss is float32 [1]")
        check(torch.isfinite(loss).all() and abs(loss.item() - math.log(97)) < 0.15,
              f"loss {loss.item():.4f} is close to ln(97) = {math.log(97):.4f}")
        check(out["logits"].shape == (2, 16, 97), "logits are [bs, seq, vocab]")
        ce = F.cross_entropy(out["logits"].reshape(-1, 97), labels.reshape(-1))  # mean, -100 ignored
        check(torch.allclose(ce, loss[0], atol=1e-6), "loss is the mean over non-ignored tokens")
        grads = {k[5:]: v for k, v in out.items() if k.startswith("grad.")}
        check(set(grads) == set(weights), f"a gradient for each of the {len(weights)} parameters")
        check(all(grads[k].shape == weights[k].shape and torch.isfinite(grads[k]).all()
                  and grads[k].abs().sum() > 0 for k in grads), "gradients finite and non-zero")

        bad = dict(weights)
        bad.pop("layers.1.ffn_norm.weight")
        bad["layers.0.attention.wk.weight"] = torch.zeros(64, 64)
        save_tensors(paths["bad.st"], bad)
        try:
            golden(paths["args.json"], paths["bad.st"], paths["b.st"], paths["out.st"])
            check(False, "mismatched weights are rejected")
        except RefError as e:
            check("missing 'layers.1.ffn_norm.weight'" in str(e) and "wk.weight" in str(e),
                  "mismatched weights are rejected")

    with torch.no_grad():
        t = 9
        changed = inputs.clone()
        changed[:, t] = (changed[:, t] + 1) % a.vocab_size
        la, lb = ref(inputs), ref(changed)
        check(torch.allclose(la[:, :t], lb[:, :t], atol=1e-6, rtol=0)
              and not torch.allclose(la[:, t], lb[:, t]), "causal: token t leaves logits < t alone")

        attn = ref.layers[0].attention
        x = torch.randn(2, 12, a.dim)
        fc = ref.freqs_cis
        q = apply_rope(attn.wq(x).view(2, 12, 4, 16), fc)
        k = apply_rope(attn.wk(x).view(2, 12, 2, 16), fc)
        v = attn.wv(x).view(2, 12, 2, 16)
        mask = torch.ones(12, 12, dtype=torch.bool).tril()
        heads = []
        for h in range(a.n_heads):  # explicit GQA: q head h reads kv head h // n_rep
            j = h // (a.n_heads // a.kv_heads)
            s = q[:, :, h] @ k[:, :, j].transpose(-1, -2) / math.sqrt(16)
            heads.append(torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v[:, :, j])
        explicit = attn.wo(torch.stack(heads, 2).reshape(2, 12, -1))
        check(torch.allclose(attn(x, fc), explicit, atol=1e-5), "GQA matches an explicit per-head loop")

        hd, n = 16, 32
        freqs = rope_frequencies(hd, 500000.0, False)
        xr = torch.randn(1, n, 1, hd)
        got = apply_rope(xr, rope_table(a)).double()
        ang = torch.arange(n).double()[:, None] * freqs.double()[None, :]
        x0, x1 = xr[0, :, 0, 0::2].double(), xr[0, :, 0, 1::2].double()
        want_even = x0 * ang.cos() - x1 * ang.sin()
        want_odd = x0 * ang.sin() + x1 * ang.cos()
        check(torch.allclose(got[0, :, 0, 0::2], want_even, atol=1e-5)
              and torch.allclose(got[0, :, 0, 1::2], want_odd, atol=1e-5),
              "RoPE rotates each adjacent pair by pos * freq")

        f = rope_frequencies(128, 500000.0, False)
        fs = llama31_scale(f)
        wl = 2 * math.pi / f
        hi, lo, mid = wl < 2048, wl > 8192, (wl >= 2048) & (wl <= 8192)
        check(torch.equal(fs[hi], f[hi]) and torch.allclose(fs[lo], f[lo] / 8)
              and bool(((fs[mid] <= f[mid]) & (fs[mid] >= f[mid] / 8)).all()),
              "Llama 3.1 scaling keeps short, slows long, blends the band")
    print("self-test passed")


# ----------------------------------------------------------------------------- cli
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("golden", help="forward + loss + backward on given weights and batch")
    for flag in ("--model-args", "--weights", "--batch", "--out"):
        g.add_argument(flag, required=True)
    g.add_argument("--threads", type=int, default=1)
    b = sub.add_parser("bench", help="eager PyTorch training throughput")
    shape = b.add_mutually_exclusive_group(required=True)
    shape.add_argument("--model-args", help="a JSON file of model args")
    shape.add_argument("--flavor", help=f"one of loom's llama3 flavors: {', '.join(LOOM_FLAVORS)}")
    for flag in ("--batch-size", "--seq-len", "--steps", "--warmup", "--threads"):
        b.add_argument(flag, type=int, required=True)
    b.add_argument("--lr", type=float, default=8e-4)
    b.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    b.add_argument("--bf16", action="store_true", help="bfloat16 compute under autocast")
    b.add_argument("--compile", action="store_true", help="torch.compile the model and the loss")
    b.add_argument("--json")
    b.add_argument("--trace", help="profile the timed steps; write a Chrome trace here")
    sub.add_parser("self-test", help="check the reference itself")
    ns = p.parse_args(argv)
    try:
        if ns.cmd == "golden":
            golden(ns.model_args, ns.weights, ns.batch, ns.out, ns.threads)
        elif ns.cmd == "bench":
            bench(ns)
        else:
            self_test()
    except RefError as e:
        print(f"llama_reference: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
