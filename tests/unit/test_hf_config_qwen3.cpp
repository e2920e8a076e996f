// Qwen3's config.json as transformers 4.x (top-level rope_theta, rope_scaling null) and 5.x
// (rope_parameters, dtype, layer_types) write it, as Qwen publishes it on the Hub (integer
// rope_theta, a window size switched off), with Qwen3Config's defaults for what a file leaves
// out; and every field that would make Qwen3ForCausalLM compute something loom does not
// (windows, biases, another RoPE type, sliding layers) refused by name.
#include <gtest/gtest.h>

#include <cmath>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <tuple>

#include "loom/core/check.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/model_spec.h"
#include "loom/models/qwen3/args.h"

using loom::models::DecoderArgs;
using nlohmann::json;

namespace {
namespace test_hf_config_qwen3 {  // its own names in a unity batch

// A Qwen3 config.json as transformers 4.57 saves it (layer_types, max_window_layers, a window
// switched off).
json qwen3_layout4() {
  return {{"architectures", {"Qwen3ForCausalLM"}},
          {"model_type", "qwen3"},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"dtype", "float32"},
          {"head_dim", 32},
          {"hidden_act", "silu"},
          {"hidden_size", 64},
          {"initializer_range", 0.02},
          {"intermediate_size", 96},
          {"layer_types", {"full_attention", "full_attention"}},
          {"max_position_embeddings", 128},
          {"max_window_layers", 28},
          {"num_attention_heads", 4},
          {"num_hidden_layers", 2},
          {"num_key_value_heads", 2},
          {"rms_norm_eps", 1e-6},
          {"rope_scaling", nullptr},
          {"rope_theta", 1000000.0},
          {"sliding_window", nullptr},
          {"tie_word_embeddings", true},
          {"transformers_version", "4.57.1"},
          {"use_cache", true},
          {"use_sliding_window", false},
          {"vocab_size", 300}};
}

// The same as transformers 5 saves it: rope_parameters, null token ids.
json qwen3_layout5() {
  json c = qwen3_layout4();
  c.erase("rope_theta");
  c.erase("rope_scaling");
  c["rope_parameters"] = {{"rope_theta", 1000000.0}, {"rope_type", "default"}};
  c["bos_token_id"] = nullptr;
  c["eos_token_id"] = nullptr;
  c["pad_token_id"] = nullptr;
  c["transformers_version"] = "5.25.0";
  return c;
}

loom::models::BuildOptions on_meta() {
  loom::models::BuildOptions options;
  options.tensor_options = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  return options;
}

DecoderArgs read_qwen3(const json& config) {
  auto model = loom::models::find_model_spec("qwen3").hf.build_from_config(
      config, "qwen3/config.json", on_meta());
  return loom::models::decoder_args(*model);
}

std::string qwen3_refusal(const json& config) {
  try {
    read_qwen3(config);
  } catch (const loom::InputError& e) {
    return e.what();
  }
  return "";
}

// Every field of the decoder's arithmetic and size.
void expect_same_model(const DecoderArgs& got, const DecoderArgs& want, const std::string& what) {
  EXPECT_EQ(got.dim, want.dim) << what;
  EXPECT_EQ(got.n_layers, want.n_layers) << what;
  EXPECT_EQ(got.n_heads, want.n_heads) << what;
  EXPECT_EQ(got.kv_heads(), want.kv_heads()) << what;
  EXPECT_EQ(got.head_dim(), want.head_dim()) << what;
  EXPECT_EQ(got.ffn_hidden_dim(), want.ffn_hidden_dim()) << what;
  EXPECT_EQ(got.vocab_size, want.vocab_size) << what;
  EXPECT_EQ(got.max_seq_len, want.max_seq_len) << what;
  EXPECT_EQ(got.norm_eps, want.norm_eps) << what;
  EXPECT_EQ(got.rope_theta, want.rope_theta) << what;
  EXPECT_EQ(got.use_scaled_rope, want.use_scaled_rope) << what;
  EXPECT_EQ(got.rope_layout, want.rope_layout) << what;
  EXPECT_EQ(got.qk_norm, want.qk_norm) << what;
  EXPECT_EQ(got.tie_embeddings, want.tie_embeddings) << what;
}

TEST(HfConfigQwen3, BothLayoutsReadTheSameShape) {
  json v5_window = qwen3_layout5();
  v5_window["sliding_window"] = 4096;  // kept by some configs, switched off by use_sliding_window
  json v5_unset_switch = v5_window;    // Qwen3Config's use_sliding_window defaults to false
  v5_unset_switch.erase("use_sliding_window");
  json v5_null_switch = v5_window;
  v5_null_switch["use_sliding_window"] = nullptr;
  json hub_style = qwen3_layout4();  // 4.51: no layer_types, integer theta, torch_dtype
  hub_style.erase("layer_types");
  hub_style.erase("dtype");
  hub_style["torch_dtype"] = "bfloat16";
  hub_style["rope_theta"] = 1000000;
  const std::vector<std::pair<std::string, json>> configs = {
      {"transformers 4", qwen3_layout4()}, {"transformers 5", qwen3_layout5()},
      {"5, window kept", v5_window},       {"5, switch left out", v5_unset_switch},
      {"5, switch null", v5_null_switch},  {"4.51", hub_style}};
  for (const auto& [what, config] : configs) {
    const DecoderArgs args = read_qwen3(config);
    EXPECT_EQ(args.head_dim(), 32) << what;  // not hidden_size / heads = 16
    EXPECT_EQ(args.n_heads, 4) << what;
    EXPECT_EQ(args.kv_heads(), 2) << what;
    EXPECT_EQ(args.ffn_hidden_dim(), 96) << what;
    EXPECT_TRUE(args.qk_norm) << what;
    EXPECT_TRUE(args.tie_embeddings) << what;
    EXPECT_EQ(args.rope_layout, loom::models::RopeLayout::kHalves) << what;
    EXPECT_EQ(args.rope_theta, 1e6) << what;
    EXPECT_FALSE(args.use_scaled_rope) << what;
    EXPECT_EQ(args.norm_eps, 1e-6) << what;
  }
}

TEST(HfConfigQwen3, SavedByTransformers5) {
  // save_pretrained's own file (tools/make_hf_qwen3_model.py under transformers 5.25).
  const json config = json::parse(std::ifstream(
      std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_qwen3/transformers5/tied/config.json"));
  ASSERT_TRUE(config.contains("rope_parameters"));
  const DecoderArgs args = read_qwen3(config);
  EXPECT_EQ(args.dim, 32);
  EXPECT_EQ(args.head_dim(), 16);
  EXPECT_EQ(args.kv_heads(), 2);
  EXPECT_EQ(args.rope_theta, 1e6);
  EXPECT_TRUE(args.tie_embeddings);
}

TEST(HfConfigQwen3, PublishedConfigsReadAsTheFlavors) {
  // Qwen/Qwen3-0.6B's config.json as published (transformers 4.51).
  const json published = {{"architectures", {"Qwen3ForCausalLM"}},
                          {"attention_bias", false},
                          {"attention_dropout", 0.0},
                          {"bos_token_id", 151643},
                          {"eos_token_id", 151645},
                          {"head_dim", 128},
                          {"hidden_act", "silu"},
                          {"hidden_size", 1024},
                          {"initializer_range", 0.02},
                          {"intermediate_size", 3072},
                          {"max_position_embeddings", 40960},
                          {"max_window_layers", 28},
                          {"model_type", "qwen3"},
                          {"num_attention_heads", 16},
                          {"num_hidden_layers", 28},
                          {"num_key_value_heads", 8},
                          {"rms_norm_eps", 1e-06},
                          {"rope_scaling", nullptr},
                          {"rope_theta", 1000000},
                          {"sliding_window", nullptr},
                          {"tie_word_embeddings", true},
                          {"torch_dtype", "bfloat16"},
                          {"transformers_version", "4.51.0"},
                          {"use_cache", true},
                          {"use_sliding_window", false},
                          {"vocab_size", 151936}};
  const auto& flavors = loom::models::qwen3::qwen3_flavors();
  expect_same_model(read_qwen3(published), flavors.at("0.6B"), "Qwen3-0.6B");
  // Qwen3-4B-Instruct-2507: the 4B shape with a longer context and theta 5e6 (an integer).
  json longer = published;
  longer.update({{"hidden_size", 2560},
                 {"intermediate_size", 9728},
                 {"max_position_embeddings", 262144},
                 {"max_window_layers", 36},
                 {"num_attention_heads", 32},
                 {"num_hidden_layers", 36},
                 {"rope_theta", 5000000}});
  DecoderArgs want = flavors.at("4B");
  want.max_seq_len = 262144;
  want.rope_theta = 5e6;
  expect_same_model(read_qwen3(longer), want, "Qwen3-4B-Instruct-2507");
}

TEST(HfConfigQwen3, DefaultsAreQwen3Config) {
  // What transformers' Qwen3Config (4.57 and 5.x) takes for keys a file leaves out.
  json bare = qwen3_layout4();
  for (const char* key : {"head_dim", "rope_theta", "rms_norm_eps", "max_position_embeddings",
                          "tie_word_embeddings", "num_key_value_heads", "rope_scaling",
                          "layer_types", "sliding_window", "use_sliding_window"}) {
    bare.erase(key);
  }
  bare["num_attention_heads"] = 64;
  bare["hidden_size"] = 128;
  const DecoderArgs defaults = read_qwen3(bare);
  EXPECT_EQ(defaults.head_dim(), 128);
  EXPECT_EQ(defaults.rope_theta, 10000.0);
  EXPECT_EQ(defaults.norm_eps, 1e-6);
  EXPECT_EQ(defaults.max_seq_len, 32768);
  EXPECT_FALSE(defaults.tie_embeddings);
  EXPECT_EQ(defaults.kv_heads(), 32);  // the class default, not num_attention_heads
  // null is "as many as the query heads", as in every transformers config class.
  bare["num_key_value_heads"] = nullptr;
  EXPECT_EQ(read_qwen3(bare).kv_heads(), 64);
  // A default that cannot be is refused by name.
  bare.erase("num_key_value_heads");
  bare["num_attention_heads"] = 4;
  EXPECT_NE(qwen3_refusal(bare).find("qwen3/config.json: num_key_value_heads is missing, and "
                                     "Qwen3ForCausalLM's default (32) does not divide "
                                     "num_attention_heads (4)"),
            std::string::npos)
      << qwen3_refusal(bare);
}

TEST(HfConfigQwen3, FieldsThatChangeTheArithmeticAreRefusedByName) {
  // (layout, key, value, message)
  const std::vector<std::tuple<json, std::string, json, std::string>> cases = {
      {qwen3_layout4(), "use_sliding_window", true, "use_sliding_window is true; loom needs false"},
      {qwen3_layout5(), "use_sliding_window", true, "use_sliding_window is true; loom needs false"},
      {qwen3_layout4(), "attention_bias", true, "attention_bias is true; loom needs false"},
      {qwen3_layout5(), "attention_bias", true, "attention_bias is true; loom needs false"},
      {qwen3_layout4(),
       "layer_types",
       {"full_attention", "sliding_attention"},
       "layer_types is [\"full_attention\",\"sliding_attention\"]"},
      {qwen3_layout5(),
       "layer_types",
       {"sliding_attention", "full_attention"},
       "layer_types is [\"sliding_attention\",\"full_attention\"]"},
      {qwen3_layout5(),
       "layer_types",
       {"full_attention", "full_attention", "full_attention"},
       "layer_types has 3 entries; num_hidden_layers is 2"},
      {qwen3_layout4(),
       "rope_scaling",
       {{"rope_type", "yarn"}, {"factor", 0.5}, {"original_max_position_embeddings", 32768}},
       "rope_scaling.factor is 0.5; YaRN extends the context, so it must be at least 1"},
      {qwen3_layout4(),
       "rope_scaling",
       {{"type", "dynamic"}, {"factor", 2.0}},
       "rope_scaling.rope_type is \"dynamic\""},
      {qwen3_layout5(),
       "rope_parameters",
       {{"rope_type", "longrope"},
        {"rope_theta", 1000000.0},
        {"factor", 4.0},
        {"original_max_position_embeddings", 32768}},
       "rope_parameters.rope_type is \"longrope\""},
      {qwen3_layout5(),
       "rope_parameters",
       {{"rope_type", "linear"}, {"rope_theta", 1000000.0}, {"factor", 2.0}},
       "rope_parameters.rope_type is \"linear\""},
      {qwen3_layout5(),
       "rope_parameters",
       {{"rope_type", "default"}, {"rope_theta", 1000000.0}, {"partial_rotary_factor", 0.5}},
       "rope_parameters.partial_rotary_factor is 0.5"},
      {qwen3_layout4(), "model_type", "qwen2",
       "model_type is \"qwen2\"; the qwen3 family reads \"qwen3\" models"},
      {qwen3_layout4(), "hidden_act", "gelu", "hidden_act is \"gelu\"; loom needs \"silu\""},
  };
  for (const auto& [layout, key, value, message] : cases) {
    json config = layout;
    config[key] = value;
    const std::string error = qwen3_refusal(config);
    EXPECT_NE(error.find("qwen3/config.json: " + message), std::string::npos)
        << key << " = " << value.dump() << ": " << error;
  }
  // A window size with windows on is refused by its name (sliding_window comes first).
  for (const json& layout : {qwen3_layout4(), qwen3_layout5()}) {
    json windows = layout;
    windows["use_sliding_window"] = true;
    windows["sliding_window"] = 4096;
    EXPECT_NE(qwen3_refusal(windows).find("sliding_window is 4096; loom needs null"),
              std::string::npos)
        << qwen3_refusal(windows);
  }
}

TEST(HfConfigQwen3, TheRegistryFindsTheFamilyByModelType) {
  EXPECT_EQ(loom::models::find_hf_model_spec(qwen3_layout4(), "x").name, "qwen3");
  EXPECT_EQ(loom::models::find_hf_model_spec(qwen3_layout5(), "x").name, "qwen3");
  EXPECT_EQ(loom::models::find_hf_model_spec(json{{"model_type", "llama"}}, "x").name, "llama3");
  try {
    loom::models::find_hf_model_spec(json{{"model_type", "gpt2"}}, "gpt2/config.json");
    ADD_FAILURE() << "gpt2 was given a family";
  } catch (const loom::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("\"gpt2\" is not a family loom implements"),
              std::string::npos)
        << e.what();
  }
}

// Qwen3's long-context setting (its model cards: YaRN, factor 4 over 32768 positions) reads in
// both layouts, with transformers' defaults for what it leaves out, and is written back as read.
TEST(HfConfigQwen3, YarnReadsInBothLayoutsAndWritesBack) {
  json old_layout = qwen3_layout4();
  old_layout["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  json new_layout = qwen3_layout5();
  new_layout["rope_parameters"] = {{"rope_type", "yarn"},
                                   {"rope_theta", 1000000.0},
                                   {"factor", 4.0},
                                   {"original_max_position_embeddings", 32768}};
  for (const json& config : {old_layout, new_layout}) {
    const DecoderArgs args = read_qwen3(config);
    ASSERT_TRUE(args.yarn.has_value());
    EXPECT_TRUE(args.yarn_active());
    EXPECT_EQ(args.yarn->factor, 4.0);
    EXPECT_EQ(args.yarn->original_max_position_embeddings, 32768);
    EXPECT_EQ(args.yarn->beta_fast, 32.0);
    EXPECT_EQ(args.yarn->beta_slow, 1.0);
    // transformers' attention_factor without mscale: 0.1 ln(factor) + 1, on cos and sin.
    EXPECT_NEAR(args.yarn->rotation_scale(), 0.1 * std::log(4.0) + 1.0, 1e-12);
    EXPECT_EQ(args.yarn->softmax_scale_factor(), 1.0);  // MLA only
    auto model = loom::models::find_model_spec("qwen3").hf.build_from_config(
        config, "qwen3/config.json", on_meta());
    const json written =
        loom::models::find_model_spec("qwen3").hf.adapter(*model)->hf_config("float32");
    EXPECT_EQ(written.at("rope_scaling").at("rope_type"), "yarn");
    const DecoderArgs back = read_qwen3(written);
    ASSERT_TRUE(back.yarn.has_value());
    EXPECT_EQ(back.yarn->factor, 4.0);
    EXPECT_EQ(back.yarn->original_max_position_embeddings, 32768);
  }
  // Without the original context, transformers takes max_position_embeddings.
  old_layout["rope_scaling"].erase("original_max_position_embeddings");
  EXPECT_EQ(read_qwen3(old_layout).yarn->original_max_position_embeddings,
            old_layout.at("max_position_embeddings").get<int64_t>());
}

}  // namespace test_hf_config_qwen3
}  // namespace
