// DeepSeek-V3's multi-token prediction (models/mtp.h) against the paper's definition: a tiny
// DeepseekV3ForCausalLM with two MTP layers laid out as DeepSeek publishes them, and the MTP loss
// computed by tools/make_hf_deepseek_v3_mtp_model.py from transformers' own decoder layer and
// norms (not from loom's code). Checked: loom's training loss and each depth's within 1e-5 of it,
// the folder's import and export bitwise (MTP layers and their copies of the embedding and head),
// a copy that differs refused by name, inference leaving the depths out, and the targets' shifts
// staying inside the row and the document.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/models/common/decoder_model.h"
#include "loom/models/loss.h"
#include "loom/models/model_spec.h"
#include "loom/models/mtp.h"
#include "support/test_sets.h"
#include "unit/hf_test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kDepths = 2;
constexpr double kScale = 0.3;  // the script's

std::string mtp_folder() {
  return loom::testing::made_by_transformers("make_hf_deepseek_v3_mtp_model.py", "deepseek_v3_mtp",
                                             {"mtp"})
      .front();
}

// The folder as a training model (its MTP layers too) on the CPU in float32.
std::unique_ptr<loom::models::CausalLM> training_model(const std::string& folder) {
  loom::models::BuildOptions options;
  options.tensor_options = at::TensorOptions().dtype(at::kFloat);
  auto source = loom::checkpoint::hf_model(folder, options);
  auto weights = loom::checkpoint::read_hf_weights(folder, *source.spec, *source.model);
  at::NoGradGuard no_grad;
  auto buffers = source.model->named_state_buffers();
  for (auto& [name, tensor] : weights) {
    bool buffer = false;
    for (auto& [buffer_name, value] : buffers) {
      if (buffer_name == name) {
        value.copy_(tensor);
        buffer = true;
      }
    }
    if (!buffer) source.model->replace_parameter(name, tensor.clone().requires_grad_(true));
  }
  source.model->init_buffers(at::kCPU);
  for (auto& [name, value] : source.model->named_state_buffers()) {
    if (weights.count(name)) value.copy_(weights.at(name));
  }
  return std::move(source.model);
}

}  // namespace

LOOM_TEST(Mtp, TargetsShiftWithinTheRowAndTheDocument) {
  // Two documents in the row: [A0 A1 A2 | B0 B1 B2 B3], labels the next tokens (B3's unknown).
  const at::Tensor inputs = at::tensor({10, 11, 12, 20, 21, 22, 23}, at::kLong).view({1, 7});
  const at::Tensor labels = at::tensor({11, 12, 20, 21, 22, 23, -100}, at::kLong).view({1, 7});
  const at::Tensor documents = at::tensor({0, 0, 0, 1, 1, 1, 1}, at::kLong).view({1, 7});
  const auto packed = loom::models::mtp_targets(inputs, labels, documents, 2);
  auto row = [](const at::Tensor& t) {
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  };
  EXPECT_EQ(row(packed.tokens[0].contiguous()), (std::vector<int64_t>{11, 12, 0, 21, 22, 23, 0}));
  EXPECT_EQ(row(packed.labels[0].contiguous()),
            (std::vector<int64_t>{12, 20, -100, 22, 23, -100, -100}));
  EXPECT_EQ(row(packed.tokens[1].contiguous()), (std::vector<int64_t>{12, 0, 0, 22, 23, 0, 0}));
  EXPECT_EQ(row(packed.labels[1].contiguous()),
            (std::vector<int64_t>{20, -100, -100, 23, -100, -100, -100}));
  // One sequence (causal): the shifts cross the boundary, only the row's end stops them.
  const auto causal = loom::models::mtp_targets(inputs, labels, at::Tensor(), 2);
  EXPECT_EQ(row(causal.tokens[1].contiguous()), (std::vector<int64_t>{12, 20, 21, 22, 23, 0, 0}));
  EXPECT_EQ(row(causal.labels[0].contiguous()),
            (std::vector<int64_t>{12, 20, 21, 22, 23, -100, -100}));
}

