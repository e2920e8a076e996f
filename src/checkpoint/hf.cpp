#include "loom/checkpoint/hf.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/manager.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/checkpoint/safetensors_header.h"
#include "loom/config/loader.h"
#include "loom/core/check.h"
#include "loom/core/device.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/data/tokenizer.h"
#include "state_io.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
namespace {

// A step folder, or the newest complete step of a checkpoint folder.
std::string resolve_step(const std::string& path) {
  if (fs::exists(path + "/index.json")) {
    LOOM_CHECK_AS(InputError, is_complete_step(path), "checkpoint '", path,
                  "' is incomplete (no COMPLETE marker)");
    return path;
  }
  auto steps = complete_steps(path);
  LOOM_CHECK_AS(InputError, !steps.empty(), "'", path,
                "' is neither a complete checkpoint step nor a folder holding one");
  return steps.front().second;
}

// The files an export writes (so --overwrite replaces them and nothing else).
bool is_export_file(const std::string& name) {
  static const std::regex pattern(
      "model\\.safetensors|model-[0-9]+-of-[0-9]+\\.safetensors|model\\.safetensors\\.index\\.json|"
      "config\\.json|generation_config\\.json|tokenizer\\.json|tokenizer_config\\.json|"
      "special_tokens_map\\.json");
  return std::regex_match(name, pattern);
}

// An empty or new folder, or (with overwrite) one whose earlier export files are removed.
void prepare_export_folder(const std::string& output, bool overwrite) {
  std::error_code error;
  if (fs::exists(output, error) && !fs::is_empty(output, error)) {
    LOOM_CHECK_AS(InputError, fs::is_directory(output), "export: '", output,
                  "' exists and is not a folder");
    LOOM_CHECK_AS(InputError, overwrite, "export: '", output,
                  "' is not empty; pass --overwrite to replace an earlier export there, or "
                  "choose an empty folder");
    for (const auto& entry : fs::directory_iterator(output)) {
      if (entry.is_regular_file() && is_export_file(entry.path().filename().string())) {
        fs::remove(entry.path());
      }
    }
  }
  files::create_directories(output);
}

// Names of the tensors a Hugging Face folder holds: its index's weight map, or the header of its
// model.safetensors (read alone, the data untouched).
std::vector<std::string> hf_tensor_names(const std::string& folder);

// One past the highest N of the "model.layers.N.*" tensors among `names` (a Hugging Face folder's,
// or a checkpoint's, whose model tensors are named the same way).
int64_t layers_held(const std::vector<std::string>& names) {
  static const std::regex layer_name("model\\.layers\\.([0-9]{1,9})\\..*");
  int64_t held = 0;
  for (const auto& name : names) {
    std::smatch match;
    if (std::regex_match(name, match, layer_name)) {
      held = std::max<int64_t>(held, std::stoll(match[1].str()) + 1);
    }
  }
  return held;
}

// A config.json that declares more layers than the weights hold would build (and allocate)
// them all before the missing weights are noticed: refused by name first.
// Returns the layers the weights hold (model.layers.N.* for N below it).
int64_t check_layers_present(const nlohmann::json& config, const std::string& config_path,
                             const std::string& folder) {
  if (!config.is_object() || !config.contains("num_hidden_layers") ||
      !config.at("num_hidden_layers").is_number_integer()) {
    return -1;  // the family's reader names a missing or mistyped value
  }
  const auto declared = config.at("num_hidden_layers").get<int64_t>();
  const int64_t held = layers_held(hf_tensor_names(folder));
  LOOM_CHECK_AS(InputError, declared <= held, config_path, ": num_hidden_layers is ", declared,
                ", but the weights in '", folder, "' hold ", held,
                " layers (model.layers.N.*): the config does not belong to these weights");
  return held;
}

// The multi-token-prediction layers to build from a folder, unless the caller chose: those its
// weights hold after the model's, up to what its config counts. transformers writes
// num_nextn_predict_layers but saves no such layer, and a folder without them is still the model.
int64_t mtp_layers_held(const nlohmann::json& config, const models::ModelSpec& spec, int64_t held) {
  const std::string& key = spec.hf.mtp_layers_key;
  if (key.empty() || held < 0 || !config.contains(key) || !config.at(key).is_number_integer() ||
      !config.contains("num_hidden_layers") ||
      !config.at("num_hidden_layers").is_number_integer()) {
    return 0;
  }
  const int64_t declared = config.at(key).get<int64_t>();
  const int64_t extra = held - config.at("num_hidden_layers").get<int64_t>();
  return std::clamp<int64_t>(extra, 0, std::max<int64_t>(declared, 0));
}

// A model for a real device is built on the meta device first: one whose sizes cannot fit (a
// config typed wrong) is refused by name before any of it is allocated.
std::unique_ptr<models::CausalLM> build_checked(
    const std::function<std::unique_ptr<models::CausalLM>(const models::BuildOptions&)>& build,
    const models::BuildOptions& options, const std::string& source) {
  const at::Device device = options.tensor_options.device();
  // Sizes inside the config's ranges can still overflow a tensor's byte count (hidden_size 2^31
  // squared): LibTorch's error would name no file.
  auto build_named = [&](const models::BuildOptions& o) {
    try {
      return build(o);
    } catch (const c10::Error& e) {
      LOOM_THROW(InputError, "cannot build the model ", source, " describes (",
                 e.what_without_backtrace(), "): is a size in it wrong?");
    } catch (const InputError& e) {
      // The model's own checks (heads that kv heads do not divide, ...) name no file.
      const size_t close = source.find('\'', 1);  // `source` starts with the quoted path
      const std::string path =
          source.substr(1, close == std::string::npos ? std::string::npos : close - 1);
      if (e.message().find(path) != std::string::npos) throw;
      LOOM_THROW(InputError, source, ": ", e.message());
    }
  };
  if (!device.is_meta()) {
    models::BuildOptions planned = options;
    planned.tensor_options = options.tensor_options.device(at::kMeta);
    auto shape = build_named(planned);
    double bytes = 0;
    for (const auto& parameter : shape->module().parameters()) {
      bytes += static_cast<double>(parameter.numel()) *
               static_cast<double>(options.tensor_options.dtype().itemsize());
    }
    device::check_fits(bytes, device, "the weights of the model " + source + " describes",
                       "is a size in it wrong, or is the model for a larger machine?");
  }
  return build_named(options);
}

}  // namespace

