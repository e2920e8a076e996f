"""Loss over the first steps of a Qwen3 (transformers' Qwen3ForCausalLM) under three inits.

Usage: .venv/bin/python tools/init_experiment.py {hf,titan,untied} VOCAB LAYERS

hf: Hugging Face's N(0, 0.02) everywhere, table tied; titan: torchtitan's rule (depth-scaled
output projections, the tied table drawn as the head); untied: Llama-style N(0, 1) table and a
separate head. Data: loom's synthetic stream (each token followed by its fixed successor with
probability 0.9, else uniform); AdamW at loom's defaults with warmup 200, clipping at 1.0.
Prints the loss every 4 steps. docs/performance.md ("First GPU check") has the figures.
"""
import math
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
torch.set_num_threads(1)
V, dim, layers = int(sys.argv[2]), 128, int(sys.argv[3])
mode = sys.argv[1]
steps, batch, seq = 20, 7, 512
cfg = Qwen3Config(vocab_size=V, hidden_size=dim, intermediate_size=384, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=(mode != "untied"),
                  max_position_embeddings=1024, rope_theta=1e6, rms_norm_eps=1e-6)
torch.manual_seed(0)
m = Qwen3ForCausalLM(cfg)  # HF init: N(0, 0.02) everywhere
if mode in ("titan", "untied"):
    with torch.no_grad():
        s = dim ** -0.5
        if mode == "untied":
            torch.nn.init.normal_(m.model.embed_tokens.weight)
            torch.nn.init.trunc_normal_(m.lm_head.weight, 0, s, -3 * s, 3 * s)
        else:
            torch.nn.init.trunc_normal_(m.model.embed_tokens.weight, 0, s, -3 * s, 3 * s)
        for i, l in enumerate(m.model.layers):
            d = 0.02 / math.sqrt(2 * (i + 1))
            for w in (l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj, l.mlp.gate_proj):
                torch.nn.init.trunc_normal_(w.weight, 0, 0.02, -2, 2)
            for w in (l.self_attn.o_proj, l.mlp.down_proj, l.mlp.up_proj):
                torch.nn.init.trunc_normal_(w.weight, 0, d, -2, 2)
g = torch.Generator().manual_seed(1)
succ = torch.randperm(V, generator=g)
def batch_of():
    t = torch.empty(batch, seq + 1, dtype=torch.long)
    t[:, 0] = torch.randint(0, V, (batch,), generator=g)
    follow = torch.rand(batch, seq, generator=g) < 0.9
    noise = torch.randint(0, V, (batch, seq), generator=g)
    for k in range(seq):
        t[:, k + 1] = torch.where(follow[:, k], succ[t[:, k]], noise[:, k])
    return t[:, :-1], t[:, 1:]
opt = torch.optim.AdamW(m.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
losses = []
for step in range(1, steps + 1):
    for group in opt.param_groups:
        group["lr"] = 8e-4 * step / 200
    x, y = batch_of()
    logits = m(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
    opt.zero_grad(); loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step(); losses.append(loss.item())
print(mode, V, layers, " ".join(f"{l:.2f}" for l in losses[::4] + [losses[-1]]))
