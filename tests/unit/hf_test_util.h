// Helpers of the Hugging Face family tests (a folder made by transformers, loaded by loom).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "loom/checkpoint/safetensors.h"
#include "loom/generate/inference_model.h"

namespace loom::testing {

inline std::map<std::string, at::Tensor> tensors_of(const std::string& file) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, tensor] : checkpoint::load_safetensors(file).tensors) out[name] = tensor;
  return out;
}

// A Hugging Face folder as loom's inference model on the CPU (byte tokenizer), of `family`.
inline generate::InferenceModel load_hf_folder(const std::string& folder,
                                               const std::string& family) {
  generate::ModelSource source;
  source.checkpoint = folder;
  source.tokenizer = "byte";
  source.device = "cpu";
  auto model = generate::load_inference_model(source);
  EXPECT_EQ(model.spec->name, family);
  EXPECT_EQ(model.format, "huggingface");
  return model;
}

inline std::vector<int32_t> row_of(const at::Tensor& ids) {
  const at::Tensor row = ids.reshape({-1}).to(at::kInt).contiguous();
  return std::vector<int32_t>(row.data_ptr<int32_t>(), row.data_ptr<int32_t>() + row.numel());
}

}  // namespace loom::testing