// Where a step's model comes from: its config.toml, or an import's hf_config.json.
SourcedModel step_model(const std::string& step, models::BuildOptions options,
                        const StepModelOverrides& overrides) {
  CheckpointReader reader(step);
  LOOM_CHECK_AS(InputError, reader.has("model.tok_embeddings.weight"), "checkpoint '", step,
                "' holds no model.tok_embeddings.weight: not a model checkpoint");
  options.vocab_size = reader.global_shape("model.tok_embeddings.weight").at(0);
  const std::string config_path = step + "/config.toml";
  const std::string hf_config_path = step + "/hf_config.json";
  SourcedModel out;
  if (!overrides.flavor && !fs::exists(config_path) && fs::exists(hf_config_path)) {
    out.hf_config = json::read_file_strict(hf_config_path, "Hugging Face config");
    out.spec = &models::find_hf_model_spec(out.hf_config, hf_config_path);
    if (options.num_mtp_layers < 0) {
      // What the import brought (config.json may count layers the folder did not hold).
      options.num_mtp_layers =
          mtp_layers_held(out.hf_config, *out.spec, layers_held(reader.tensor_names()));
    }
    LOOM_CHECK_AS(InputError, !overrides.name || *overrides.name == out.spec->name, "checkpoint '",
                  step, "' holds a ", out.spec->name, " model (", hf_config_path, "), not ",
                  *overrides.name);
    out.model = build_checked(
        [&](const models::BuildOptions& o) {
          return out.spec->hf.build_from_config(out.hf_config, hf_config_path, o);
        },
        options, "'" + hf_config_path + "'");
    return out;
  }
  std::optional<std::string> name = overrides.name, flavor = overrides.flavor;
  if (fs::exists(config_path)) {
    const auto job = config::load_job_config(config_path, {}).config;
    if (!name) name = job.model.name;
    if (!flavor) flavor = job.model.flavor;
    out.block_causal = job.model.attn_mask_type == "block_causal";
    out.tokenizer = data::tokenizer_location(job.model.tokenizer_path, job.model.hf_assets_path);
    if (options.max_seq_len <= 0) options.max_seq_len = job.training.seq_len;
    options.trained_seq_len = job.training.seq_len;
    if (options.num_mtp_layers < 0) options.num_mtp_layers = job.model.num_mtp_layers;
  }
  LOOM_CHECK_AS(InputError, name && flavor, "checkpoint '", step,
                "' has no config.toml, so its model is unknown: pass --model NAME and --flavor "
                "FLAVOR (known models: ",
                strings::join(models::model_names(), ", "),
                "), with --tokenizer PATH and --max-seq-len N for its tokenizer and context");
  out.spec = &models::find_model_spec(*name, *flavor);
  options.flavor = *flavor;
  out.model =
      build_checked(out.spec->build, options, "'" + step + "' (" + *name + " " + *flavor + ")");
  return out;
}

