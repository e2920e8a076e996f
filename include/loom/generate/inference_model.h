// A model for inference straight from a checkpoint: a native step folder written by any parallel
// layout (read by chunk overlap, so FSDP shards come back whole) or a Hugging Face folder, of any
// registered family. The family, shape and tokenizer come from the checkpoint's own config
// (config.toml, an import's hf_config.json, or config.json + tokenizer.json); what is missing
// must be given explicitly.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>

#include "loom/data/tokenizer.h"
#include "loom/models/model_spec.h"

namespace loom::generate {

struct ModelSource {
  // A step-N folder, a checkpoint folder (its newest complete step), a run's dump folder (its
  // checkpoint/ folder), or a Hugging Face folder.
  std::string checkpoint;
  std::optional<std::string> model;      // the family, when the checkpoint has no config
  std::optional<std::string> flavor;     // when the checkpoint has no config.toml
  std::optional<std::string> tokenizer;  // overrides / supplies the tokenizer
  std::optional<int64_t> max_seq_len;    // overrides the context (default: the trained seq_len)
  std::string device = "auto";           // auto (cuda when available), cpu, cuda, cuda:N
  std::string dtype = "float32";         // float32, bfloat16, float16
};

struct InferenceModel {
  const models::ModelSpec* spec = nullptr;
  std::unique_ptr<models::CausalLM> model;
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::string step_folder;  // the folder the weights came from
  std::string format;       // "loom" or "huggingface"
  std::string dtype;        // ModelSource::dtype
  // Trained with block_causal documents: forward() splits each row at the tokenizer's BOS (and
  // restarts positions there) as training did, so packed windows score as validation did.
  bool block_causal = false;
  int64_t context() const { return model->max_seq_len(); }
  // "loaded <folder> (loom checkpoint, float32 on cpu, context 256 tokens)", for the log of the
  // command that loaded it.
  std::string describe() const;
  at::Device device() const;
  // Full forward (no cache): tokens [bs, seq] on any device -> logits [bs, seq, vocab] float32.
  // Under block_causal, documents start at each BOS and at each row's first token.
  at::Tensor forward(const at::Tensor& tokens);
};

// Throws InputError for a missing, incomplete or unreadable checkpoint (naming the folder and
// what is wrong), a checkpoint without config whose shape or tokenizer was not given (naming the
// flags), or weights whose shapes differ from the model's.
InferenceModel load_inference_model(const ModelSource& source);

// The step folder `path` designates (see ModelSource::checkpoint); InputError when none.
std::string resolve_step_folder(const std::string& path);

}  // namespace loom::generate
