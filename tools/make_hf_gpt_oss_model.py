#!/usr/bin/env python3
"""Tiny random GptOssForCausalLM models saved by the transformers that runs this script, with
what that transformers computes on them.

Writes OUT/<variant>/ (config.json + model.safetensors) and OUT/<variant>/reference.safetensors
holding
  ids [1, T] int64, logits [1, T, vocab] float32: transformers' eager forward (T 40, ten times
      the sliding window);
  block_in [2, T', D], block_out [2, T', D], block_layer []: layer 0's MoE block (router and
      experts) alone;
  prompt [1, P] int64, greedy [1, N] int64: greedy generate() with transformers' cache.
Both variants share one architecture: 4 layers alternating sliding (even layers, window 4) and
full attention, hidden 64, 4 query heads and 2 kv heads of head_dim 8 (q width 32 != hidden),
biases on q/k/v/o, per-head attention sinks ~ N(0, 1), 8 experts of width 64, top 2 (softmax over
the two chosen router logits), router and expert biases, gpt-oss's own rope (theta 150000, YaRN
factor 32 over 4096 positions, beta 32/1, truncate false: with head_dim 8 the ramp blends one
frequency), vocabulary 259. The expert weights are MXFP4 values (FP4 E2M1 codes times a power of
two per block of 32 inputs) scaled so that the clamped SwiGLU's limit (7) is reached: the script
asserts and prints the fraction of routed gate / up pre-activations past it. Hidden and expert
width are multiples of 32 (two MXFP4 blocks per row) because the MXFP4 layout needs it.
Variants:
  plain: save_pretrained's float32 folder (gate_up_proj [E, D, 2I] with gate/up interleaved
         along the last dim, down_proj [E, I, D]).
  mxfp4: the same weights with the experts stored as gpt-oss publishes them:
         model.layers.N.mlp.experts.{gate_up,down}_proj_{blocks,scales} (uint8 [E, out, in/32, 16]
         and [E, out, in/32]; biases float), config.json with gpt-oss's quantization_config.
         The script's own quantizer writes them and is checked against transformers'
         convert_moe_packed_tensors. Also OUT/mxfp4/dequantized.safetensors: the dequantized
         gate_up_proj / down_proj under transformers' parameter names. Its reference logits come
         from GptOssForCausalLM holding the dequantized weights (equal to plain's); when
         transformers can load the folder itself (on CPU it dequantizes), its logits are checked
         against them too.

Usage: make_hf_gpt_oss_model.py OUT [--seed N]
"""
import argparse
import json
import os
import shutil
import sys
import warnings

warnings.filterwarnings("ignore")

VOCAB = 259
NEW_TOKENS = 16
HIDDEN = 64
INTERMEDIATE = 64
LAYERS = 4
EXPERTS = 8
TOP_K = 2
SLIDING_WINDOW = 4
LIMIT = 7.0  # GptOssExperts' hard-coded limit (and the config's swiglu_limit)
BLOCK = 32  # MXFP4: one E8M0 scale per 32 FP4 values along the input dim
# FP4 E2M1 by code: bit 3 sign, bits 2-1 exponent, bit 0 mantissa.
FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# gpt-oss-20b's and -120b's quantization_config.
QUANTIZATION = {"quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    plain = os.path.join(a.out, "plain")
    reference = make_plain(plain, a.seed)
    make_mxfp4(os.path.join(a.out, "mxfp4"), plain, reference)
    return 0


def make_config():
    from transformers import GptOssConfig

    return GptOssConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K,
                        experts_per_token=TOP_K, sliding_window=SLIDING_WINDOW,
                        layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2),
                        rope_theta=150000.0, initial_context_length=4096,
                        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                      "beta_slow": 1.0, "truncate": False,
                                      "original_max_position_embeddings": 4096},
                        max_position_embeddings=131072, swiglu_limit=LIMIT, rms_norm_eps=1e-5,
                        tie_word_embeddings=False, attention_dropout=0.0)


def dequantize_mxfp4(blocks, scales):
    """uint8 blocks [..., G, 16] and scales [..., G] -> float32 [..., G * 32]: byte j of a block
    holds element 2j in its low nibble and 2j+1 in its high nibble; scale byte s means 2^(s-127)."""
    import torch

    lut = torch.tensor(FP4, dtype=torch.float32)
    pairs = torch.stack((lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]), dim=-1)
    values = pairs.reshape(*blocks.shape[:-1], BLOCK)
    values = torch.ldexp(values, (scales.to(torch.int32) - 127)[..., None].to(torch.float32))
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * BLOCK)


