#include "loom/checkpoint/hf.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/manager.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/config/loader.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/core/strings.h"
#include "loom/data/tokenizer.h"
#include "loom/models/llama/args.h"
#include "state_io.h"

namespace loom::checkpoint {
namespace fs = std::filesystem;
namespace {

// (loom suffix, HF suffix) inside layer N.
const std::vector<std::pair<std::string, std::string>>& layer_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"}};
  return names;
}

const std::vector<std::pair<std::string, std::string>>& top_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"tok_embeddings.weight", "model.embed_tokens.weight"},
      {"norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"}};
  return names;
}

std::string map_name(const std::string& name, bool to_hf) {
  for (const auto& [loom, hf] : top_names()) {
    if (name == (to_hf ? loom : hf)) return to_hf ? hf : loom;
  }
  static const std::regex loom_layer("layers\\.([0-9]+)\\.(.+)");
  static const std::regex hf_layer("model\\.layers\\.([0-9]+)\\.(.+)");
  std::smatch match;
  if (std::regex_match(name, match, to_hf ? loom_layer : hf_layer)) {
    for (const auto& [loom, hf] : layer_names()) {
      if (match[2].str() == (to_hf ? loom : hf)) {
        return (to_hf ? "model.layers." : "layers.") + match[1].str() + "." + (to_hf ? hf : loom);
      }
    }
  }
  LOOM_THROW(InputError, "tensor '", name, "' has no ", to_hf ? "Hugging Face" : "loom",
             " Llama counterpart");
}

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

}  // namespace

at::Tensor permute_rotary_rows(const at::Tensor& weight, int64_t heads, bool to_hf) {
  LOOM_CHECK_AS(InputError, weight.dim() == 2 && heads >= 1, "a q/k projection must be a matrix ",
                "of at least one head, got shape ", weight.sizes(), " and ", heads, " heads");
  const int64_t rows = weight.size(0);
  LOOM_CHECK_AS(InputError, rows % (2 * heads) == 0, "a q/k projection of ", rows,
                " rows cannot hold ", heads, " heads of even size");
  const int64_t half = rows / heads / 2;
  at::Tensor w = to_hf ? weight.reshape({heads, half, 2, weight.size(1)})
                       : weight.reshape({heads, 2, half, weight.size(1)});
  return w.transpose(1, 2).reshape({rows, weight.size(1)}).contiguous();
}

std::string hf_name(const std::string& name) {
  return map_name(name, true);
}
std::string loom_name(const std::string& name) {
  return map_name(name, false);
}

