// Hugging Face config.json, read and written: both layouts (transformers 4's top-level rope_theta
// and rope_scaling, transformers 5's rope_parameters) give the same model, on fixtures saved by
// transformers 4.57 and 5.24 and on hand-made variants; every key that would make loom compute
// something else than transformers is refused by name; an export reads back the same.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/core/check.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/llama/args.h"
#include "loom/models/llama/init.h"
#include "support/process.h"

namespace fs = std::filesystem;
using LlamaArgs = loom::models::DecoderArgs;
using nlohmann::json;

namespace {

const loom::models::ModelSpec& llama3() {
  return loom::models::find_model_spec("llama3");
}

loom::models::BuildOptions on_meta() {
  loom::models::BuildOptions options;
  options.tensor_options = at::TensorOptions().device(at::kMeta).dtype(at::kFloat);
  return options;
}

std::unique_ptr<loom::models::DecoderModel> model_of(const LlamaArgs& args) {
  return std::make_unique<loom::models::DecoderModel>(
      "llama3", "test", args, on_meta().tensor_options, loom::models::ModelPart{},
      loom::models::llama::init_parameter);
}

// The config.json loom exports for `args`.
json exported_config(const LlamaArgs& args) {
  return llama3().hf.adapter(*model_of(args))->hf_config("float32");
}

// What the two compute differently, as loom compares a job's flavor with a folder.
std::vector<std::string> arithmetic_differences(const LlamaArgs& a, const LlamaArgs& b) {
  return loom::checkpoint::arithmetic_differences(exported_config(a), exported_config(b));
}

const std::string kFixtures = std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_llama";

json read_json(const std::string& path) {
  return json::parse(std::ifstream(path));
}

// A transformers 4 layout config of a small Llama (top-level rope_theta and rope_scaling).
json layout4(double theta, bool llama3) {
  json c = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", 64},
            {"intermediate_size", 176},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"vocab_size", 300},
            {"max_position_embeddings", 1024},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", theta},
            {"rope_scaling", nullptr},
            {"torch_dtype", "float32"},
            {"transformers_version", "4.57.1"}};
  if (llama3) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 512}};
  }
  return c;
}

// The same config as transformers 5 writes it: rope_theta and the scaling move into
// rope_parameters, whose rope_type is "default" without scaling.
json layout5(json c) {
  json parameters =
      c["rope_scaling"].is_null() ? json{{"rope_type", "default"}} : c["rope_scaling"];
  parameters["rope_theta"] = c["rope_theta"];
  c.erase("rope_theta");
  c.erase("rope_scaling");
  c.erase("torch_dtype");
  c["dtype"] = "float32";
  c["rope_parameters"] = parameters;
  c["transformers_version"] = "5.24.0";
  return c;
}

LlamaArgs read(const json& config) {
  auto model = llama3().hf.build_from_config(config, "model/config.json", on_meta());
  return loom::models::decoder_args(*model);
}

