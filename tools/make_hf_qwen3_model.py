#!/usr/bin/env python3
"""A tiny random Qwen3ForCausalLM saved by the transformers that runs this script, with what that
transformers computes on it.

Writes OUT/tied and OUT/untied (or only one, --only), each config.json + model.safetensors
(save_pretrained, in that version's own config.json layout) and reference.safetensors holding
  ids [1, T] int64, logits [1, T, vocab] float32: transformers' eager forward;
  prompt [1, P] int64, greedy [1, N] int64: its greedy generate() with the KV cache
    (no end token: N new tokens).
The shape exercises what sets Qwen3 apart from Llama: head_dim (16) is not hidden_size /
num_attention_heads (8), grouped kv heads, q/k norms (drawn away from 1 so they matter), theta
1e6; `tied` ties the head to the token table. The vocabulary is 259, the byte tokenizer's, so
that loom's generator can decode what it generates.

The tests run it with the venv's transformers 4 at test time; tests/data/hf_qwen3/transformers5
was written once by transformers 5 (installed elsewhere, e.g.
`pip install --target /tmp/tf5 'transformers>=5,<6'`):
    PYTHONPATH=/tmp/tf5 .venv/bin/python tools/make_hf_qwen3_model.py \
        tests/data/hf_qwen3/transformers5 --only tied

Usage: make_hf_qwen3_model.py OUT [--seed N] [--only tied|untied]
"""
import argparse
import os
import sys
import warnings

warnings.filterwarnings("ignore")

VOCAB = 259
NEW_TOKENS = 16


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=("tied", "untied"))
    a = p.parse_args()
    for tied in (True, False):
        name = "tied" if tied else "untied"
        if a.only in (None, name):
            make(os.path.join(a.out, name), tied, a.seed)
    return 0


def make(out, tied, seed):
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # transformers 5 takes the RoPE as rope_parameters; 4 as rope_theta (+ rope_scaling).
    major = int(transformers.__version__.split(".")[0])
    rope = ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}} if major >= 5
            else {"rope_theta": 1e6})
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-6,
                         tie_word_embeddings=tied, **rope)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Weights larger than the usual initialization: attention is sharp (the RoPE and
            # the q/k norms show) and greedy tokens vary instead of repeating the last one.
            noise = torch.randn_like(param)
            param.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else 0.4 * noise)
        # The final norm's scale sets the logits' size: about 1, where float32 rounding stays
        # near 1e-6 (with a scale of 1, logits near 9 differ by up to 9e-6 between float32 and
        # float64 in transformers itself). Argmax, so greedy tokens, do not depend on it.
        model.model.norm.weight.mul_(0.1)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    # The reference comes from the saved folder loaded as a user would.
    model = Qwen3ForCausalLM.from_pretrained(out, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (1, 24), generator=generator)
    prompt = torch.randint(0, 256, (1, 5), generator=generator)
    with torch.no_grad():
        logits = model(ids).logits.float()
        # An explicit mask: generate() would take any prompt token equal to pad_token_id for
        # padding.
        out_ids = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, eos_token_id=None,
                                 pad_token_id=VOCAB - 1, use_cache=True)
    save_file({"ids": ids.contiguous(), "logits": logits.contiguous(), "prompt": prompt,
               "greedy": out_ids[:, prompt.shape[1]:].contiguous()},
              os.path.join(out, "reference.safetensors"))
    print(f"{out}: transformers {transformers.__version__}")


if __name__ == "__main__":
    sys.exit(main())
