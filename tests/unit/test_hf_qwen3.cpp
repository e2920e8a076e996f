// Qwen3 against transformers: tiny random Qwen3ForCausalLM models made by the setup venv's
// transformers inside the test (tools/make_hf_qwen3_model.py: head_dim 32 where hidden_size /
// heads is 16, grouped kv heads, q/k norms away from 1, tied and untied heads) give, loaded as
// `loom generate` and `loom eval` load a folder, transformers' logits within 1e-5 in float32;
// the same model in transformers 5's config layout gives the same logits; and import then export
// writes back exactly the folder's tensors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/generate/inference_model.h"
#include "loom/models/common/decoder_model.h"
#include "support/process.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Folders `name`/tied and `name`/untied made by transformers (one Python start for both), each
// with reference.safetensors (ids, logits).
std::string make_models(const std::string& name) {
  const std::string folder = loom::testing::fresh_temp_dir(name);
  const std::string command = std::string("'") + LOOM_PYTHON + "' '" + LOOM_SOURCE_DIR +
                              "/tools/make_hf_qwen3_model.py' '" + folder + "'";
  const auto made = loom::testing::run_command(command);
  EXPECT_EQ(made.exit_code, 0) << made.output;
  return folder;
}

std::map<std::string, at::Tensor> tensors_of(const std::string& file) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, tensor] : loom::checkpoint::load_safetensors(file).tensors) out[name] = tensor;
  return out;
}

// loom's logits for the reference ids, the folder loaded as generate/eval load it.
at::Tensor loom_logits(const std::string& folder, const at::Tensor& ids) {
  loom::generate::ModelSource source;
  source.checkpoint = folder;
  source.tokenizer = "byte";
  source.device = "cpu";
  auto model = loom::generate::load_inference_model(source);
  EXPECT_EQ(model.spec->name, "qwen3");
  return model.forward(ids);
}

void expect_transformers_logits(const std::string& folder, const std::string& what) {
  auto reference = tensors_of(folder + "/reference.safetensors");
  const at::Tensor got = loom_logits(folder, reference.at("ids"));
  const double worst = (got - reference.at("logits")).abs().max().item<double>();
  EXPECT_LT(worst, 1e-5) << what;
  std::printf("%s: max |loom - transformers| logit %.2e\n", what.c_str(), worst);
}

// The folder's config.json as transformers 5 writes it (rope_parameters, dtype).
void rewrite_in_layout5(const std::string& folder) {
  json config = json::parse(std::ifstream(folder + "/config.json"));
  const double theta = config.at("rope_theta").get<double>();
  config.erase("rope_theta");
  config.erase("rope_scaling");
  config.erase("torch_dtype");
  config["dtype"] = "float32";
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", theta}};
  config["transformers_version"] = "5.0.0";
  std::ofstream(folder + "/config.json") << config.dump(1);
}

}  // namespace

TEST(HfQwen3, LogitsEqualTransformersTiedAndUntied) {
  const std::string made = make_models("qwen3_logits");
  for (bool tied : {true, false}) {
    const std::string folder = made + (tied ? "/tied" : "/untied");
    json config = json::parse(std::ifstream(folder + "/config.json"));
    ASSERT_EQ(config.at("head_dim"), 32);
    ASSERT_EQ(config.at("hidden_size").get<int>() / config.at("num_attention_heads").get<int>(),
              16);
    expect_transformers_logits(folder, tied ? "tied" : "untied");
    rewrite_in_layout5(folder);
    expect_transformers_logits(folder, tied ? "tied, transformers 5 layout" : "untied, layout 5");
  }
}

TEST(HfQwen3, ImportThenExportIsBitwiseTheOriginal) {
  const std::string made = make_models("qwen3_round_trip");
  for (bool tied : {true, false}) {
    const std::string folder = made + (tied ? "/tied" : "/untied");
    const std::string checkpoint = loom::testing::fresh_temp_dir("qwen3_rt_ckpt");
    loom::checkpoint::import_from_hf(folder, checkpoint);
    const std::string exported = loom::testing::fresh_temp_dir("qwen3_rt_export");
    loom::checkpoint::HfExportOptions options;
    options.dtype = "float32";
    options.overwrite = true;
    loom::checkpoint::export_to_hf(checkpoint + "/step-0", exported, options);
    const auto original = tensors_of(folder + "/model.safetensors");
    const auto back = tensors_of(exported + "/model.safetensors");
    std::set<std::string> names_a, names_b;
    for (const auto& [name, t] : original) names_a.insert(name);
    for (const auto& [name, t] : back) names_b.insert(name);
    EXPECT_EQ(names_a, names_b);
    EXPECT_EQ(back.count("lm_head.weight"), tied ? 0u : 1u);
    for (const auto& [name, tensor] : original) {
      auto it = back.find(name);
      if (it == back.end()) continue;
      EXPECT_TRUE(at::equal(tensor, it->second)) << name;
    }
    const json config = json::parse(std::ifstream(exported + "/config.json"));
    EXPECT_EQ(config.at("architectures")[0], "Qwen3ForCausalLM");
    EXPECT_EQ(config.at("tie_word_embeddings"), tied);
    EXPECT_EQ(config.at("head_dim"), 32);
    // The export computes what the original does.
    fs::copy_file(folder + "/reference.safetensors", exported + "/reference.safetensors");
    expect_transformers_logits(exported, tied ? "export of the import (tied)" : "export (untied)");
  }
}