// The InputError message reading `config` raises ("" when it reads).
std::string refusal(const json& config) {
  try {
    read(config);
  } catch (const loom::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HfConfig, FixturesSavedByTransformers4And5GiveTheirRope) {
  const auto v4 = read_json(kFixtures + "/transformers4/config.json");
  const auto v5 = read_json(kFixtures + "/transformers5/config.json");
  // The fixtures really are in the two layouts.
  ASSERT_TRUE(v4.contains("rope_theta") && v4.contains("rope_scaling"));
  ASSERT_FALSE(v4.contains("rope_parameters"));
  ASSERT_TRUE(v5.contains("rope_parameters"));
  ASSERT_FALSE(v5.contains("rope_theta") || v5.contains("rope_scaling"));
  for (const auto& [config, theta] : {std::pair{v4, 250000.0}, std::pair{v5, 500000.0}}) {
    const LlamaArgs args = read(config);
    EXPECT_EQ(args.rope_theta, theta);
    EXPECT_TRUE(args.use_scaled_rope);
    EXPECT_EQ(args.rope_scaling.factor, 8.0);
    EXPECT_EQ(args.rope_scaling.low_freq_factor, 1.0);
    EXPECT_EQ(args.rope_scaling.high_freq_factor, 4.0);
    EXPECT_EQ(args.rope_scaling.original_max_position_embeddings, 32);
    EXPECT_EQ(args.dim, 32);
    EXPECT_EQ(args.n_heads, 4);
    EXPECT_EQ(args.kv_heads(), 2);
    EXPECT_EQ(args.ffn_hidden_dim(), 72);
    EXPECT_EQ(args.norm_eps, 1e-5);
  }
}

TEST(HfConfig, BothLayoutsReadTheSameModel) {
  for (bool llama3 : {false, true}) {
    for (double theta : {10000.0, 123456.0, 500000.0}) {
      const LlamaArgs old_layout = read(layout4(theta, llama3));
      const LlamaArgs new_layout = read(layout5(layout4(theta, llama3)));
      EXPECT_EQ(old_layout.rope_theta, theta);
      EXPECT_EQ(old_layout.use_scaled_rope, llama3);
      EXPECT_TRUE(arithmetic_differences(old_layout, new_layout).empty())
          << "theta " << theta << (llama3 ? " llama3" : " default");
      EXPECT_EQ(new_layout.rope_theta, theta);
      EXPECT_EQ(new_layout.use_scaled_rope, llama3);
    }
  }
  // Older spellings: rope_scaling's "type", a rope_parameters without rope_theta whose theta sits
  // at the top level (transformers 5 reads that too).
  json legacy = layout4(500000.0, true);
  legacy["rope_scaling"].erase("rope_type");
  legacy["rope_scaling"]["type"] = "llama3";
  EXPECT_TRUE(read(legacy).use_scaled_rope);
  json split = layout5(layout4(77777.0, false));
  split["rope_parameters"].erase("rope_theta");
  split["rope_theta"] = 77777.0;
  EXPECT_EQ(read(split).rope_theta, 77777.0);
}

TEST(HfConfig, MissingRopeThetaIsTransformersDefault) {
  // LlamaConfig's rope_theta default (10000) in both versions; nothing else would read it.
  json old_layout = layout4(1.0, false);
  old_layout.erase("rope_theta");
  EXPECT_EQ(read(old_layout).rope_theta, 10000.0);
  json new_layout = layout5(layout4(1.0, false));
  new_layout["rope_parameters"].erase("rope_theta");
  EXPECT_EQ(read(new_layout).rope_theta, 10000.0);
  // and rms_norm_eps's (1e-6).
  old_layout.erase("rms_norm_eps");
  EXPECT_EQ(read(old_layout).norm_eps, 1e-6);
}

TEST(HfConfig, TwoRopeDescriptionsMustAgree) {
  json both = layout4(500000.0, true);
  both["rope_parameters"] = layout5(layout4(500000.0, true))["rope_parameters"];
  EXPECT_EQ(refusal(both), "");
  json other_theta = both;
  other_theta["rope_parameters"]["rope_theta"] = 10000.0;
  EXPECT_NE(refusal(other_theta)
                .find("rope_parameters.rope_theta (10000.0) and the top-level "
                      "rope_theta (500000.0) disagree"),
            std::string::npos)
      << refusal(other_theta);
  json other_type = both;
  other_type["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_NE(refusal(other_type).find("rope_scaling and rope_parameters describe different"),
            std::string::npos)
      << refusal(other_type);
  json spellings = layout4(500000.0, true);
  spellings["rope_scaling"]["type"] = "linear";
  EXPECT_NE(refusal(spellings).find("rope_scaling.rope_type (\"llama3\") and rope_scaling.type "
                                    "(\"linear\") disagree"),
            std::string::npos)
      << refusal(spellings);
}

TEST(HfConfig, UnsupportedRopeIsRefusedByName) {
  for (const std::string type : {"linear", "dynamic", "longrope", "mrope"}) {
    json old_layout = layout4(10000.0, false);
    old_layout["rope_scaling"] = {{"rope_type", type}, {"factor", 2.0}};
    EXPECT_NE(refusal(old_layout)
                  .find("model/config.json: rope_scaling.rope_type is \"" + type +
                        "\"; loom implements the RoPE types \"default\", \"llama3\" and "
                        "\"yarn\" only"),
              std::string::npos)
        << refusal(old_layout);
    json new_layout = layout5(old_layout);
    EXPECT_NE(refusal(new_layout).find("rope_parameters.rope_type is \"" + type + "\""),
              std::string::npos)
        << refusal(new_layout);
  }
  // A parameter the type does not use, a partial rotation, llama3 without its parameters.
  json extra = layout5(layout4(500000.0, true));
  extra["rope_parameters"]["attention_factor"] = 1.2;
  EXPECT_NE(refusal(extra).find("rope_parameters.attention_factor (1.2) is not a parameter of "
                                "rope_type \"llama3\""),
            std::string::npos)
      << refusal(extra);
  json partial = layout5(layout4(500000.0, false));
  partial["rope_parameters"]["partial_rotary_factor"] = 0.5;
  EXPECT_NE(refusal(partial).find("rope_parameters.partial_rotary_factor is 0.5; loom needs 1"),
            std::string::npos)
      << refusal(partial);
  json incomplete = layout5(layout4(500000.0, true));
  incomplete["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_NE(refusal(incomplete)
                .find("rope_parameters.original_max_position_embeddings is "
                      "missing"),
            std::string::npos)
      << refusal(incomplete);
  json text = layout4(500000.0, false);
  text["rope_theta"] = "500000";
  EXPECT_NE(refusal(text).find("rope_theta must be a number, found \"500000\""), std::string::npos)
      << refusal(text);
}

TEST(HfConfig, FieldsThatChangeTheArithmeticAreRefusedByName) {
  const std::vector<std::tuple<std::string, json, std::string>> cases = {
      {"attention_bias", true, "attention_bias is true; loom needs false"},
      {"mlp_bias", true, "mlp_bias is true; loom needs false"},
      {"hidden_act", "gelu", "hidden_act is \"gelu\"; loom needs \"silu\""},
      {"sliding_window", 4096, "sliding_window is 4096; loom needs null"},
      {"use_sliding_window", true, "use_sliding_window is true; loom needs false"},
      {"layer_types",
       {"full_attention", "sliding_attention"},
       "layer_types is [\"full_attention\",\"sliding_attention\"]; loom needs only "
       "\"full_attention\""},
      {"partial_rotary_factor", 0.25, "partial_rotary_factor is 0.25; loom needs 1"},
      {"attn_logit_softcapping", 50.0, "attn_logit_softcapping is 50.0; loom needs null"},
      {"final_logit_softcapping", 30.0, "final_logit_softcapping is 30.0; loom needs null"},
      {"quantization_config", {{"quant_method", "bitsandbytes"}}, "quantization_config is "},
      {"auto_map", {{"AutoModelForCausalLM", "modeling.MyLlama"}}, "auto_map is "},
      {"pruned_heads", {{"0", {1}}}, "pruned_heads is "},
      {"head_dim", 32, "head_dim is 32; loom needs hidden_size / num_attention_heads = 16"},
      {"model_type", "mistral",
       "model_type is \"mistral\"; the llama3 family reads \"llama\" models"},
  };
  for (const auto& make : {+[](json c) { return c; }, +[](json c) { return layout5(c); }}) {
    for (const auto& [key, value, message] : cases) {
      json config = make(layout4(500000.0, true));
      config[key] = value;
      const std::string error = refusal(config);
      EXPECT_NE(error.find("model/config.json: " + message), std::string::npos)
          << key << ": " << error;
    }
  }
  // The neutral values of the same keys read, and so does null (transformers' "unset").
  json neutral = layout4(500000.0, true);
  neutral.update({{"attention_bias", false},
                  {"mlp_bias", false},
                  {"hidden_act", "silu"},
                  {"sliding_window", nullptr},
                  {"use_sliding_window", false},
                  {"layer_types", {"full_attention", "full_attention"}},
                  {"partial_rotary_factor", 1.0},
                  {"pruned_heads", json::object()},
                  {"head_dim", 16},
                  {"quantization_config", nullptr}});
  EXPECT_EQ(refusal(neutral), "");
  neutral["head_dim"] = nullptr;
  EXPECT_EQ(refusal(neutral), "");
}

TEST(HfConfig, ExportReadsBackAsTheSameModelInBothLayouts) {
  for (bool llama3 : {false, true}) {
    LlamaArgs args = loom::models::llama::llama3_flavors().at("debugmodel");
    args.rope_theta = 123456.0;
    args.use_scaled_rope = llama3;
    const json exported = exported_config(args);
    EXPECT_EQ(exported["rope_theta"], 123456.0);
    EXPECT_EQ(exported["rope_parameters"]["rope_theta"], 123456.0);
    EXPECT_EQ(exported["rope_parameters"]["rope_type"], llama3 ? "llama3" : "default");
    EXPECT_EQ(exported.contains("rope_scaling"), llama3);
    EXPECT_TRUE(arithmetic_differences(read(exported), args).empty()) << exported.dump();
    // Either layout alone (what each transformers reads) is the same model.
    json only4 = exported;
    only4.erase("rope_parameters");
    EXPECT_TRUE(arithmetic_differences(read(only4), args).empty());
    json only5 = exported;
    only5.erase("rope_theta");
    only5.erase("rope_scaling");
    EXPECT_TRUE(arithmetic_differences(read(only5), args).empty());
  }
}

TEST(HfConfig, ArithmeticDifferencesNameWhatDiffers) {
  LlamaArgs a = loom::models::llama::llama3_flavors().at("debugmodel");
  LlamaArgs b = a;
  EXPECT_TRUE(arithmetic_differences(a, b).empty());
  b.rope_theta = 10000.0;
  b.n_heads = 8;
  b.vocab_size = 7;    // shapes are checked when the weights load, not here
  b.max_seq_len = 64;  // the context is not arithmetic
  std::string all;
  for (const auto& line : arithmetic_differences(a, b)) all += line + "\n";
  EXPECT_NE(all.find("num_attention_heads: 16 vs 8"), std::string::npos) << all;
  EXPECT_NE(all.find("num_key_value_heads: 16 vs 8"), std::string::npos) << all;
  EXPECT_NE(all.find("rope_theta: 500000.0 vs 10000.0"), std::string::npos) << all;
  EXPECT_EQ(all.find("vocab_size:"), std::string::npos) << all;
  EXPECT_EQ(("\n" + all).find("\nmax_position_embeddings:"), std::string::npos) << all;
  b = a;
  b.use_scaled_rope = false;
  all.clear();
  for (const auto& line : arithmetic_differences(a, b)) all += line + "\n";
  EXPECT_NE(all.find("rope_scaling: {"), std::string::npos) << all;
}

TEST(HfConfig, TiedEmbeddingsAreCopiedAndMustAgreeWithAStoredHead) {
  namespace ck = loom::checkpoint;
  const std::string folder = loom::testing::fresh_temp_dir("hf_tied");
  fs::copy_file(kFixtures + "/transformers4/config.json", folder + "/config.json");
  auto loaded = ck::load_safetensors(kFixtures + "/transformers4/model.safetensors");
  ck::NamedTensors all, without_head;
  at::Tensor embedding;
  for (auto& [name, tensor] : loaded.tensors) {
    if (name == "model.embed_tokens.weight") embedding = tensor;
    all.emplace_back(name, tensor);
    if (name != "lm_head.weight") without_head.emplace_back(name, tensor);
  }
  ASSERT_TRUE(embedding.defined());
  json config = read_json(folder + "/config.json");
  config["tie_word_embeddings"] = true;
  std::ofstream(folder + "/config.json") << config.dump(1);
  // Tied, no lm_head stored: the folder's own model ties its head to the table; an untied model
  // (a job's flavor) gets a copy of the embedding as its head.
  ck::save_safetensors(folder + "/model.safetensors", without_head);
  auto tied = ck::hf_model(folder, on_meta());
  EXPECT_TRUE(loom::models::decoder_args(*tied.model).tie_embeddings);
  const auto own = ck::read_hf_weights(folder, llama3(), *tied.model);
  EXPECT_EQ(own.count("output.weight"), 0u);
  EXPECT_TRUE(at::equal(own.at("tok_embeddings.weight"), embedding));
  LlamaArgs untied_args = loom::models::decoder_args(*tied.model);
  untied_args.tie_embeddings = false;
  const auto copied = ck::read_hf_weights(folder, llama3(), *model_of(untied_args));
  ASSERT_EQ(copied.count("output.weight"), 1u);
  EXPECT_TRUE(at::equal(copied.at("output.weight"), embedding));
  // Tied, with a different lm_head stored: transformers would use the embedding; loom refuses.
  ck::save_safetensors(folder + "/model.safetensors", all);
  try {
    ck::read_hf_weights(folder, llama3(), *tied.model);
    ADD_FAILURE() << "a tied folder with a different lm_head.weight was read";
  } catch (const loom::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tie_word_embeddings, but lm_head.weight differs"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfConfig, ImportRefusesBeforeWriting) {
  const std::string folder = loom::testing::fresh_temp_dir("hf_refused");
  fs::copy_file(kFixtures + "/transformers5/model.safetensors", folder + "/model.safetensors");
  json config = read_json(kFixtures + "/transformers5/config.json");
  config["rope_parameters"]["rope_type"] = "longrope";
  std::ofstream(folder + "/config.json") << config.dump(1);
  const std::string out = loom::testing::fresh_temp_dir("hf_refused_out");
  EXPECT_THROW(loom::checkpoint::import_from_hf(folder, out), loom::InputError);
  EXPECT_FALSE(fs::exists(out + "/step-0"));
  // The caller's check sees config.json's arguments first.
  const std::string ok = loom::testing::fresh_temp_dir("hf_accept");
  double theta = 0;
  EXPECT_THROW(loom::checkpoint::import_from_hf(
                   kFixtures + "/transformers5", ok,
                   [&](const loom::checkpoint::SourcedModel& source) {
                     theta = loom::models::decoder_args(*source.model).rope_theta;
                     LOOM_THROW(loom::InputError, "no");
                   }),
               loom::InputError);
  EXPECT_EQ(theta, 500000.0);
  EXPECT_FALSE(fs::exists(ok + "/step-0"));
}