def quantize_mxfp4(w):
    """float [..., K] -> (blocks uint8 [..., K/32, 16], scales uint8 [..., K/32]). The OCP MX
    rule: scale 2^(floor(log2 amax) - 2) (2 = FP4's largest exponent), values rounded to the
    nearest FP4 magnitude (ties to the even code), saturated at 6; zero maps to code 0 (never -0),
    an all-zero block gets scale byte 127. Exact for values that are FP4 codes times a power of two
    per block (dequantize_mxfp4 gives them back)."""
    import torch

    assert w.shape[-1] % BLOCK == 0, w.shape
    g = w.double().reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)
    amax = g.abs().amax(dim=-1)
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-300))) - 2,
                           torch.zeros_like(amax))
    assert bool(((exponent >= -127) & (exponent <= 127)).all()), "scale out of E8M0 range"
    scaled = (g / torch.exp2(exponent)[..., None]).abs().clamp(max=6.0)
    magnitudes = torch.tensor(FP4[:8], dtype=torch.float64)
    distance = (scaled[..., None] - magnitudes).abs()
    distance = distance + 1e-9 * (torch.arange(8) % 2)  # ties to the even code
    code = distance.argmin(dim=-1)
    code = torch.where((g < 0) & (code > 0), code + 8, code).to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    scales = (exponent + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def random_mxfp4_weight(shape, exponents, generator):
    """A float32 tensor of stored layout [E, out, in] whose every block of 32 inputs is FP4
    codes (never -0) times 2^e, e drawn from `exponents`."""
    import torch

    *rows, k = shape
    codes = torch.randint(0, 15, (*rows, k), generator=generator)
    codes = torch.where(codes >= 8, codes + 1, codes).to(torch.uint8)  # skip code 8 (-0)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    blocks = blocks.reshape(*rows, k // BLOCK, BLOCK // 2)
    pick = torch.randint(0, len(exponents), (*rows, k // BLOCK), generator=generator)
    scales = (torch.tensor(exponents)[pick] + 127).to(torch.uint8)
    return dequantize_mxfp4(blocks, scales)


def make_plain(out, seed):
    import torch
    import transformers
    from transformers import GptOssForCausalLM

    config = make_config()
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config)
    scale = {"embed_tokens.weight": 1.0, "sinks": 1.0, "lm_head.weight": 0.4,
             "router.weight": 0.4, "router.bias": 0.3, "gate_up_proj_bias": 1.0,
             "down_proj_bias": 0.3, "proj.weight": 0.15, "proj.bias": 0.2}
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
            elif name.endswith(EXPERT_WEIGHTS):
                # Drawn in the stored (MXFP4) layout [E, out, in], kept as [E, in, out].
                # gate_up: about 5% of the routed gate / up pre-activations pass +-7;
                # down: small, so that attention keeps a share of the residual stream.
                exponents = (-3, -2) if name.endswith("gate_up_proj") else (-7, -6)
                stored = random_mxfp4_weight(param.transpose(1, 2).shape, exponents, generator)
                param.copy_(stored.transpose(1, 2))
            else:
                std = next(v for k, v in scale.items() if name.endswith(k))
                param.copy_(std * torch.randn_like(param))
        model.model.norm.weight.mul_(0.1)  # logits near 1 (see make_hf_qwen3_model.py)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    model = GptOssForCausalLM.from_pretrained(out, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    reference = compute_reference(model)
    check_features(model, reference)
    save_reference(reference, out)
    print(f"{out}: transformers {transformers.__version__}")
    return reference


def compute_reference(model):
    """The tensors of reference.safetensors, and how often the SwiGLU clamps bit."""
    import torch

    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (1, 40), generator=generator)
    prompt = torch.randint(0, 256, (1, 5), generator=generator)
    block_in = torch.randn(2, 24, HIDDEN, generator=generator)
    layer = 0
    seen = []

    def look(module, args, kwargs):
        x = args[0].reshape(-1, HIDDEN)
        chosen = kwargs["router_indices"]  # [tokens, top_k]
        gate_up = torch.einsum("td,tkdf->tkf", x, module.gate_up_proj[chosen])
        gate_up = gate_up + module.gate_up_proj_bias[chosen]
        seen.append((gate_up[..., ::2], gate_up[..., 1::2]))

    hooks = [block.mlp.experts.register_forward_pre_hook(look, with_kwargs=True)
             for block in model.model.layers]
    with torch.no_grad():
        logits = model(ids).logits.float()
        block_out = model.model.layers[layer].mlp(block_in)[0]
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        out_ids = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, eos_token_id=None,
                                 pad_token_id=VOCAB - 1, use_cache=True)
        uncached = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=NEW_TOKENS, eos_token_id=None,
                                  pad_token_id=VOCAB - 1, use_cache=False)
    assert torch.equal(out_ids, uncached), "greedy tokens with and without the cache differ"
    greedy = out_ids[:, prompt.shape[1]:].contiguous()
    assert len(set(greedy[0].tolist())) > 4, greedy
    # seen: layers 0-3 on ids, then layer 0 on block_in.
    for what, (gate, up) in zip([f"layer {i}" for i in range(LAYERS)] + ["block_in"], seen):
        gate_hit = (gate > LIMIT).double().mean().item()
        up_hit = (up.abs() > LIMIT).double().mean().item()
        print(f"  clamped SwiGLU, {what}: gate > {LIMIT:g} in {100 * gate_hit:.1f}%, "
              f"|up| > {LIMIT:g} in {100 * up_hit:.1f}% of routed pre-activations")
        assert gate_hit > 0 and up_hit > 0, f"the limit is never reached in {what}"
    return {"ids": ids.contiguous(), "logits": logits.contiguous(), "prompt": prompt,
            "block_in": block_in.contiguous(), "block_out": block_out.contiguous(),
            "block_layer": torch.tensor(layer), "greedy": greedy}


