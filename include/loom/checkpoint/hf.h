// Hugging Face Llama interchange: `loom checkpoint export --to hf` and `import --from hf`.
// Names follow transformers' LlamaForCausalLM (model.layers.N.self_attn.q_proj.weight, ...).
// loom (like Meta's Llama) applies RoPE to interleaved pairs (x0,x1),(x2,x3)...; transformers
// rotates the two halves of each head, so q_proj/k_proj rows are permuted on the way out (and
// back on the way in) so that both compute the same attention.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/checkpoint/chunks.h"
#include "loom/models/llama/args.h"

namespace loom::checkpoint {

// The row permutation of a q/k projection [heads * head_dim, dim] from interleaved pairs to
// halves (to_hf = true) or back.
at::Tensor permute_rotary_rows(const at::Tensor& weight, int64_t heads, bool to_hf);

// loom parameter name (layers.0.attention.wq.weight) <-> HF name; throws InputError for a name
// with no counterpart.
std::string hf_name(const std::string& loom_name);
std::string loom_name(const std::string& hf_name);

struct HfExportOptions {
  std::string dtype = "bfloat16";  // "float32", "bfloat16" or "float16"
  uint64_t max_shard_bytes = 5'000'000'000ull;
  // Replace the files an export writes in a non-empty `output` (others are left alone); without
  // it a non-empty `output` is refused.
  bool overwrite = false;
  // The tokenizer to ship (a tokenizer.json); unset: the one the checkpoint's config.toml names.
  std::optional<std::string> tokenizer;
};

// Writes `output`/model.safetensors (or model-0000i-of-0000N.safetensors + index when the
// weights exceed max_shard_bytes) and config.json from a complete loom checkpoint step (a llama3
// model; its config.toml gives the flavor), with the tokenizer: tokenizer.json,
// tokenizer_config.json (special tokens), generation_config.json and bos/eos ids in config.json,
// so that transformers' AutoTokenizer and AutoModelForCausalLM load the folder and generate()
// stops at the right end token. A tokenizer with no tokenizer.json form (byte, tiktoken) is
// named in a warning; its ids still go into the configs.
void export_to_hf(const std::string& step_folder, const std::string& output,
                  const HfExportOptions& options);

// The tokenizer part of an export: writes tokenizer.json, tokenizer_config.json and
// generation_config.json into `output` and adds bos/eos/pad ids to `hf_config`. `location` is a
// model.tokenizer_path value ("brown_bpe", "byte", a tokenizer.json or tiktoken file).
void export_tokenizer_to_hf(const std::string& location, int64_t max_seq_len,
                            const std::string& output, nlohmann::json& hf_config);

// Reads a Hugging Face Llama folder (config.json + model.safetensors or a sharded index) and
// writes a complete model-only loom checkpoint `checkpoint_folder`/step-0, loadable with
// checkpoint.initial_load_path. config.json is read as llama_args_from_hf_config reads it (its
// refusals apply); `accept`, when given, sees its arguments before anything is written and
// throws to refuse them (a model that would compute differently).
void import_from_hf(const std::string& hf_folder, const std::string& checkpoint_folder,
                    const std::function<void(const models::llama::LlamaArgs&)>& accept = {});

// config.json of a Hugging Face folder, read strictly and turned into Llama arguments.
models::llama::LlamaArgs read_hf_config(const std::string& hf_folder);

// Whether `folder` looks like a Hugging Face model folder (config.json + safetensors weights).
bool is_hf_folder(const std::string& folder);

// The Llama arguments of a Hugging Face LlamaForCausalLM config.json (`source` names it in
// errors), in the layout of transformers 4 (top-level rope_theta, rope_scaling) or 5
// (rope_parameters {rope_type, rope_theta, ...}). A key left out takes LlamaConfig's default
// (rope_theta 10000, rms_norm_eps 1e-6), as transformers does. Throws InputError naming the key
// and the value loom needs for anything loom would compute differently from transformers: a
// rope_type other than default and llama3, biases, an activation other than silu, a head_dim
// other than hidden_size / num_attention_heads, sliding windows, soft-capping, quantization,
// custom code, or two RoPE descriptions that disagree. Other unfamiliar keys get one warning.
models::llama::LlamaArgs llama_args_from_hf_config(const nlohmann::json& config,
                                                   const std::string& source);

// The config.json of an export: LlamaForCausalLM with the RoPE in both layouts (top-level
// rope_theta and rope_scaling for transformers 4, rope_parameters for 5), saying the same.
nlohmann::json hf_config_json(const models::llama::LlamaArgs& args, const std::string& dtype);

// What two Llamas compute differently although their weights may have the same shapes (heads,
// norm epsilon, RoPE), one "what a vs b" line each; empty when they compute the same.
std::vector<std::string> arithmetic_differences(const models::llama::LlamaArgs& a,
                                                const models::llama::LlamaArgs& b);

// The weights of a Hugging Face Llama folder under loom's names (without the "model." prefix of
// checkpoints), q/k rows permuted back to loom's rotary layout, CPU tensors as stored. A tied
// output projection (tie_word_embeddings) becomes a copy of the embedding; a stored
// lm_head.weight that differs from the embedding it is tied to is an error (transformers would
// use the embedding).
std::vector<LocalChunk> read_hf_weights(const std::string& hf_folder);

}  // namespace loom::checkpoint
