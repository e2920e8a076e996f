#include "loom/generate/inference_model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/manager.h"
#include "loom/config/loader.h"
#include "loom/core/check.h"
#include "loom/core/device.h"
#include "loom/core/strings.h"
#include "loom/data/batch_source.h"

namespace loom::generate {
namespace fs = std::filesystem;
namespace {

at::ScalarType pick_dtype(const std::string& name) {
  static const std::map<std::string, at::ScalarType> types = {
      {"float32", at::kFloat}, {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}};
  auto it = types.find(name);
  LOOM_CHECK_AS(InputError, it != types.end(), "--dtype '", name,
                "': expected float32, bfloat16 or float16");
  return it->second;
}

// Reads every parameter of `model` whole from a native checkpoint step.
void load_native(models::CausalLM& model, const std::string& step) {
  at::NoGradGuard no_grad;
  checkpoint::CheckpointReader reader(step);
  for (const auto& item : model.module().named_parameters()) {
    const std::string fqn = "model." + item.key();
    LOOM_CHECK_AS(InputError, reader.has(fqn), "checkpoint '", step, "' lacks ", fqn,
                  " (a different model or flavor?)");
    const auto shape = reader.global_shape(fqn);
    LOOM_CHECK_AS(InputError, shape == item.value().sizes().vec(), "checkpoint '", step, "': ", fqn,
                  " has shape ", at::IntArrayRef(shape), ", the model expects ",
                  item.value().sizes(), " (a different flavor?)");
    checkpoint::LocalChunk request;
    request.fqn = fqn;
    request.global_shape = shape;
    request.offsets.assign(shape.size(), 0);
    request.tensor = item.value();
    reader.read(request);
  }
  // State buffers (a mixture's balancing bias) where the checkpoint has them: it changes routing.
  for (auto& [name, tensor] : model.named_state_buffers()) {
    const std::string fqn = "model." + name;
    if (!reader.has(fqn)) continue;
    checkpoint::LocalChunk request;
    request.fqn = fqn;
    request.global_shape = tensor.sizes().vec();
    request.offsets.assign(tensor.dim(), 0);
    request.tensor = tensor;
    reader.read(request);
  }
}

// Copies a Hugging Face folder's weights into `model` (its family's adapter names them).
void load_hf(models::CausalLM& model, const models::ModelSpec& spec, const std::string& folder) {
  at::NoGradGuard no_grad;
  auto weights = checkpoint::read_hf_weights(folder, spec, model);
  for (const auto& item : model.module().named_parameters()) {
    auto it = weights.find(item.key());
    LOOM_CHECK_AS(InputError, it != weights.end(), "'", folder, "' lacks the weight of ",
                  item.key());
    LOOM_CHECK_AS(InputError, it->second.sizes() == item.value().sizes(), "'", folder,
                  "': ", item.key(), " has shape ", it->second.sizes(), ", config.json implies ",
                  item.value().sizes());
    item.value().copy_(it->second);
    weights.erase(it);
  }
  for (auto& [name, tensor] : model.named_state_buffers()) {
    auto it = weights.find(name);
    if (it == weights.end()) continue;  // transformers starts such buffers at zero as well
    LOOM_CHECK_AS(InputError, it->second.sizes() == tensor.sizes(), "'", folder, "': ", name,
                  " has shape ", it->second.sizes(), ", config.json implies ", tensor.sizes());
    tensor.copy_(it->second);
    weights.erase(it);
  }
  LOOM_CHECK_AS(InputError, weights.empty(), "'", folder, "' holds ",
                weights.empty() ? "" : weights.begin()->first, " which the ", spec.name,
                " model has no place for");
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
  if (!block_causal) return model->forward(tokens.to(device()));
  data::Batch rows;
  rows.inputs = tokens.to(at::kCPU, at::kLong);
  data::mark_documents(rows, tokenizer->bos_id());
  models::TokenLayout layout;
  layout.documents = rows.documents.to(device());
  layout.positions = rows.positions.to(device());
  return model->forward(tokens.to(device()), layout);
}

at::Device InferenceModel::device() const {
  const auto params = model->module().parameters();
  return params.empty() ? at::Device(at::kCPU) : params.front().device();
}

InferenceModel load_inference_model(const ModelSource& source) {
  const at::Device device = device::resolve_device(source.device, 0, "--device");
  const at::ScalarType dtype = pick_dtype(source.dtype);
  LOOM_CHECK_AS(InputError, !source.max_seq_len || *source.max_seq_len > 0,
                "--max-seq-len must be positive");
  models::BuildOptions build;
  build.tensor_options = at::TensorOptions().dtype(dtype).device(device);
  build.max_seq_len = source.max_seq_len.value_or(0);
  build.num_mtp_layers = 0;  // multi-token prediction is a training objective: no depth is built
  InferenceModel out;
  checkpoint::SourcedModel sourced;
  const bool hf =
      fs::is_directory(source.checkpoint) && checkpoint::is_hf_folder(source.checkpoint);
  if (hf) {
    out.step_folder = source.checkpoint;
    out.format = "huggingface";
    // The folder's config.json says what the model is: --flavor has nothing to pick, and a
    // --model naming another family is a mistake, not an override (both were ignored).
    LOOM_CHECK_AS(InputError, !source.flavor, "--flavor ", source.flavor.value_or(""), ": '",
                  source.checkpoint,
                  "' is a Hugging Face folder, whose config.json describes the model; --flavor "
                  "applies to loom checkpoints without a config.toml");
    sourced = checkpoint::hf_model(source.checkpoint, build);
    if (source.model) {
      const auto& named = models::find_model_spec(*source.model);
      const bool alias = std::find(sourced.spec->also_named.begin(), sourced.spec->also_named.end(),
                                   *source.model) != sourced.spec->also_named.end();
      LOOM_CHECK_AS(InputError, &named == sourced.spec || alias, "--model ", *source.model, ": '",
                    source.checkpoint, "/config.json' holds a ", sourced.spec->name,
                    " model (model_type ", sourced.hf_config.value("model_type", std::string()),
                    "); drop --model or name ", sourced.spec->name);
    }
  } else {
    out.step_folder = resolve_step_folder(source.checkpoint);
    out.format = "loom";
    sourced = checkpoint::step_model(out.step_folder, build, {source.model, source.flavor});
  }
  auto tokenizer = source.tokenizer ? source.tokenizer : sourced.tokenizer;
  LOOM_CHECK_AS(InputError, tokenizer.has_value(), "'", out.step_folder,
                "' names no tokenizer: pass --tokenizer PATH (a tokenizer.json, .tiktoken, "
                "brown_bpe or byte)");
  out.spec = sourced.spec;
  out.model = std::move(sourced.model);
  out.block_causal = sourced.block_causal;
  out.tokenizer = data::load_tokenizer(*tokenizer);
  LOOM_CHECK_AS(InputError, out.tokenizer->vocab_size() <= out.model->vocab_size(), "tokenizer '",
                *tokenizer, "' has ", out.tokenizer->vocab_size(),
                " tokens, more than the model's embedding (", out.model->vocab_size(),
                "): a different tokenizer than the model was trained with?");
  out.dtype = source.dtype;
  out.model->init_buffers(device);  // before loading: the state buffers are read into it
  if (hf) {
    load_hf(*out.model, *out.spec, source.checkpoint);
  } else {
    load_native(*out.model, out.step_folder);
  }
  for (auto& p : out.model->module().parameters()) p.set_requires_grad(false);
  out.model->module().eval();
  return out;
}

std::string InferenceModel::describe() const {
  return fmt::format("loaded {} ({} checkpoint, {} on {}, context {} tokens)", step_folder, format,
                     dtype, device().str(), context());
}

}  // namespace loom::generate
