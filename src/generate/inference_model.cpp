#include "loom/generate/inference_model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/manager.h"
#include "loom/config/loader.h"
#include "loom/core/check.h"
#include "loom/core/strings.h"

namespace loom::generate {
namespace fs = std::filesystem;
namespace {

std::string flavor_names() {
  std::string names;
  for (const auto& [name, args] : models::llama::llama3_flavors()) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

at::Device pick_device(const std::string& name) {
  if (name == "auto") return at::hasCUDA() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  try {
    at::Device device(name);
    LOOM_CHECK_AS(InputError, device.is_cpu() || device.is_cuda(), "--device '", name,
                  "': expected auto, cpu, cuda or cuda:N");
    LOOM_CHECK_AS(InputError, device.is_cpu() || at::hasCUDA(), "--device ", name,
                  ": no CUDA device is available (use --device cpu)");
    return device;
  } catch (const c10::Error&) {
    LOOM_THROW(InputError, "--device '", name, "': expected auto, cpu, cuda or cuda:N");
  }
}

at::ScalarType pick_dtype(const std::string& name) {
  static const std::map<std::string, at::ScalarType> types = {
      {"float32", at::kFloat}, {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}};
  auto it = types.find(name);
  LOOM_CHECK_AS(InputError, it != types.end(), "--dtype '", name,
                "': expected float32, bfloat16 or float16");
  return it->second;
}

struct Plan {
  models::llama::LlamaArgs args;
  std::optional<std::string> tokenizer;
};

// Shape and tokenizer of a native step folder, from its config.toml or the flags.
Plan native_plan(const std::string& step, const ModelSource& source,
                 checkpoint::CheckpointReader& reader) {
  Plan plan;
  std::string flavor;
  const std::string config_path = step + "/config.toml";
  if (fs::exists(config_path)) {
    const auto job = config::load_job_config(config_path, {}).config;
    LOOM_CHECK_AS(InputError, job.model.name == "llama3", config_path, ": model.name '",
                  job.model.name, "' is not supported for inference (llama3 only)");
    flavor = source.flavor.value_or(job.model.flavor);
    plan.tokenizer = job.model.tokenizer_path.value_or("byte");
    plan.args.max_seq_len = job.training.seq_len;
  } else {
    LOOM_CHECK_AS(InputError, source.flavor.has_value(), "checkpoint '", step,
                  "' has no config.toml, so its model shape and tokenizer are unknown: pass "
                  "--flavor NAME (llama3: ",
                  flavor_names(), ") and --tokenizer PATH (and --max-seq-len N for its context)");
    flavor = *source.flavor;
  }
  const auto& flavors = models::llama::llama3_flavors();
  LOOM_CHECK_AS(InputError, flavors.count(flavor), "unknown llama3 flavor '", flavor,
                "' (known: ", flavor_names(), ")");
  const int64_t context = plan.args.max_seq_len;
  plan.args = flavors.at(flavor);
  if (fs::exists(config_path)) plan.args.max_seq_len = context;
  LOOM_CHECK_AS(InputError, reader.has("model.tok_embeddings.weight"), "checkpoint '", step,
                "' holds no model.tok_embeddings.weight: not a model checkpoint");
  plan.args.vocab_size = reader.global_shape("model.tok_embeddings.weight").at(0);
  return plan;
}

void load_native(InferenceModel& out, checkpoint::CheckpointReader& reader) {
  at::NoGradGuard no_grad;
  for (const auto& item : out.model->named_parameters()) {
    const std::string fqn = "model." + item.key();
    LOOM_CHECK_AS(InputError, reader.has(fqn), "checkpoint '", out.step_folder, "' lacks ", fqn,
                  " (a different model or flavor?)");
    const auto shape = reader.global_shape(fqn);
    LOOM_CHECK_AS(InputError, shape == item.value().sizes().vec(), "checkpoint '",
                  out.step_folder, "': ", fqn, " has shape ", at::IntArrayRef(shape),
                  ", the model expects ", item.value().sizes(), " (a different flavor?)");
    checkpoint::LocalChunk request;
    request.fqn = fqn;
    request.global_shape = shape;
    request.offsets.assign(shape.size(), 0);
    request.tensor = item.value();
    reader.read(request);
  }
}

void load_hf(InferenceModel& out, const std::string& folder) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> weights;
  for (auto& chunk : checkpoint::read_hf_weights(folder)) weights[chunk.fqn] = chunk.tensor;
  for (const auto& item : out.model->named_parameters()) {
    auto it = weights.find(item.key());
    LOOM_CHECK_AS(InputError, it != weights.end(), "'", folder, "' lacks the weight of ",
                  checkpoint::hf_name(item.key()));
    LOOM_CHECK_AS(InputError, it->second.sizes() == item.value().sizes(), "'", folder, "': ",
                  checkpoint::hf_name(item.key()), " has shape ", it->second.sizes(),
                  ", config.json implies ", item.value().sizes());
    item.value().copy_(it->second);
  }
}

}  // namespace

std::string resolve_step_folder(const std::string& path) {
  LOOM_CHECK_AS(InputError, fs::exists(path), "checkpoint '", path, "' does not exist");
  LOOM_CHECK_AS(InputError, fs::is_directory(path), "checkpoint '", path, "' is not a folder");
  if (fs::exists(path + "/index.json") || fs::exists(path + "/COMPLETE")) {
    LOOM_CHECK_AS(InputError, checkpoint::is_complete_step(path), "checkpoint '", path,
                  "' is incomplete (no COMPLETE marker: its save did not finish); use an earlier "
                  "step");
    return path;
  }
  for (const std::string& folder : {path, path + "/checkpoint"}) {
    if (!fs::is_directory(folder)) continue;
    auto steps = checkpoint::complete_steps(folder);
    if (!steps.empty()) return steps.front().second;
  }
  LOOM_THROW(InputError, "'", path,
             "' holds no complete checkpoint: expected a step-N folder (index.json and a "
             "COMPLETE marker), a folder of them, a run folder with checkpoint/, or a Hugging "
             "Face folder (config.json and model.safetensors)");
}

at::Tensor InferenceModel::forward(const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model->forward(tokens.to(device()));
}

InferenceModel load_inference_model(const ModelSource& source) {
  const at::Device device = pick_device(source.device);
  const at::ScalarType dtype = pick_dtype(source.dtype);
  InferenceModel out;
  Plan plan;
  std::unique_ptr<checkpoint::CheckpointReader> reader;
  const bool hf = fs::is_directory(source.checkpoint) && checkpoint::is_hf_folder(source.checkpoint);
  if (hf) {
    out.step_folder = source.checkpoint;
    out.format = "huggingface";
    plan.args = checkpoint::read_hf_config(source.checkpoint);
    if (fs::exists(source.checkpoint + "/tokenizer.json")) {
      plan.tokenizer = source.checkpoint + "/tokenizer.json";
    }
  } else {
    out.step_folder = resolve_step_folder(source.checkpoint);
    out.format = "loom";
    reader = std::make_unique<checkpoint::CheckpointReader>(out.step_folder);
    plan = native_plan(out.step_folder, source, *reader);
  }
  if (source.tokenizer) plan.tokenizer = source.tokenizer;
  LOOM_CHECK_AS(InputError, plan.tokenizer.has_value(), "'", out.step_folder,
                "' has no tokenizer.json: pass --tokenizer PATH (a tokenizer.json, .tiktoken, "
                "brown_bpe or byte)");
  if (source.max_seq_len) plan.args.max_seq_len = *source.max_seq_len;
  LOOM_CHECK_AS(InputError, plan.args.max_seq_len > 0, "--max-seq-len must be positive");

  out.tokenizer = data::load_tokenizer(*plan.tokenizer);
  LOOM_CHECK_AS(InputError, out.tokenizer->vocab_size() <= plan.args.vocab_size, "tokenizer '",
                *plan.tokenizer, "' has ", out.tokenizer->vocab_size(),
                " tokens, more than the model's embedding (", plan.args.vocab_size,
                "): a different tokenizer than the model was trained with?");
  out.model = models::llama::Transformer(plan.args, at::TensorOptions().dtype(dtype).device(device));
  out.dtype = source.dtype;
  if (hf) {
    load_hf(out, source.checkpoint);
  } else {
    load_native(out, *reader);
  }
  for (auto& p : out.model->parameters()) p.set_requires_grad(false);
  out.model->init_freqs_cis(device);
  out.model->eval();
  return out;
}

std::string InferenceModel::describe() const {
  return fmt::format("loaded {} ({} checkpoint, {} on {}, context {} tokens)", step_folder, format,
                     dtype, device().str(), context());
}

}  // namespace loom::generate