SourcedModel hf_model(const std::string& hf_folder, const models::BuildOptions& options) {
  const std::string path = hf_folder + "/config.json";
  SourcedModel out;
  out.hf_config = json::read_file_strict(path, "Hugging Face config");
  out.spec = &models::find_hf_model_spec(out.hf_config, path);
  const int64_t held = check_layers_present(out.hf_config, path, hf_folder);
  models::BuildOptions build = options;
  if (build.num_mtp_layers < 0) {
    build.num_mtp_layers = mtp_layers_held(out.hf_config, *out.spec, held);
  }
  out.model = build_checked(
      [&](const models::BuildOptions& o) {
        return out.spec->hf.build_from_config(out.hf_config, path, o);
      },
      build, "'" + path + "'");
  if (fs::exists(hf_folder + "/tokenizer.json")) out.tokenizer = hf_folder + "/tokenizer.json";
  return out;
}

void export_to_hf(const std::string& step_path, const std::string& output,
                  const HfExportOptions& options) {
  const std::string step = resolve_step(step_path);
  const auto type = detail::export_type(options.dtype);
  models::BuildOptions build;
  build.tensor_options = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  const SourcedModel source = step_model(step, build);
  const auto adapter = source.spec->hf.adapter(*source.model);
  std::set<std::string> wanted;
  for (const auto& item : source.model->module().named_parameters()) wanted.insert(item.key());

  CheckpointReader reader(step);
  // Model state that is not a parameter (a MoE layer's balancing bias) goes through the adapter
  // too, which maps it or leaves it out (with a warning where that changes the model).
  for (const auto& fqn : reader.tensor_names()) {
    if (fqn.rfind("model.", 0) == 0) wanted.insert(fqn.substr(6));
  }
  prepare_export_folder(output, options.overwrite);
  std::vector<NamedTensors> shards(1);
  std::vector<uint64_t> shard_bytes(1, 0);
  uint64_t total = 0;
  for (const auto& name : wanted) {
    const std::string fqn = "model." + name;
    LOOM_CHECK_AS(InputError, reader.has(fqn), "checkpoint '", step, "' lacks ", fqn,
                  " (its config describes another model?)");
    // Routing state stays float32 (its 1e-3 steps would round away in bfloat16), as DeepSeek's
    // own files keep e_score_correction_bias.
    const bool state =
        name.size() > 16 && name.compare(name.size() - 16, 16, ".moe.expert_bias") == 0;
    const at::Tensor whole = reader.read_whole(fqn);
    for (auto& [hf, tensor] : adapter->to_hf(name, state ? whole : whole.to(type))) {
      const auto bytes = static_cast<uint64_t>(tensor.nbytes());
      if (shard_bytes.back() > 0 && shard_bytes.back() + bytes > options.max_shard_bytes) {
        shards.emplace_back();
        shard_bytes.push_back(0);
      }
      shards.back().emplace_back(hf, tensor);
      shard_bytes.back() += bytes;
      total += bytes;
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    save_safetensors(output + "/model.safetensors", shards[0], metadata);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      save_safetensors(output + "/" + name, shards[i], metadata);
      for (const auto& [tensor, _] : shards[i]) weight_map[tensor] = name;
    }
    files::write_atomic(
        output + "/model.safetensors.index.json",
        nlohmann::json({{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}})
            .dump(2));
  }
  nlohmann::json config = adapter->hf_config(options.dtype);
  const auto tokenizer = options.tokenizer ? options.tokenizer : source.tokenizer;
  if (tokenizer) {
    export_tokenizer_to_hf(*tokenizer, source.model->max_seq_len(), output, config);
  } else {
    log::get("checkpoint")
        ->warn("export: '{}' names no tokenizer (an import?): pass --tokenizer to ship one", step);
  }
  files::write_atomic(output + "/config.json", config.dump(2));
}

bool is_hf_folder(const std::string& folder) {
  return fs::exists(folder + "/config.json") &&
         (fs::exists(folder + "/model.safetensors") ||
          fs::exists(folder + "/model.safetensors.index.json"));
}