LOOM_TEST(HfDeepseekV3Mtp, TrainingLossEqualsThePapersDefinition) {
  const std::string folder = mtp_folder();
  auto reference = loom::testing::tensors_of(folder + "/reference.safetensors");
  auto model = training_model(folder);
  const auto& args = loom::models::decoder_args(*model);
  ASSERT_EQ(args.num_mtp_layers, kDepths);
  ASSERT_EQ(args.n_layers, 4);
  const at::Tensor& inputs = reference.at("inputs");
  const at::Tensor& labels = reference.at("labels");
  const auto targets = loom::models::mtp_targets(inputs, labels, at::Tensor(), kDepths);
  loom::models::TokenLayout layout;
  layout.mtp_tokens = loom::models::depths_side_by_side({targets.tokens[0], targets.tokens[1]});
  const at::Tensor all_labels =
      loom::models::depths_side_by_side({labels, targets.labels[0], targets.labels[1]});
  const at::Tensor output = model->forward(inputs, layout);
  ASSERT_EQ(output.size(0), (1 + kDepths) * inputs.size(0));
  std::vector<at::Tensor> depth_sums;
  const at::Tensor loss = loom::models::mtp_loss_sum(
      [](const at::Tensor& logits, const at::Tensor& target) {
        return loom::models::cross_entropy_sum(logits, target);
      },
      output, all_labels, kDepths, kScale, &depth_sums);
  const double want = reference.at("loss").item<double>();
  EXPECT_LT(std::abs(loss.item<double>() - want), 1e-5 * std::abs(want))
      << loss.item<double>() << " vs " << want;
  ASSERT_EQ(depth_sums.size(), static_cast<size_t>(kDepths));
  for (int64_t k = 0; k < kDepths; ++k) {
    const double depth = depth_sums[static_cast<size_t>(k)][0].item<double>();
    const double depth_want = reference.at("depth_losses")[k].item<double>();
    EXPECT_LT(std::abs(depth - depth_want), 1e-5 * std::abs(depth_want)) << "depth " << k + 1;
    // Depth k has k fewer targets than the row, and the ignored labels' shadows.
    EXPECT_EQ(depth_sums[static_cast<size_t>(k)][1].item<int64_t>(),
              loom::models::count_valid_tokens(targets.labels[k]));
  }
  EXPECT_LT((output.narrow(0, 0, inputs.size(0)) - reference.at("main_logits"))
                .abs()
                .max()
                .item<double>(),
            1e-5);
  // Gradients reach every depth's own modules and the shared table.
  loss.backward();
  auto& transformer = dynamic_cast<loom::models::DecoderModel&>(*model).transformer();
  for (int64_t k = 0; k < kDepths; ++k) {
    auto& block = transformer->blocks.at(static_cast<size_t>(4 + k));
    ASSERT_TRUE(block->eh_proj && block->enorm && block->hnorm && block->mtp_norm);
    EXPECT_GT(block->eh_proj->weight.grad().abs().sum().item<double>(), 0) << k;
  }
  // Without the depths' tokens (validation, inference) the model predicts the next token only.
  EXPECT_EQ(model->forward(inputs).sizes(), reference.at("main_logits").sizes());
}

LOOM_TEST(HfDeepseekV3Mtp, ImportThenExportWritesTheMtpLayersBack) {
  const std::string folder = mtp_folder();
  const std::string exported = loom::testing::expect_import_export_bitwise(folder, "deepseek_v3");
  const json config = json::parse(std::ifstream(exported + "/config.json"));
  EXPECT_EQ(config.at("num_nextn_predict_layers"), kDepths);
  const auto written = loom::checkpoint::load_safetensors(exported + "/model.safetensors");
  bool copy = false;
  for (const auto& [name, tensor] : written.tensors) {
    copy = copy || name == "model.layers.5.shared_head.head.weight";
  }
  EXPECT_TRUE(copy);
  // Inference builds no depth: the folder's MTP layers are left out.
  auto inference = loom::testing::load_hf_folder(folder, "deepseek_v3");
  EXPECT_EQ(loom::models::decoder_args(*inference.model).num_mtp_layers, 0);
}

LOOM_TEST(HfDeepseekV3Mtp, ACopyOfTheHeadThatDiffersIsRefused) {
  const std::string folder = loom::testing::fresh_temp_dir("deepseek_v3_mtp_copy");
  fs::copy(mtp_folder(), folder, fs::copy_options::recursive);
  auto tensors = loom::testing::tensors_of(folder + "/model.safetensors");
  tensors["model.layers.4.shared_head.head.weight"].add_(1.0);
  loom::checkpoint::NamedTensors named;
  for (auto& [name, tensor] : tensors) named.emplace_back(name, tensor);
  loom::checkpoint::save_safetensors(folder + "/model.safetensors", named);
  try {
    loom::checkpoint::import_from_hf(folder, loom::testing::fresh_temp_dir("mtp_copy_ckpt"));
    FAIL() << "a folder whose MTP head copy differs was imported";
  } catch (const loom::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.4.shared_head.head.weight' differs from "
                                         "the model's lm_head.weight"),
              std::string::npos)
        << e.what();
  }
}

// `config validate` and the trainer's pre-flight refuse depths a family cannot train, by key.
LOOM_TEST(Mtp, DepthsAFamilyCannotTrainAreRefusedWithTheKey) {
  auto refusal = [](const std::string& name, const std::string& flavor, int64_t depths) {
    loom::config::JobConfig c;
    c.model.name = name;
    c.model.flavor = flavor;
    c.model.num_mtp_layers = depths;
    try {
      loom::models::find_model_spec(name, flavor).check_parallelism(c);
    } catch (const loom::InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal("llama3", "debugmodel", 1)
                .find("model.num_mtp_layers = 1: multi-token "
                      "prediction is DeepSeek-V3's"),
            std::string::npos);
  EXPECT_NE(refusal("deepseek_v3", "debugmodel", 65).find("num_mtp_layers is 65"),
            std::string::npos);
  EXPECT_EQ(refusal("deepseek_v3", "debugmodel", 2), "accepted");
  EXPECT_EQ(refusal("llama3", "debugmodel", 0), "accepted");
}
