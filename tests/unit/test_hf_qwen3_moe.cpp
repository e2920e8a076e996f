// Qwen3-MoE against transformers. Tiny random Qwen3MoeForCausalLM models made by the setup venv's
// transformers inside the test (tools/make_hf_qwen3_moe_model.py), and its `normed` variant saved
// once by transformers 5.25 (tests/data/hf_qwen3_moe/transformers5: num_local_experts instead of
// num_experts, rope_parameters, dtype): 8 experts, top 2, gates
// renormalized or not, dense layers among the mixtures by mlp_only_layers and by
// decoder_sparse_step. Checked: the first MoE block alone and the whole model's logits within
// 1e-5 of transformers' in float32, greedy tokens with the KV cache equal to generate(), and
// import then export writes back exactly the folder's per-expert tensors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/generate/generator.h"
#include "loom/generate/inference_model.h"
#include "loom/models/common/decoder_model.h"
#include "support/process.h"
#include "unit/hf_test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
namespace test_hf_qwen3_moe {  // its own names in a unity batch

using loom::testing::row_of;
using loom::testing::tensors_of;

loom::generate::InferenceModel load(const std::string& folder) {
  return loom::testing::load_hf_folder(folder, "qwen3_moe");
}

const std::string kTransformers5Normed =
    std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_qwen3_moe/transformers5/normed";

// normed and plain by the venv's transformers 4, then normed by transformers 5.
std::vector<std::string> folders() {
  auto made = loom::testing::made_by_transformers("make_hf_qwen3_moe_model.py", "qwen3_moe_models",
                                                  {"normed", "plain"});
  made.push_back(kTransformers5Normed);
  return made;
}

// The expert count under either spelling (transformers 4: num_experts, 5: num_local_experts).
json expert_count(const json& config) {
  return config.contains("num_experts") ? config.at("num_experts") : config.at("num_local_experts");
}

TEST(HfQwen3Moe, LayersAreMixturesWhereTransformersPutsThem) {
  const std::vector<std::vector<bool>> want = {
      {true, false, true}, {false, true, false, true}, {true, false, true}};
  for (size_t v = 0; v < want.size(); ++v) {
    auto model = load(folders()[v]);
    auto& decoder = dynamic_cast<loom::models::DecoderModel&>(*model.model);
    const auto& blocks = decoder.transformer()->blocks;
    ASSERT_EQ(blocks.size(), want[v].size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_EQ(static_cast<bool>(blocks[i]->moe), want[v][i]) << folders()[v] << " layer " << i;
      EXPECT_NE(static_cast<bool>(blocks[i]->feed_forward), want[v][i]);
    }
    EXPECT_EQ(decoder.args().moe->route_norm, v != 1);
    EXPECT_EQ(decoder.args().moe->num_experts, 8) << folders()[v];
  }
}

TEST(HfQwen3Moe, MoEBlockAndLogitsEqualTransformers) {
  for (const std::string& folder : folders()) {
    auto reference = tensors_of(folder + "/reference.safetensors");
    auto model = load(folder);
    auto& decoder = dynamic_cast<loom::models::DecoderModel&>(*model.model);
    auto& block = decoder.transformer()->blocks.at(reference.at("block_layer").item<int64_t>());
    ASSERT_TRUE(block->moe);
    at::Tensor block_out;
    {
      at::NoGradGuard no_grad;
      block_out = block->moe->forward(reference.at("block_in"));
    }
    const double block_worst = (block_out - reference.at("block_out")).abs().max().item<double>();
    EXPECT_LT(block_worst, 1e-5) << folder;
    const at::Tensor logits = model.forward(reference.at("ids"));
    ASSERT_EQ(logits.sizes(), reference.at("logits").sizes());
    const double worst = (logits - reference.at("logits")).abs().max().item<double>();
    EXPECT_LT(worst, 1e-5) << folder;
    std::printf("%s: max |loom - transformers| MoE block %.2e, logits %.2e\n", folder.c_str(),
                block_worst, worst);
    // The check sees routing: the block's output moves when the gates stop being renormalized.
    auto& moe = block->moe;
    moe->router->args.route_norm = !moe->router->args.route_norm;
    at::NoGradGuard no_grad;
    const double flipped = (moe->forward(reference.at("block_in")) - reference.at("block_out"))
                               .abs()
                               .max()
                               .item<double>();
    EXPECT_GT(flipped, 1e-2) << folder;
  }
}

TEST(HfQwen3Moe, GreedyTokensWithTheCacheEqualTransformers) {
  for (const std::string& folder : folders()) {
    auto reference = tensors_of(folder + "/reference.safetensors");
    const std::vector<int32_t> want = row_of(reference.at("greedy"));
    auto model = load(folder);
    EXPECT_EQ(loom::testing::greedy_tokens(model, reference), want) << folder;
    EXPECT_GT(std::set<int32_t>(want.begin(), want.end()).size(), 4u) << folder;
  }
}

TEST(HfQwen3Moe, ImportThenExportIsBitwiseTheOriginal) {
  for (const std::string& folder : folders()) {
    const std::string exported = loom::testing::expect_import_export_bitwise(folder, "qwen3_moe");
    const json config = json::parse(std::ifstream(exported + "/config.json"));
    const json source = json::parse(std::ifstream(folder + "/config.json"));
    EXPECT_EQ(config.at("architectures")[0], "Qwen3MoeForCausalLM");
    EXPECT_EQ(expert_count(config), expert_count(source)) << folder;
    for (const char* key : {"num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                            "decoder_sparse_step", "mlp_only_layers"}) {
      EXPECT_EQ(config.at(key), source.at(key)) << folder << ": " << key;
    }
  }
}

// transformers 5 saves the expert count as num_local_experts; a file without either spelling is
// refused rather than read as Qwen3MoeConfig's 128 experts, and two spellings must agree.
TEST(HfQwen3Moe, TheExpertCountIsReadUnderEitherSpellingAndNeverGuessed) {
  const json saved = json::parse(std::ifstream(kTransformers5Normed + "/config.json"));
  ASSERT_FALSE(saved.contains("num_experts"));
  ASSERT_EQ(saved.at("num_local_experts"), 8);
  const auto& spec = loom::models::find_model_spec("qwen3_moe");
  auto message = [&](const json& config) {
    try {
      loom::models::BuildOptions meta;
      meta.tensor_options = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
      spec.hf.build_from_config(config, "c/config.json", meta);
    } catch (const loom::InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json renamed = saved;
  renamed.erase("num_local_experts");
  renamed["num_experts"] = 8;
  EXPECT_EQ(message(renamed), "");
  json missing = saved;
  missing.erase("num_local_experts");
  EXPECT_NE(message(missing).find("num_experts or num_local_experts is missing; loom does not "
                                  "assume Qwen3MoeConfig's 128"),
            std::string::npos)
      << message(missing);
  json both = saved;
  both["num_experts"] = 6;
  EXPECT_NE(message(both).find("num_experts (6) and num_local_experts (8) are two spellings of "
                               "one setting and disagree"),
            std::string::npos)
      << message(both);
  json no_width = saved;
  no_width.erase("moe_intermediate_size");
  EXPECT_NE(message(no_width).find("moe_intermediate_size is missing"), std::string::npos);
}

TEST(HfQwen3Moe, AMissingExpertIsNamed) {
  const std::string folder = loom::testing::fresh_temp_dir("qwen3_moe_missing");
  fs::copy(folders()[0], folder, fs::copy_options::recursive);
  loom::checkpoint::NamedTensors kept;
  for (const auto& [name, t] : tensors_of(folder + "/model.safetensors")) {
    if (name != "model.layers.2.mlp.experts.5.up_proj.weight") kept.emplace_back(name, t);
  }
  loom::checkpoint::save_safetensors(folder + "/model.safetensors", kept, {{"format", "pt"}});
  try {
    loom::checkpoint::import_from_hf(folder, loom::testing::fresh_temp_dir("qwen3_moe_ck2"));
    FAIL() << "import accepted a folder without expert 5's up_proj";
  } catch (const loom::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("expert 5 of layers.2.moe.experts.w3 is missing"),
              std::string::npos)
        << e.what();
  }
}

// eval/generate --model and --flavor were ignored without a word on a Hugging Face folder.
TEST(HfQwen3Moe, ModelAndFlavorOverridesOnAFolderAreCheckedNotIgnored) {
  auto attempt = [](std::optional<std::string> model, std::optional<std::string> flavor) {
    loom::generate::ModelSource source;
    source.checkpoint = kTransformers5Normed;
    source.tokenizer = "byte";
    source.device = "cpu";
    source.model = model;
    source.flavor = flavor;
    try {
      return loom::generate::load_inference_model(source).spec->name;
    } catch (const loom::InputError& e) {
      return std::string(e.what());
    }
  };
  EXPECT_EQ(attempt("qwen3_moe", std::nullopt), "qwen3_moe");
  EXPECT_EQ(attempt("qwen3", std::nullopt), "qwen3_moe");  // torchtitan's name for the family
  const std::string wrong = attempt("llama3", std::nullopt);
  EXPECT_NE(wrong.find("--model llama3"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("holds a qwen3_moe model"), std::string::npos) << wrong;
  const std::string flavor = attempt(std::nullopt, "30B-A3B");
  EXPECT_NE(flavor.find("--flavor 30B-A3B"), std::string::npos) << flavor;
  EXPECT_NE(flavor.find("is a Hugging Face folder"), std::string::npos) << flavor;
}

}  // namespace test_hf_qwen3_moe
}  // namespace
