// Hugging Face interchange for any registered model family: `loom checkpoint export --to hf`,
// `import --from hf`, and the models of checkpoint steps and Hugging Face folders that generate,
// eval and checkpoint.initial_load_path read. The family comes from the checkpoint's config.toml
// (model.name) or the folder's config.json (model_type); names, layouts, tied weights and
// config.json fields are the family's state dict adapter's (models/model_spec.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/checkpoint/chunks.h"
#include "loom/models/model_spec.h"

namespace loom::checkpoint {

struct HfExportOptions {
  std::string dtype = "bfloat16";  // "float32", "bfloat16" or "float16"
  uint64_t max_shard_bytes = 5'000'000'000ull;
  // Replace the files an export writes in a non-empty `output` (others are left alone); without
  // it a non-empty `output` is refused.
  bool overwrite = false;
  // The tokenizer to ship (a tokenizer.json); unset: the one the checkpoint's config.toml names.
  std::optional<std::string> tokenizer;
};

// A model and the family that built it, with what its source says about inference.
struct SourcedModel {
  const models::ModelSpec* spec = nullptr;
  std::unique_ptr<models::CausalLM> model;
  std::optional<std::string> tokenizer;  // the tokenizer its source names, if any
  nlohmann::json hf_config;              // a Hugging Face source's config.json (else null)
  // A loom step trained with model.attn_mask_type = block_causal: each document attends only
  // within itself, its positions restarting at its BOS (a forward must say where they are).
  bool block_causal = false;
};

// Overrides for the model of a checkpoint step that has no config.toml of its own.
struct StepModelOverrides {
  std::optional<std::string> name;    // model.name (family)
  std::optional<std::string> flavor;  // model.flavor
};

// The model a complete checkpoint step holds, built with `options` (the device: meta to plan;
// dtype; its max_seq_len when positive): from the step's config.toml (model.name, model.flavor,
// training.seq_len as context, the tokenizer), or for an imported step from the config.json it
// keeps (hf_config.json); `overrides` replace or supply the family and flavor. The vocabulary is
// the saved embedding's. Throws InputError naming what is missing (and the flags to pass).
SourcedModel step_model(const std::string& step_folder, models::BuildOptions options,
                        const StepModelOverrides& overrides = {});

// The model a Hugging Face folder holds (its family by config.json's model_type), built with
// `options`; InputError for a config.json loom would read differently from transformers.
SourcedModel hf_model(const std::string& hf_folder, const models::BuildOptions& options);

// Writes `output`/model.safetensors (or model-0000i-of-0000N.safetensors + index when the
// weights exceed max_shard_bytes) and config.json from a complete loom checkpoint step (its model
// as step_model builds it), with the tokenizer: tokenizer.json, tokenizer_config.json (special
// tokens), generation_config.json and bos/eos ids in config.json, so that transformers'
// AutoTokenizer and AutoModelForCausalLM load the folder and generate() stops at the right end
// token. A tokenizer with no tokenizer.json form (byte, tiktoken) is named in a warning; its ids
// still go into the configs.
void export_to_hf(const std::string& step_folder, const std::string& output,
                  const HfExportOptions& options);

// The tokenizer part of an export: writes tokenizer.json, tokenizer_config.json and
// generation_config.json into `output` and adds bos/eos/pad ids to `hf_config`. `location` is a
// model.tokenizer_path value ("brown_bpe", "byte", a tokenizer.json or tiktoken file).
void export_tokenizer_to_hf(const std::string& location, int64_t max_seq_len,
                            const std::string& output, nlohmann::json& hf_config);

// Reads a Hugging Face folder (config.json + model.safetensors or a sharded index) and writes a
// complete model-only loom checkpoint `checkpoint_folder`/step-0 that keeps the folder's
// config.json (hf_config.json), loadable with checkpoint.initial_load_path and readable by
// export, generate and eval. `accept`, when given, sees the folder's model before anything is
// written and throws to refuse it (a model that would compute differently from the job's).
// `target`, when given, is the model (of the same family) the weights are read for: a job's,
// whose tied or untied head decides what a tied folder's table becomes; by default the folder's.
// Refused (InputError, nothing written): an existing step-0 unless `overwrite` (it may be a
// training run's), a folder missing a weight the model needs (the final norm, the head, a
// router gate, DeepSeek's e_score_correction_bias), a weight holding NaN or Inf, and a weight
// whose shape is not the one config.json implies.
void import_from_hf(const std::string& hf_folder, const std::string& checkpoint_folder,
                    const std::function<void(const SourcedModel&)>& accept = {},
                    const models::CausalLM* target = nullptr, bool overwrite = false);

// Whether `folder` looks like a Hugging Face model folder (config.json + safetensors weights).
bool is_hf_folder(const std::string& folder);

// The weights of a Hugging Face folder under `model`'s loom names and layouts (its family's
// adapter, with the fix-ups for tied heads), CPU tensors as stored. Throws InputError for a
// tensor the model has no place for or one found in two files.
std::map<std::string, at::Tensor> read_hf_weights(const std::string& hf_folder,
                                                  const models::ModelSpec& spec,
                                                  const models::CausalLM& model);

// What two models' config.json files say they compute differently (every field but vocabulary,
// context, dtype, tying and metadata), one "key: a vs b" line each; empty when they compute the
// same.
std::vector<std::string> arithmetic_differences(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace loom::checkpoint