namespace {

// The safetensors files of a folder: model.safetensors, or those its index names.
std::vector<std::string> weight_files(const std::string& hf_folder) {
  if (fs::exists(hf_folder + "/model.safetensors")) return {"model.safetensors"};
  const std::string index_path = hf_folder + "/model.safetensors.index.json";
  const auto index = detail::read_json(index_path);
  std::set<std::string> unique;
  const auto& weight_map = json::object_field(index, "weight_map", index_path);
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    LOOM_CHECK_AS(InputError, it.value().is_string(), index_path, ": weight_map['", it.key(),
                  "'] must be a file name");
    const auto file = it.value().get<std::string>();
    LOOM_CHECK_AS(InputError, files::is_contained_relative_path(file), index_path, ": weight_map['",
                  it.key(), "'] = '", file,
                  "' lies outside the folder (absolute, empty or with '..')");
    unique.insert(file);
  }
  return {unique.begin(), unique.end()};
}

std::vector<std::string> hf_tensor_names(const std::string& folder) {
  std::vector<std::string> names;
  const std::string index_path = folder + "/model.safetensors.index.json";
  if (!fs::exists(folder + "/model.safetensors") && fs::exists(index_path)) {
    const auto index = detail::read_json(index_path);
    for (const auto& item : json::object_field(index, "weight_map", index_path).items()) {
      names.push_back(item.key());
    }
    return names;
  }
  for (const auto& entry : read_safetensors_header(folder + "/model.safetensors").tensors) {
    names.push_back(entry.name);
  }
  return names;
}

}  // namespace

std::map<std::string, at::Tensor> read_hf_weights(const std::string& hf_folder,
                                                  const models::ModelSpec& spec,
                                                  const models::CausalLM& model) {
  const std::string config_path = hf_folder + "/config.json";
  const auto config = json::read_file_strict(config_path, "Hugging Face config");
  const auto adapter = spec.hf.adapter(model);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& file : weight_files(hf_folder)) {
    auto loaded = load_safetensors(hf_folder + "/" + file);
    for (auto& [name, tensor] : loaded.tensors) {
      // A stored integer where a weight belongs is another file, not a weight to convert; MXFP4
      // blocks and scales (gpt-oss's experts) are bytes the family's adapter dequantizes.
      const bool mxfp4 =
          tensor.scalar_type() == at::kByte &&
          (strings::ends_with(name, "_blocks") || strings::ends_with(name, "_scales"));
      LOOM_CHECK_AS(InputError, mxfp4 || at::isFloatingType(tensor.scalar_type()), hf_folder, "/",
                    file, ": tensor '", name, "' is stored as ", tensor.scalar_type(),
                    "; model weights are floating point (F32, BF16, F16), or MXFP4 uint8 "
                    "_blocks and _scales");
      auto converted = adapter->from_hf(name, tensor);
      if (!converted) continue;
      LOOM_CHECK_AS(InputError, tensors.emplace(converted->first, converted->second).second,
                    hf_folder, "/", file, ": tensor '", name,
                    "' is also in another file of the folder");
    }
  }
  adapter->finish_import(tensors, config, hf_folder);
  return tensors;
}

namespace {

// What a folder must hold for `model`: every parameter, and every buffer the family reads from
// Hugging Face (DeepSeek's routing bias; not Qwen3-MoE's, which transformers has none of).
// Returns "loom name (hf name)" for each missing one.
std::vector<std::string> missing_weights(const models::CausalLM& model,
                                         const models::StateDictAdapter& adapter,
                                         const std::set<std::string>& read) {
  std::vector<std::string> missing;
  auto note = [&](const std::string& name,
                  const std::vector<std::pair<std::string, at::Tensor>>& hf) {
    missing.push_back(name + (hf.empty() ? std::string() : " (" + hf.front().first + ")"));
  };
  auto& module = const_cast<models::CausalLM&>(model).module();
  for (const auto& item : module.named_parameters()) {
    if (!read.count(item.key())) note(item.key(), adapter.to_hf(item.key(), item.value()));
  }
  for (const auto& [name, tensor] : const_cast<models::CausalLM&>(model).named_state_buffers()) {
    if (read.count(name)) continue;
    const auto hf = adapter.to_hf(name, at::zeros(tensor.sizes(), at::kFloat));
    if (!hf.empty()) note(name, hf);
  }
  return missing;
}

}  // namespace

