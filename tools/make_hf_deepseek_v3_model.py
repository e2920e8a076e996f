#!/usr/bin/env python3
"""Tiny random DeepseekV3ForCausalLM models saved by the transformers that runs this script, with
what that transformers computes on them.

Writes OUT/<variant>/ (config.json + model.safetensors from save_pretrained, per-expert tensors,
each router's e_score_correction_bias set to small random values) and
OUT/<variant>/reference.safetensors holding
  ids [1, T] int64, logits [1, T, vocab] float32: transformers' eager forward;
  block_in [2, T, D], block_out [2, T, D], block_layer []: the first MoE block alone;
  prompt [1, P] int64, greedy [1, N] int64: greedy generate() with transformers' cache.
Variants (both: 4 layers, the first two dense, 8 experts in 4 groups of which 2 are kept, top 3,
one shared expert, sigmoid scores normalized and scaled by 2.5, vocabulary 259):
  qlora: q_lora_rank 24 (q_a_proj, q_a_layernorm, q_b_proj), YaRN (factor 4 over 32 positions,
         mscale = mscale_all_dim = 0.707: the softmax scale grows, the rotations keep unit size);
  plain: q_lora_rank null (one q_proj), YaRN with mscale 1 and mscale_all_dim 0.5 (rotations
         scaled by their ratio), rope_interleave false (rotate-half features).

Usage: make_hf_deepseek_v3_model.py OUT [--seed N]
"""
import argparse
import os
import sys
import warnings

warnings.filterwarnings("ignore")

VOCAB = 259
NEW_TOKENS = 16
VARIANTS = {
    "qlora": dict(q_lora_rank=24, rope_interleave=True,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}),
    "plain": dict(q_lora_rank=None, rope_interleave=False,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5}),
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
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                              moe_intermediate_size=16, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                              n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=16,
                              qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=16, n_group=4,
                              topk_group=2, num_experts_per_tok=3, first_k_dense_replace=2,
                              norm_topk_prob=True, max_position_embeddings=128,
                              rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                              **variant)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn_like(param)
            param.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else 0.4 * noise)
        model.model.norm.weight.mul_(0.1)  # logits near 1 (see make_hf_qwen3_model.py)
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                # Positive: every biased score stays above the 0 transformers masks groups with.
                layer.mlp.gate.e_score_correction_bias.copy_(0.3 * torch.rand(8))
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    model = DeepseekV3ForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (1, 48), generator=generator)  # past the 32 original positions
    prompt = torch.randint(0, 256, (1, 5), generator=generator)
    block_in = torch.randn(2, 24, 32, generator=generator)
    with torch.no_grad():
        logits = model(ids).logits.float()
        layer = next(i for i, block in enumerate(model.model.layers)
                     if type(block.mlp).__name__ == "DeepseekV3MoE")
        block_out = model.model.layers[layer].mlp(block_in)
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
