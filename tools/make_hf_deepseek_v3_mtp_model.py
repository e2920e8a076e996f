#!/usr/bin/env python3
"""A tiny random DeepseekV3ForCausalLM with two multi-token-prediction (MTP) layers, laid out as
DeepSeek publishes them, and the MTP training loss computed here from the DeepSeek-V3 paper's
definition (section 2.2), independently of loom.

transformers runs the main model only (it leaves out the layers past num_hidden_layers); the MTP
depths are built here from transformers' own DeepseekV3DecoderLayer and DeepseekV3RMSNorm:

  h^0      = the main model's final hidden state (after model.norm, what lm_head reads)
  h'^k_i   = eh_proj([enorm(Emb(t_{i+k})); hnorm(h^{k-1}_i)])
  h^k      = shared_head.norm(TRM_k(h'^k))        (TRM_k: layer num_hidden_layers + k - 1)
  L_k      = sum over i of CE(shared_head.head(h^k_i), t_{i+k+1})  for the i with t_{i+k+1} known
  loss     = L_main + scale / D * sum_k L_k       (sums; loom divides by the main targets)

The row is one fixed window: depth k has k fewer targets (inputs past the row read token 0).

Writes OUT/mtp/: config.json (num_nextn_predict_layers 2), model.safetensors with the MTP layers
(each with its copies of embed_tokens and shared_head.head, equal to the model's), and
reference.safetensors: inputs, labels [2, T] (two labels -100), main_logits, depth_losses [D],
main_loss [], loss [] (scale 0.3).

Usage: make_hf_deepseek_v3_mtp_model.py OUT [--seed N]
"""
import argparse
import os
import sys
import warnings

warnings.filterwarnings("ignore")

VOCAB = 259
DEPTHS = 2
SCALE = 0.3
LAYERS = 4


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    make(os.path.join(a.out, "mtp"), a.seed)
    return 0


def make(out, seed):
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (DeepseekV3DecoderLayer,
                                                                      DeepseekV3RMSNorm)

    config = DeepseekV3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                              moe_intermediate_size=16, num_hidden_layers=LAYERS,
                              num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                              n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=16,
                              qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=16, n_group=4,
                              topk_group=2, num_experts_per_tok=3, first_k_dense_replace=2,
                              norm_topk_prob=True, max_position_embeddings=128,
                              rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                              q_lora_rank=24, rope_interleave=True, rope_scaling=None,
                              num_nextn_predict_layers=DEPTHS)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config)
    dim = config.hidden_size
    depths = []
    for k in range(DEPTHS):
        depth = torch.nn.Module()
        depth.block = DeepseekV3DecoderLayer(config, LAYERS + k)
        depth.enorm = DeepseekV3RMSNorm(dim, eps=config.rms_norm_eps)
        depth.hnorm = DeepseekV3RMSNorm(dim, eps=config.rms_norm_eps)
        depth.eh_proj = torch.nn.Linear(2 * dim, dim, bias=False)
        depth.final_norm = DeepseekV3RMSNorm(dim, eps=config.rms_norm_eps)
        depths.append(depth)
    with torch.no_grad():
        for module in [model] + depths:
            for name, param in module.named_parameters():
                noise = torch.randn_like(param)
                param.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else 0.4 * noise)
        model.model.norm.weight.mul_(0.1)  # logits near 1 (see make_hf_qwen3_model.py)
        for depth in depths:
            depth.final_norm.weight.mul_(0.1)
        for layer in list(model.model.layers) + [d.block for d in depths]:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.copy_(0.3 * torch.rand(8))
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    weights = load_file(os.path.join(out, "model.safetensors"))
    for k, depth in enumerate(depths):
        prefix = f"model.layers.{LAYERS + k}."
        for name, tensor in depth.block.state_dict().items():
            weights[prefix + name] = tensor.contiguous()
        for name in ("enorm", "hnorm", "eh_proj"):
            weights[prefix + name + ".weight"] = getattr(depth, name).weight.detach().contiguous()
        weights[prefix + "shared_head.norm.weight"] = depth.final_norm.weight.detach().contiguous()
        weights[prefix + "embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
        weights[prefix + "shared_head.head.weight"] = weights["lm_head.weight"].clone()
    save_file(weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

    model.eval()
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (2, 25), generator=generator)
    inputs, labels = ids[:, :-1].contiguous(), ids[:, 1:].clone()
    labels[0, 5] = -100
    labels[1, 20] = -100
    seq = inputs.shape[1]
    with torch.no_grad():
        previous = model.model(inputs).last_hidden_state  # after model.norm
        main_logits = model.lm_head(previous).float()
        main_loss = F.cross_entropy(main_logits.reshape(-1, VOCAB), labels.reshape(-1),
                                    ignore_index=-100, reduction="sum")
        position_ids = torch.arange(seq).unsqueeze(0).expand(2, -1)
        rotations = model.model.rotary_emb(previous, position_ids)
        causal = torch.full((seq, seq), float("-inf")).triu(1)[None, None].expand(2, 1, -1, -1)
        depth_losses = []
        for k, depth in enumerate(depths, start=1):
            ahead = torch.zeros_like(inputs)
            ahead[:, :seq - k] = inputs[:, k:]
            target = torch.full_like(labels, -100)
            target[:, :seq - k] = labels[:, k:]
            x = depth.eh_proj(torch.cat([depth.enorm(model.model.embed_tokens(ahead)),
                                         depth.hnorm(previous)], dim=-1))
            x = depth.block(x, attention_mask=causal, position_ids=position_ids,
                            position_embeddings=rotations)
            x = x[0] if isinstance(x, tuple) else x
            previous = depth.final_norm(x)
            logits = model.lm_head(previous).float()
            depth_losses.append(F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1),
                                                ignore_index=-100, reduction="sum"))
        depth_losses = torch.stack(depth_losses)
        loss = main_loss + SCALE / DEPTHS * depth_losses.sum()
    save_file({"inputs": inputs, "labels": labels.contiguous(),
               "main_logits": main_logits.contiguous(), "main_loss": main_loss,
               "depth_losses": depth_losses, "loss": loss},
              os.path.join(out, "reference.safetensors"))
    print(f"{out}: loss {loss.item():.6f}, depths {depth_losses.tolist()}")


if __name__ == "__main__":
    sys.exit(main())
