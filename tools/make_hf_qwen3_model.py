#!/usr/bin/env python3
"""A tiny random Qwen3ForCausalLM saved by this venv's transformers, with its own logits.

Writes OUT/tied and OUT/untied, each config.json + model.safetensors (save_pretrained) and
reference.safetensors holding `ids` [1, T] int64 and `logits` [1, T, vocab] float32 from
transformers' eager forward.
The shape exercises what sets Qwen3 apart from Llama: head_dim (32) is not hidden_size /
num_attention_heads (16), grouped kv heads, q/k norms (drawn away from 1 so they matter), theta
1e6; `tied` ties the head to the token table.

Usage: make_hf_qwen3_model.py OUT [--seed N]
"""
import argparse
import os
import sys
import warnings

warnings.filterwarnings("ignore")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for tied in (True, False):
        make(os.path.join(a.out, "tied" if tied else "untied"), tied, a.seed)
    return 0


def make(out, tied, seed):
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=128, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=tied,
                         attn_implementation="eager")
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    ids = torch.randint(0, config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(ids).logits.float()
    save_file({"ids": ids.contiguous(), "logits": logits.contiguous()},
              os.path.join(out, "reference.safetensors"))


if __name__ == "__main__":
    sys.exit(main())
