#!/usr/bin/env python3
"""Writes tests/data/hf_llama/transformers<MAJOR>/: a tiny Llama saved by the transformers that
runs this script (config.json in that version's own layout + model.safetensors), and its entry in
tests/data/hf_llama/expected.json: per-token losses transformers computes on fixed ids, and the
mean loss it computes when rope_theta is read as 10000 (what loom read from a transformers 5
config before it understood rope_parameters), so that a test can show that it would notice.

Run it once per major version (the venv has transformers 4; transformers 5 can be installed
elsewhere, e.g. `pip install --target /tmp/tf5 transformers==5.24.0`):
    .venv/bin/python tools/make_hf_llama_fixture.py
    PYTHONPATH=/tmp/tf5 .venv/bin/python tools/make_hf_llama_fixture.py
Both write the same weights (seeded); the RoPE differs per version (see ROPE) so that the
fixtures cover top-level rope_theta + rope_scaling (4) and rope_parameters (5).
"""
import json
import os
import shutil

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = f"{ROOT}/tests/data/hf_llama"
MAJOR = int(transformers.__version__.split(".")[0])
VOCAB = 259  # loom's byte tokenizer
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          # small, so that the scaling changes frequencies that matter over 48 tokens
          "original_max_position_embeddings": 32}
ROPE = {4: {"theta": 250000.0, **LLAMA3}, 5: {"theta": 500000.0, **LLAMA3}}
IDS = [(i * 37 + 11) % 256 for i in range(48)]


def config(theta):
    shape = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=72, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 rms_norm_eps=1e-5, bos_token_id=256, eos_token_id=257)
    scaling = {k: v for k, v in ROPE[MAJOR].items() if k != "theta"}
    if MAJOR >= 5:
        return LlamaConfig(**shape, rope_parameters={"rope_theta": theta, **scaling})
    return LlamaConfig(**shape, rope_theta=theta, rope_scaling=scaling)


def build(theta):
    model = LlamaForCausalLM(config(theta))
    generator = torch.Generator().manual_seed(29)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            # Weights far larger than the usual initialization: attention is sharp, so the loss
            # depends visibly on the rotary embedding.
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.35 * noise)
    return model.eval()


def losses(model):
    with torch.no_grad():
        logits = model(torch.tensor([IDS[:-1]])).logits[0].double()
    return F.cross_entropy(logits, torch.tensor(IDS[1:]), reduction="none").tolist()


def main():
    theta = ROPE[MAJOR]["theta"]
    folder = f"{OUT}/transformers{MAJOR}"
    shutil.rmtree(folder, ignore_errors=True)
    model = build(theta)
    model.save_pretrained(folder)
    # Load it back as a user would, and compute the reference from the saved folder.
    saved = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    reference = losses(saved)
    wrong = build(10000.0)
    wrong.load_state_dict(saved.state_dict())
    misread = losses(wrong)
    path = f"{OUT}/expected.json"
    expected = json.load(open(path)) if os.path.exists(path) else {}
    expected["ids"] = IDS
    expected[f"transformers{MAJOR}"] = {
        "transformers_version": transformers.__version__,
        "losses": reference,
        "mean_loss": sum(reference) / len(reference),
        "mean_loss_if_theta_10000": sum(misread) / len(misread),
    }
    with open(path, "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    mean = sum(reference) / len(reference)
    print(f"{folder}: mean loss {mean:.6f}, with theta 10000 {sum(misread) / len(misread):.6f}")


if __name__ == "__main__":
    main()