def check_features(model, reference):
    """The sinks, the window, the biases and the clamp each move the logits."""
    import copy

    import torch

    def moved(change):
        other = copy.deepcopy(model)
        change(other)
        with torch.no_grad():
            logits = other(reference["ids"]).logits
        return (logits - reference["logits"]).abs().max().item()

    def no_sinks(m):
        for block in m.model.layers:
            block.self_attn.sinks.data.fill_(-1e4)

    def no_window(m):
        m.config.layer_types = ["full_attention"] * LAYERS
        for block in m.model.layers:
            block.attention_type = "full_attention"
            block.self_attn.sliding_window = None

    def no_expert_bias(m):
        for block in m.model.layers:
            block.mlp.experts.gate_up_proj_bias.data.zero_()

    def no_clamp(m):
        for block in m.model.layers:
            block.mlp.experts.limit = 1e9

    for what, change in (("sinks", no_sinks), ("sliding window", no_window),
                         ("expert gate_up bias", no_expert_bias), ("SwiGLU clamp", no_clamp)):
        worst = moved(change)
        print(f"  without the {what}: logits move by up to {worst:.3f}")
        assert worst > 1e-2, f"the {what} hardly matters"


def save_reference(reference, out):
    from safetensors.torch import save_file

    save_file(reference, os.path.join(out, "reference.safetensors"))


def make_mxfp4(out, plain, plain_reference):
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GptOssForCausalLM
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    state = load_file(os.path.join(plain, "model.safetensors"))
    packed, dequantized = {}, {}
    for name, tensor in state.items():
        if not name.endswith(EXPERT_WEIGHTS):
            packed[name] = tensor
            continue
        # transformers' [E, in, out] -> the stored [E, out, in], quantized along `in`.
        blocks, scales = quantize_mxfp4(tensor.transpose(1, 2))
        assert torch.equal(dequantize_mxfp4(blocks, scales).transpose(1, 2), tensor), name
        theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        assert theirs.shape == tensor.shape and torch.equal(theirs, tensor), name
        packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
        dequantized[name] = dequantize_mxfp4(blocks, scales).transpose(1, 2).contiguous()
    print(f"  MXFP4: {len(dequantized)} expert tensors round-trip exactly and equal "
          f"transformers' convert_moe_packed_tensors; e.g. model.layers.0.mlp.experts."
          f"gate_up_proj_blocks {list(packed['model.layers.0.mlp.experts.gate_up_proj_blocks'].shape)}"
          f", down_proj_scales {list(packed['model.layers.0.mlp.experts.down_proj_scales'].shape)}")
    os.makedirs(out, exist_ok=True)
    save_file(packed, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    save_file(dequantized, os.path.join(out, "dequantized.safetensors"))
    with open(os.path.join(plain, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = QUANTIZATION
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    if os.path.exists(os.path.join(plain, "generation_config.json")):
        shutil.copy(os.path.join(plain, "generation_config.json"), out)

    # The reference: GptOssForCausalLM holding the dequantized weights.
    model = GptOssForCausalLM(make_config())
    model.load_state_dict({**state, **dequantized}, strict=True)
    model.config._attn_implementation = "eager"
    model = model.eval()
    reference = compute_reference(model)
    for key, value in reference.items():
        assert torch.equal(value, plain_reference[key]), f"{key} differs from plain's"
    save_reference(reference, out)

    # transformers' own loading of the folder (on CPU it dequantizes to bfloat16 parameters).
    try:
        loaded = GptOssForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                   attn_implementation="eager").eval()
    except Exception as error:  # noqa: BLE001 - reported, the reference stands without it
        print(f"  transformers cannot load the MXFP4 folder here: {type(error).__name__}: "
              f"{str(error).splitlines()[0][:200]}")
    else:
        dtypes = sorted({str(p.dtype) for n, p in loaded.named_parameters()
                         if n.endswith(EXPERT_WEIGHTS)})
        for name, param in loaded.named_parameters():
            if name.endswith(EXPERT_WEIGHTS):
                assert torch.equal(param.float(), dequantized[name]), name
        loaded = loaded.float()  # bfloat16 expert parameters hold the values exactly
        with torch.no_grad():
            logits = loaded(reference["ids"]).logits
        worst = (logits - reference["logits"]).abs().max().item()
        print(f"  transformers loads the MXFP4 folder on CPU (expert parameters {dtypes}, "
              f"equal to dequantized.safetensors): max |logits - reference| {worst:.1e}")
        assert worst == 0.0, worst
    print(f"{out}: MXFP4 experts, reference from the dequantized weights")


if __name__ == "__main__":
    sys.exit(main())
