// loom's Llama 3 against an independent plain-PyTorch implementation
// (tools/reference/llama_reference.py, run with the setup venv's Python): same weights (saved by
// loom), same batch; logits, loss and every gradient must agree within 1e-5 relative in fp32.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "loom/checkpoint/safetensors.h"
#include "loom/models/llama/init.h"
#include "loom/models/common/init.h"
#include "loom/models/common/decoder.h"
#include "loom/models/loss.h"
#include "support/process.h"
#include "unit/model_test_util.h"

namespace llama = loom::models::llama;

namespace {

// Largest absolute difference relative to the largest reference magnitude.
double relative_error(const at::Tensor& got, const at::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  return (got.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>() /
         std::max(scale, 1e-30);
}

void write_args_json(const llama::LlamaArgs& a, const std::string& path) {
  nlohmann::json j = {{"dim", a.dim},
                      {"n_layers", a.n_layers},
                      {"n_heads", a.n_heads},
                      {"n_kv_heads", a.kv_heads()},
                      {"vocab_size", a.vocab_size},
                      {"multiple_of", a.multiple_of},
                      {"norm_eps", a.norm_eps},
                      {"rope_theta", a.rope_theta},
                      {"use_scaled_rope", a.use_scaled_rope},
                      {"max_seq_len", a.max_seq_len}};
  j["ffn_dim_multiplier"] =
      a.ffn_dim_multiplier ? nlohmann::json(*a.ffn_dim_multiplier) : nlohmann::json(nullptr);
  std::ofstream(path) << j.dump(2);
}

void check_against_reference(const llama::LlamaArgs& args, const std::string& name) {
  at::set_num_threads(1);
  const std::string dir = loom::testing::fresh_temp_dir("golden_" + name);
  loom::models::Transformer model(args, at::TensorOptions().dtype(at::kFloat));
  llama::init_weights(model, 1234);

  at::manual_seed(99);
  at::Tensor inputs = at::randint(0, args.vocab_size, {2, 24}, at::kLong);
  at::Tensor labels = at::randint(0, args.vocab_size, {2, 24}, at::kLong);
  labels.index_put_({0, at::indexing::Slice(0, 5)}, -100);  // some positions predict nothing
  labels[1][20] = -100;

  loom::checkpoint::NamedTensors weights;
  for (const auto& item : model->named_parameters()) weights.emplace_back(item.key(), item.value());
  loom::checkpoint::save_safetensors(dir + "/weights.safetensors", weights);
  loom::checkpoint::save_safetensors(dir + "/batch.safetensors",
                                     {{"inputs", inputs}, {"labels", labels}});
  write_args_json(args, dir + "/args.json");

  const std::string command = std::string("'") + LOOM_PYTHON + "' '" + LOOM_SOURCE_DIR +
                              "/tools/reference/llama_reference.py' golden --model-args '" + dir +
                              "/args.json' --weights '" + dir + "/weights.safetensors' --batch '" +
                              dir + "/batch.safetensors' --out '" + dir + "/reference.safetensors'";
  auto run = loom::testing::run_command(command);
  ASSERT_EQ(run.exit_code, 0) << "the Python reference failed (is the setup venv complete? "
                                 "scripts/setup.sh):\n"
                              << run.output;
  auto reference = loom::checkpoint::load_safetensors(dir + "/reference.safetensors").tensors;

  at::Tensor logits = model->forward(inputs);
  at::Tensor loss = loom::models::cross_entropy_sum(logits, labels) /
                    static_cast<double>(loom::models::count_valid_tokens(labels));
  loss.backward();

  EXPECT_LE(relative_error(logits.detach(), reference.at("logits")), 1e-5);
  EXPECT_LE(relative_error(loss.detach().reshape({1}), reference.at("loss")), 1e-5)
      << loss.item<double>() << " vs " << reference.at("loss").item<double>();
  int64_t compared = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string key = "grad." + item.key();
    ASSERT_TRUE(reference.count(key)) << key;
    ASSERT_TRUE(item.value().grad().defined()) << key;
    EXPECT_LE(relative_error(item.value().grad(), reference.at(key)), 1e-5) << key;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int64_t>(model->named_parameters().size()));
}

}  // namespace

TEST(Golden, GroupedQueryAttentionWithLlama31Rope) {
  llama::LlamaArgs args = loom::testing::tiny_llama_args();  // 4 heads sharing 2 kv heads
  args.rope_theta = 500000;
  args.use_scaled_rope = true;
  check_against_reference(args, "gqa");
}

TEST(Golden, DebugModelShapeWithFfnMultiplier) {
  llama::LlamaArgs args = llama::llama3_flavors().at("debugmodel");
  args.n_layers = 2;  // keep the test fast; every layer is the same code
  args.vocab_size = 512;
  args.ffn_dim_multiplier = 1.3;
  args.use_scaled_rope = false;
  args.rope_theta = 10000;
  args.max_seq_len = 24;
  check_against_reference(args, "debug");
}
