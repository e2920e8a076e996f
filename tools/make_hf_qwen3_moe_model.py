#!/usr/bin/env python3
"""Tiny random Qwen3MoeForCausalLM models saved by the transformers that runs this script, with
what that transformers computes on them.

Writes OUT/<variant>/ (config.json + model.safetensors from save_pretrained, per-expert tensors)
and OUT/<variant>/reference.safetensors holding
  ids [1, T] int64, logits [1, T, vocab] float32: transformers' eager forward;
  block_in [2, T, D], block_out [2, T, D], block_layer []: the first sparse MoE block alone;
  prompt [1, P] int64, greedy [1, N] int64: greedy generate() with the KV cache.
Variants:
  normed: norm_topk_prob true (as Qwen3-30B-A3B), layer 1 dense (mlp_only_layers [1]), 3 layers;
  plain:  norm_topk_prob false (Qwen3MoeConfig's default), decoder_sparse_step 2 (layers 1 and 3
          mixtures, 0 and 2 dense), 4 layers.
Both: 8 experts of width 16, top 2, head_dim 16 where hidden_size / heads is 8, grouped kv heads,
q/k norms, theta 1e6, vocabulary 259 (the byte tokenizer's).

Usage: make_hf_qwen3_moe_model.py OUT [--seed N]
"""
import argparse
import os
import sys
import warnings

warnings.filterwarnings("ignore")

VOCAB = 259
NEW_TOKENS = 16
VARIANTS = {
    "normed": dict(num_hidden_layers=3, norm_topk_prob=True, mlp_only_layers=[1],
                   decoder_sparse_step=1),
    "plain": dict(num_hidden_layers=4, norm_topk_prob=False, mlp_only_layers=[],
                  decoder_sparse_step=2),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for name, variant in VARIANTS.items():
        make(os.path.join(a.out, name), variant, a.seed)
    return 0


def make(out, variant, seed):
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    major = int(transformers.__version__.split(".")[0])
    rope = ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}} if major >= 5
            else {"rope_theta": 1e6})
    config = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                            moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            max_position_embeddings=128, rms_norm_eps=1e-6,
                            tie_word_embeddings=False, **rope, **variant)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn_like(param)
            param.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else 0.4 * noise)
        model.model.norm.weight.mul_(0.1)  # logits near 1 (see make_hf_qwen3_model.py)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    model = Qwen3MoeForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (1, 24), generator=generator)
    prompt = torch.randint(0, 256, (1, 5), generator=generator)
    block_in = torch.randn(2, 24, 32, generator=generator)
    with torch.no_grad():
        logits = model(ids).logits.float()
        layer = next(i for i, block in enumerate(model.model.layers)
                     if type(block.mlp).__name__ == "Qwen3MoeSparseMoeBlock")
        block_out = model.model.layers[layer].mlp(block_in)
        if isinstance(block_out, tuple):  # transformers 4 also returns the router logits
            block_out = block_out[0]
        out_ids = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, eos_token_id=None,
                                 pad_token_id=VOCAB - 1, use_cache=True)
    save_file({"ids": ids.contiguous(), "logits": logits.contiguous(), "prompt": prompt,
               "block_in": block_in.contiguous(), "block_out": block_out.contiguous(),
               "block_layer": torch.tensor(layer),
               "greedy": out_ids[:, prompt.shape[1]:].contiguous()},
              os.path.join(out, "reference.safetensors"))
    print(f"{out}: transformers {transformers.__version__}")


if __name__ == "__main__":
    sys.exit(main())