void export_to_hf(const std::string& step_path, const std::string& output,
                  const HfExportOptions& options) {
  const std::string& dtype = options.dtype;
  const uint64_t max_shard_bytes = options.max_shard_bytes;
  const std::string step = resolve_step(step_path);
  const auto type = detail::export_type(dtype);
  const std::string config_path = step + "/config.toml";
  LOOM_CHECK_AS(InputError, fs::exists(config_path), "checkpoint '", step,
                "' has no config.toml: its model arguments are unknown");
  const auto job = config::load_job_config(config_path, {}).config;
  LOOM_CHECK_AS(InputError, job.model.name == "llama3", "export --to hf supports llama3 models, '",
                step, "' holds a ", job.model.name);
  const auto& flavors = models::llama::llama3_flavors();
  LOOM_CHECK_AS(InputError, flavors.count(job.model.flavor), "unknown llama3 flavor '",
                job.model.flavor, "' in ", config_path);
  models::llama::LlamaArgs args = flavors.at(job.model.flavor);
  CheckpointReader reader(step);
  args.vocab_size = reader.global_shape("model.tok_embeddings.weight").at(0);

  prepare_export_folder(output, options.overwrite);
  std::vector<NamedTensors> shards(1);
  std::vector<uint64_t> shard_bytes(1, 0);
  uint64_t total = 0;
  for (const auto& fqn : reader.tensor_names()) {
    if (fqn.rfind("model.", 0) != 0) continue;
    const std::string name = fqn.substr(6);
    at::Tensor t = reader.read_whole(fqn).to(type);
    if (strings::ends_with(name, "attention.wq.weight"))
      t = permute_rotary_rows(t, args.n_heads, true);
    if (strings::ends_with(name, "attention.wk.weight"))
      t = permute_rotary_rows(t, args.kv_heads(), true);
    const auto bytes = static_cast<uint64_t>(t.nbytes());
    if (shard_bytes.back() > 0 && shard_bytes.back() + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes.push_back(0);
    }
    shards.back().emplace_back(hf_name(name), t);
    shard_bytes.back() += bytes;
    total += bytes;
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
  nlohmann::json config = hf_config_json(args, dtype);
  export_tokenizer_to_hf(
      options.tokenizer.value_or(
          data::tokenizer_location(job.model.tokenizer_path, job.model.hf_assets_path)),
      args.max_seq_len, output, config);
  files::write_atomic(output + "/config.json", config.dump(2));
}

bool is_hf_folder(const std::string& folder) {
  return fs::exists(folder + "/config.json") &&
         (fs::exists(folder + "/model.safetensors") ||
          fs::exists(folder + "/model.safetensors.index.json"));
}

models::llama::LlamaArgs read_hf_config(const std::string& hf_folder) {
  const std::string path = hf_folder + "/config.json";
  return llama_args_from_hf_config(json::read_file_strict(path, "Hugging Face config"), path);
}

std::vector<LocalChunk> read_hf_weights(const std::string& hf_folder) {
  const auto config = detail::read_json(hf_folder + "/config.json");
  const std::string config_path = hf_folder + "/config.json";
  const int64_t heads = json::int_field(config, "num_attention_heads", config_path, 1, 1 << 20);
  const int64_t kv_heads =
      config.contains("num_key_value_heads")
          ? json::int_field(config, "num_key_value_heads", config_path, 1, heads)
          : heads;
  const bool tied = config.contains("tie_word_embeddings") &&
                    json::bool_field(config, "tie_word_embeddings", config_path);
  std::vector<std::string> files;
  if (fs::exists(hf_folder + "/model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    const std::string index_path = hf_folder + "/model.safetensors.index.json";
    const auto index = detail::read_json(index_path);
    std::set<std::string> unique;
    const auto& weight_map = json::object_field(index, "weight_map", index_path);
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      LOOM_CHECK_AS(InputError, it.value().is_string(), index_path, ": weight_map['", it.key(),
                    "'] must be a file name");
      const auto file = it.value().get<std::string>();
      LOOM_CHECK_AS(InputError, files::is_contained_relative_path(file), index_path,
                    ": weight_map['", it.key(), "'] = '", file,
                    "' lies outside the folder (absolute, empty or with '..')");
      unique.insert(file);
    }
    files.assign(unique.begin(), unique.end());
  }
  std::vector<LocalChunk> chunks;
  at::Tensor embedding;
  std::set<std::string> imported;
  for (const auto& file : files) {
    auto loaded = load_safetensors(hf_folder + "/" + file);
    for (auto& [name, tensor] : loaded.tensors) {
      if (strings::ends_with(name, "rotary_emb.inv_freq")) continue;  // a buffer, not a weight
      std::string loom = loom_name(name);
      LOOM_CHECK_AS(InputError, imported.insert(loom).second, hf_folder, "/", file, ": tensor '",
                    name, "' is also in another file of the folder");
      at::Tensor t = tensor;
      if (strings::ends_with(loom, "attention.wq.weight")) t = permute_rotary_rows(t, heads, false);
      if (strings::ends_with(loom, "attention.wk.weight"))
        t = permute_rotary_rows(t, kv_heads, false);
      if (loom == "tok_embeddings.weight") embedding = t;
      chunks.push_back(whole_chunk(loom, t));
    }
  }
  if (tied && embedding.defined()) {
    auto head = std::find_if(chunks.begin(), chunks.end(),
                             [](const LocalChunk& c) { return c.fqn == "output.weight"; });
    if (head == chunks.end()) {
      chunks.push_back(whole_chunk("output.weight", embedding.clone()));
    } else {
      LOOM_CHECK_AS(InputError, at::equal(head->tensor, embedding), hf_folder,
                    "/config.json sets tie_word_embeddings, but lm_head.weight differs from "
                    "model.embed_tokens.weight (transformers would use the embedding): set "
                    "tie_word_embeddings to false or drop lm_head.weight");
    }
  }
  return chunks;
}

void import_from_hf(const std::string& hf_folder, const std::string& checkpoint_folder,
                    const std::function<void(const models::llama::LlamaArgs&)>& accept) {
  const models::llama::LlamaArgs args = read_hf_config(hf_folder);
  if (accept) accept(args);
  std::vector<LocalChunk> chunks = read_hf_weights(hf_folder);
  for (auto& chunk : chunks) chunk.fqn = "model." + chunk.fqn;
  const std::string step = checkpoint_folder + "/step-0";
  const std::string temp = step + ".tmp";
  detail::remove_step_folder(temp);  // a leftover of an import that failed
  files::create_directories(temp);
  nlohmann::json part = write_chunk_file(temp + "/rank-00000.safetensors", chunks);
  part["state"] = {{"rank", 0}, {"world_size", 1}, {"dp_rank", 0}, {"dp_size", 1}};
  files::write_atomic(temp + "/rank-00000.json", part.dump());
  nlohmann::json index = step_index({part}, {0, 1, 1, true});
  index["source"] = "huggingface:" + hf_folder;
  files::write_atomic(temp + "/index.json", index.dump(1));
  files::write_atomic(temp + "/train_state.json",
                      R"({"step": 0, "tokens_seen": 0, "lr_scheduler": {"step": 0}})");
  detail::remove_step_folder(step);
  std::error_code error;
  fs::rename(temp, step, error);
  LOOM_CHECK_AS(IoError, !error, "cannot rename '", temp, "' to '", step, "': ", error.message());
  files::sync_folder(checkpoint_folder);
  files::write_atomic(step + "/COMPLETE", "step 0\n");
}

}  // namespace loom::checkpoint