void import_from_hf(const std::string& hf_folder, const std::string& checkpoint_folder,
                    const std::function<void(const SourcedModel&)>& accept,
                    const models::CausalLM* target, bool overwrite) {
  const std::string step = checkpoint_folder + "/step-0";
  LOOM_CHECK_AS(InputError, overwrite || !fs::exists(step), "checkpoint import: '", step,
                "' already exists (it may be a training run's first checkpoint); pass "
                "--overwrite to replace it, or import into another folder");
  models::BuildOptions build;
  build.tensor_options = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  const SourcedModel source = hf_model(hf_folder, build);
  if (accept) accept(source);
  const models::CausalLM& model = target ? *target : *source.model;
  std::vector<LocalChunk> chunks;
  // Each weight's shape as config.json implies it (the model is built from it on the meta
  // device): a checkpoint written with another shape would only fail when it is loaded.
  std::map<std::string, std::vector<int64_t>> wanted;
  for (const auto& item : const_cast<models::CausalLM&>(model).module().named_parameters()) {
    wanted[item.key()] = item.value().sizes().vec();
  }
  for (const auto& [name, tensor] : const_cast<models::CausalLM&>(model).named_state_buffers()) {
    wanted[name] = tensor.sizes().vec();
  }
  std::set<std::string> read;
  for (auto& [name, tensor] : read_hf_weights(hf_folder, *source.spec, model)) {
    const auto place = wanted.find(name);
    LOOM_CHECK_AS(InputError, place != wanted.end(), hf_folder, ": tensor '", name,
                  "' has no place in the ", source.spec->name, " model");
    LOOM_CHECK_AS(InputError, tensor.sizes().vec() == place->second, hf_folder, ": ", name,
                  " has shape ", tensor.sizes(), ", config.json implies ",
                  at::IntArrayRef(place->second), "; nothing was written");
    LOOM_CHECK_AS(InputError,
                  !tensor.is_floating_point() || at::isfinite(tensor).all().item<bool>(), hf_folder,
                  ": tensor '", name, "' holds NaN or Inf; loom imports finite weights");
    read.insert(name);
    chunks.push_back(whole_chunk("model." + name, tensor));
  }
  const auto missing = missing_weights(model, *source.spec->hf.adapter(model), read);
  LOOM_CHECK_AS(InputError, missing.empty(), hf_folder, ": the ", source.spec->name,
                " model needs weights the folder does not hold: ", strings::join(missing, ", "),
                "; nothing was written");
  const std::string temp = step + ".tmp";
  detail::remove_step_folder(temp);  // a leftover of an import that failed
  files::create_directories(temp);
  nlohmann::json part = write_chunk_file(temp + "/rank-00000.safetensors", chunks);
  part["state"] = {{"rank", 0}, {"world_size", 1}, {"dp_rank", 0}, {"dp_size", 1}};
  files::write_atomic(temp + "/rank-00000.json", part.dump());
  StepHeader header;
  header.model_only = true;  // step 0 of one writer: the weights alone
  nlohmann::json index = step_index({part}, header);
  index["source"] = "huggingface:" + hf_folder;
  files::write_atomic(temp + "/index.json", index.dump(1));
  files::write_atomic(temp + "/hf_config.json", source.hf_config.dump(2));
  files::write_atomic(temp + "/train_state.json",
                      R"({"step": 0, "tokens_seen": 0, "lr_scheduler": {"step": 0}})");
  detail::remove_step_folder(step);
  std::error_code error;
  fs::rename(temp, step, error);
  LOOM_CHECK_AS(IoError, !error, "cannot rename '", temp, "' to '", step, "': ", error.message());
  files::sync_folder(checkpoint_folder);
  files::write_atomic(step + "/COMPLETE", "step 0\n");
}

std::vector<std::string> arithmetic_differences(const nlohmann::json& a, const nlohmann::json& b) {
  static const std::set<std::string> inert = {"vocab_size",           "max_position_embeddings",
                                              "torch_dtype",          "dtype",
                                              "tie_word_embeddings",  "architectures",
                                              "transformers_version", "bos_token_id",
                                              "eos_token_id",         "pad_token_id",
                                              "_name_or_path",        "use_cache",
                                              "initializer_range",    "attention_dropout"};
  std::set<std::string> keys;
  for (const auto& [key, value] : a.items()) keys.insert(key);
  for (const auto& [key, value] : b.items()) keys.insert(key);
  std::vector<std::string> out;
  for (const auto& key : keys) {
    if (inert.count(key)) continue;
    const nlohmann::json x = a.value(key, nlohmann::json()), y = b.value(key, nlohmann::json());
    if (x != y) out.push_back(key + ": " + x.dump() + " vs " + y.dump());
  }
  return out;
}

}  // namespace loom::checkpoint
