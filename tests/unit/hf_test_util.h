// Helpers of the Hugging Face family tests (a folder made by transformers, loaded by loom).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/checkpoint/hf.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/generate/generator.h"
#include "loom/generate/inference_model.h"
#include "support/process.h"

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

#ifdef LOOM_PYTHON
// The folders tools/`script` writes with the test venv's transformers (one per variant), under
// `name`. Every maker runs in one Python process (tools/make_hf_test_models.py), once per build
// tree for the same makers, Python, torch and transformers: the suites that need them share it.
inline std::vector<std::string> made_by_transformers(const std::string& script,
                                                     const std::string& name,
                                                     const std::vector<std::string>& variants) {
  static const std::vector<std::string> makers = {
      "make_hf_qwen3_model.py", "make_hf_qwen3_moe_model.py", "make_hf_deepseek_v3_model.py",
      "make_hf_deepseek_v3_mtp_model.py", "make_hf_gpt_oss_model.py"};
  if (std::find(makers.begin(), makers.end(), script) == makers.end()) {
    throw std::invalid_argument(script + " is not one of tools/make_hf_test_models.py's makers");
  }
  static const std::string made = [] {
    const std::string tools = std::string(LOOM_SOURCE_DIR) + "/tools/";
    const auto versions =
        run_command(std::string("'") + LOOM_PYTHON +
                    "' -c 'import importlib.metadata as m; print(m.version(\"torch\"), "
                    "m.version(\"transformers\"))'");
    std::string identity = std::string(LOOM_PYTHON) + "\n" + versions.output +
                           read_text(tools + "make_hf_test_models.py");
    for (const auto& maker : makers) identity += read_text(tools + maker);
    return shared_folder("hf_test_models",
                         std::string("'") + LOOM_PYTHON + "' '" + tools + "make_hf_test_models.py'",
                         identity);
  }();
  std::vector<std::string> folders;
  for (const auto& variant : variants) folders.push_back(made + "/" + name + "/" + variant);
  return folders;
}
#endif

// Imports a Hugging Face folder, exports the imported step again in float32, and checks that
// every tensor of the folder comes back bitwise under its name (and nothing else does). Returns
// the export's folder.
inline std::string expect_import_export_bitwise(const std::string& folder,
                                                const std::string& name) {
  const std::string checkpoint = fresh_temp_dir(name + "_ckpt");
  checkpoint::import_from_hf(folder, checkpoint);
  const std::string exported = fresh_temp_dir(name + "_export");
  checkpoint::HfExportOptions options;
  options.overwrite = true;
  options.dtype = "float32";
  checkpoint::export_to_hf(checkpoint + "/step-0", exported, options);
  const auto original = tensors_of(folder + "/model.safetensors");
  const auto back = tensors_of(exported + "/model.safetensors");
  EXPECT_EQ(original.size(), back.size()) << folder;
  for (const auto& [tensor_name, tensor] : original) {
    auto it = back.find(tensor_name);
    if (it == back.end()) {
      ADD_FAILURE() << folder << ": " << tensor_name << " is not in the export";
      continue;
    }
    EXPECT_TRUE(at::equal(tensor, it->second)) << folder << ": " << tensor_name;
  }
  return exported;
}

inline std::vector<int32_t> row_of(const at::Tensor& ids) {
  const at::Tensor row = ids.reshape({-1}).to(at::kInt).contiguous();
  return std::vector<int32_t>(row.data_ptr<int32_t>(), row.data_ptr<int32_t>() + row.numel());
}

// Greedy decoding with loom's cache from a family test's reference: its `prompt`, as many new
// tokens as its `greedy` holds (transformers' generate()), no BOS, no stop at EOS.
inline std::vector<int32_t> greedy_tokens(generate::InferenceModel& model,
                                          const std::map<std::string, at::Tensor>& reference) {
  generate::GenerationOptions options;
  options.max_new_tokens = reference.at("greedy").numel();
  options.stop_at_eos = false;
  options.add_bos = false;
  generate::Generator generator(model, options);
  const auto completions = generator.generate({row_of(reference.at("prompt"))}, 0);
  EXPECT_EQ(completions.size(), 1u);
  return completions.empty() ? std::vector<int32_t>{} : completions[0].tokens;
}

}  // namespace loom::testing
