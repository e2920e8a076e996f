// gpt-oss against transformers. Tiny random GptOssForCausalLM models made by the setup venv's
// transformers inside the test (tools/make_hf_gpt_oss_model.py): layers alternating a sliding
// window of 4 keys and full attention, biases on q/k/v/o, attention sinks away from zero, YaRN as
// gpt-oss configures it (rotate-half), 8 experts of which 2 per token with router and expert
// biases and the SwiGLU clamped at 7 (reached: the script asserts it), plain and with the experts
// in MXFP4 as gpt-oss publishes them. Checked: the first MoE block and the whole model's logits
// within 1e-5 of transformers' in float32, greedy tokens with loom's cache equal to
// transformers' generate(), the MXFP4 experts dequantized equal to the reference's, import then
// export writing the plain folder back bitwise, and malformed MXFP4 refused by name.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/generate/generator.h"
#include "loom/generate/inference_model.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/common/rope.h"
#include "loom/models/gpt_oss/args.h"
#include "loom/models/model_spec.h"
#include "support/errors.h"
#include "support/process.h"
#include "support/test_sets.h"
#include "unit/hf_test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
namespace test_hf_gpt_oss {  // its own names in a unity batch

using loom::testing::row_of;
using loom::testing::tensors_of;

std::vector<std::string> folders() {
  return loom::testing::made_by_transformers("make_hf_gpt_oss_model.py", "gpt_oss_models",
                                             {"plain", "mxfp4"});
}

loom::generate::InferenceModel load(const std::string& folder) {
  return loom::testing::load_hf_folder(folder, "gpt_oss");
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

LOOM_TEST(HfGptOss, ReadsWindowsSinksBiasesAndTheClampedExperts) {
  for (const std::string& folder : folders()) {
    auto model = load(folder);
    const auto& args = loom::models::decoder_args(*model.model);
    EXPECT_EQ(args.layer_windows, (std::vector<int64_t>{4, 0, 4, 0})) << folder;
    EXPECT_TRUE(args.attention_sinks && args.attention_bias);
    ASSERT_TRUE(args.moe && args.yarn);
    EXPECT_EQ(args.moe->num_experts, 8);
    EXPECT_EQ(args.moe->top_k, 2);
    EXPECT_DOUBLE_EQ(args.moe->swiglu_limit, 7.0);
    EXPECT_TRUE(args.moe->router_bias && args.moe->expert_biases);
    EXPECT_FALSE(args.yarn->truncate);
    EXPECT_EQ(args.rope_layout, loom::models::RopeLayout::kHalves);
  }
}

LOOM_TEST(HfGptOss, MoEBlockAndLogitsEqualTransformers) {
  for (const std::string& folder : folders()) {
    auto reference = tensors_of(folder + "/reference.safetensors");
    auto model = load(folder);
    auto& decoder = dynamic_cast<loom::models::DecoderModel&>(*model.model);
    auto& block = decoder.transformer()->blocks.at(reference.at("block_layer").item<int64_t>());
    at::NoGradGuard no_grad;
    const double block_worst =
        max_diff(block->moe->forward(reference.at("block_in")), reference.at("block_out"));
    EXPECT_LT(block_worst, 1e-5) << folder;
    const at::Tensor logits = model.forward(reference.at("ids"));
    ASSERT_EQ(logits.sizes(), reference.at("logits").sizes());
    const double worst = max_diff(logits, reference.at("logits"));
    EXPECT_LT(worst, 1e-5) << folder;
    std::printf("%s: max |loom - transformers| MoE block %.2e, logits %.2e\n", folder.c_str(),
                block_worst, worst);
  }
}

LOOM_TEST(HfGptOss, GreedyTokensWithTheCacheEqualTransformers) {
  for (const std::string& folder : folders()) {
    auto reference = tensors_of(folder + "/reference.safetensors");
    const std::vector<int32_t> want = row_of(reference.at("greedy"));
    auto model = load(folder);
    EXPECT_EQ(loom::testing::greedy_tokens(model, reference), want) << folder;
  }
}

LOOM_TEST(HfGptOss, Mxfp4ExpertsImportEqualToTheirDequantizedReference) {
  const std::string folder = folders().at(1);
  auto dequantized = tensors_of(folder + "/dequantized.safetensors");
  auto model = load(folder);
  auto params = model.model->module().named_parameters();
  int checked = 0;
  for (int64_t layer = 0; layer < 4; ++layer) {
    const std::string hf = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    const std::string loom = "layers." + std::to_string(layer) + ".moe.experts.";
    const at::Tensor gate_up = dequantized.at(hf + "gate_up_proj");  // [E, in, 2 out]
    const at::Tensor down = dequantized.at(hf + "down_proj");        // [E, in, out]
    EXPECT_TRUE(
        at::equal(params[loom + "w1"], gate_up.slice(2, 0, gate_up.size(2), 2).transpose(1, 2)));
    EXPECT_TRUE(
        at::equal(params[loom + "w3"], gate_up.slice(2, 1, gate_up.size(2), 2).transpose(1, 2)));
    EXPECT_TRUE(at::equal(params[loom + "w2"], down.transpose(1, 2)));
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  // The format itself: two codes a byte, low nibble first, times 2^(scale - 127).
  const at::Tensor blocks = at::tensor({0x21, 0xF9}, at::kByte).view({1, 1, 2}).repeat({1, 1, 8});
  const at::Tensor scales = at::tensor({128}, at::kByte).view({1, 1});
  const at::Tensor values = loom::models::gpt_oss::dequantize_mxfp4(blocks, scales, "test");
  EXPECT_EQ(values.sizes(), at::IntArrayRef({1, 32}));
  EXPECT_EQ(values[0][0].item<float>(), 1.0f);    // code 1 (0.5) x 2
  EXPECT_EQ(values[0][1].item<float>(), 2.0f);    // code 2 (1.0) x 2
  EXPECT_EQ(values[0][2].item<float>(), -1.0f);   // code 9 (-0.5) x 2
  EXPECT_EQ(values[0][3].item<float>(), -12.0f);  // code 15 (-6) x 2
}

LOOM_TEST(HfGptOss, ImportThenExportWritesThePlainFolderBack) {
  const std::string exported =
      loom::testing::expect_import_export_bitwise(folders().at(0), "gpt_oss");
  const json config = json::parse(std::ifstream(exported + "/config.json"));
  const json source = json::parse(std::ifstream(folders().at(0) + "/config.json"));
  EXPECT_EQ(config.at("architectures")[0], "GptOssForCausalLM");
  for (const char* key :
       {"layer_types", "sliding_window", "num_local_experts", "num_experts_per_tok",
        "intermediate_size", "swiglu_limit", "attention_bias", "head_dim", "num_key_value_heads"}) {
    EXPECT_EQ(config.at(key), source.at(key)) << key;
  }
  // The exported folder is the same model: loom reads it back to the same logits.
  auto reference = tensors_of(folders().at(0) + "/reference.safetensors");
  EXPECT_LT(max_diff(load(exported).forward(reference.at("ids")), reference.at("logits")), 1e-5);
}

// Keys a config.json leaves out take GptOssConfig's defaults, as transformers reads them: its
// YaRN (the tiny model's own, so the logits stay transformers'), a sliding window of 128; the
// SwiGLU clamp is transformers' constant 7.0, and another value in the file is refused.
LOOM_TEST(HfGptOss, KeysLeftOutTakeTheClassDefaultsAndTheClampIsTransformers) {
  const std::string folder = loom::testing::fresh_temp_dir("gpt_oss_defaults");
  fs::copy(folders().at(0), folder, fs::copy_options::recursive);
  json config = json::parse(std::ifstream(folder + "/config.json"));
  auto write = [&](const json& c) { std::ofstream(folder + "/config.json") << c.dump(1); };
  config.erase("rope_scaling");
  config.erase("rope_parameters");
  config.erase("swiglu_limit");
  write(config);
  auto reference = tensors_of(folders().at(0) + "/reference.safetensors");
  auto model = load(folder);
  const auto& args = loom::models::decoder_args(*model.model);
  ASSERT_TRUE(args.yarn.has_value());
  EXPECT_DOUBLE_EQ(args.yarn->factor, 32.0);
  EXPECT_LT(max_diff(model.forward(reference.at("ids")), reference.at("logits")), 1e-5);
  json windowless = config;
  windowless.erase("sliding_window");
  write(windowless);
  EXPECT_EQ(loom::models::decoder_args(*load(folder).model).layer_windows,
            (std::vector<int64_t>{128, 0, 128, 0}));
  // num_key_value_heads left out is GptOssConfig's 8 (not num_attention_heads), read here on the
  // meta device with heads it divides.
  json kv_left_out = config;
  kv_left_out.erase("num_key_value_heads");
  kv_left_out["num_attention_heads"] = 16;
  loom::models::BuildOptions meta;
  meta.tensor_options = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  const auto& spec = loom::models::find_hf_model_spec(kv_left_out, "config.json");
  EXPECT_EQ(loom::models::decoder_args(*spec.hf.build_from_config(kv_left_out, "config.json", meta))
                .n_kv_heads,
            8);
  config["swiglu_limit"] = 1.0;
  write(config);
  const std::string limit_error = loom::testing::input_error_of([&] { load(folder); });
  EXPECT_NE(limit_error.find("swiglu_limit is 1.0"), std::string::npos) << limit_error;
}

LOOM_TEST(HfGptOss, MalformedMxfp4BlocksAreRefusedByName) {
  const std::string folder = loom::testing::fresh_temp_dir("gpt_oss_bad_mxfp4");
  fs::copy(folders().at(1), folder, fs::copy_options::recursive);
  auto tensors = tensors_of(folder + "/model.safetensors");
  const std::string name = "model.layers.2.mlp.experts.down_proj_scales";
  tensors[name] = tensors.at(name).narrow(-1, 0, 1).contiguous();  // one scale short per row
  loom::checkpoint::NamedTensors named(tensors.begin(), tensors.end());
  loom::checkpoint::save_safetensors(folder + "/model.safetensors", named);
  try {
    load(folder);
    FAIL() << "malformed MXFP4 scales were accepted";
  } catch (const loom::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.mlp.experts.down_proj_blocks"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("scales [..., G]"), std::string::npos) << e.what();
  }
}

LOOM_TEST(GptOssFlavors, PlanCountsThePublishedSizes) {
  const auto& spec = loom::models::find_model_spec("gpt_oss");
  loom::models::BuildOptions options;
  options.tensor_options = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  for (const auto& [flavor, total, active] :
       {std::tuple{"20B", int64_t{20914757184}, int64_t{3608307264}},
        std::tuple{"120B", int64_t{116829156672}, int64_t{5132849472}}}) {
    options.flavor = flavor;
    const auto summary = spec.build(options)->summary(4096);
    EXPECT_EQ(summary.total_params, total) << flavor;
    EXPECT_EQ(summary.active_params, active) << flavor;
  }
}

// YaRN against transformers' own _compute_yarn_parameters (tests/python/yarn_reference.py) at
// published shapes, where the ramp's ends fall between pairs: gpt-oss 20B (head_dim 64, factor
// 32, no truncation), DeepSeek-V3 (mscale and mscale_all_dim, truncated ends) and a Qwen3 long
// context (head_dim 128, factor 4). The tiny models' logits reach only a few pairs of head_dim 8.
LOOM_TEST(Yarn, FrequenciesAndMagnitudeEqualTransformers) {
  const auto result =
      loom::testing::run_command(std::string("'") + LOOM_PYTHON + "' '" + LOOM_SOURCE_DIR +
                                 "/tests/python/yarn_reference.py' 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const json cases = json::parse(result.output);
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const json& r = c["rope_scaling"];
    loom::models::YarnScaling yarn;
    yarn.factor = r["factor"].get<double>();
    yarn.original_max_position_embeddings = r["original_max_position_embeddings"].get<int64_t>();
    if (r.contains("beta_fast")) yarn.beta_fast = r["beta_fast"].get<double>();
    if (r.contains("beta_slow")) yarn.beta_slow = r["beta_slow"].get<double>();
    if (r.contains("mscale")) yarn.mscale = r["mscale"].get<double>();
    if (r.contains("mscale_all_dim")) yarn.mscale_all_dim = r["mscale_all_dim"].get<double>();
    yarn.truncate = r.value("truncate", true);
    const auto want = c["inv_freq"].get<std::vector<double>>();
    const at::Tensor got = loom::models::yarn_frequencies(c["head_dim"].get<int64_t>(),
                                                          c["theta"].get<double>(), yarn);
    ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
    const at::Tensor expected = at::tensor(want, at::kDouble);
    const double diff =
        ((got.to(at::kDouble) - expected).abs() / expected.abs()).max().item<double>();
    EXPECT_LE(diff, 1e-6);
    EXPECT_NEAR(yarn.rotation_scale(), c["attention_factor"].get<double>(), 1e-12);
  }
}

}  // namespace test_hf_gpt_oss
}  // namespace
