"""transformers' YaRN frequencies and attention factor for the cases tests/unit/test_yarn.cpp
compares loom's with (models/common/rope.h), as JSON on stdout: gpt-oss 20B's (no truncation),
DeepSeek-V3's (mscale and mscale_all_dim) and a Qwen3 long-context one (head_dim 128)."""
import json

from transformers import PretrainedConfig
from transformers.modeling_rope_utils import _compute_yarn_parameters

CASES = [
    {"name": "gpt_oss_20b", "theta": 150000.0, "head_dim": 64, "max_position_embeddings": 131072,
     "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "original_max_position_embeddings": 4096, "truncate": False}},
    {"name": "deepseek_v3", "theta": 10000.0, "head_dim": 64, "max_position_embeddings": 163840,
     "rope_scaling": {"rope_type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1,
                      "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096}},
    {"name": "qwen3_long", "theta": 1000000.0, "head_dim": 128, "max_position_embeddings": 131072,
     "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 32768}},
]

out = []
for case in CASES:
    config = PretrainedConfig(rope_theta=case["theta"], head_dim=case["head_dim"],
                              hidden_size=case["head_dim"] * 8, num_attention_heads=8,
                              max_position_embeddings=case["max_position_embeddings"],
                              rope_scaling=case["rope_scaling"])
    inv_freq, attention_factor = _compute_yarn_parameters(config, "cpu")
    out.append({**case, "inv_freq": [float(x) for x in inv_freq.tolist()],
                "attention_factor": float(attention_factor)})
print(json.dumps(out))
