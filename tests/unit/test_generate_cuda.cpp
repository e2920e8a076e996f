// The KV-cache path and the generator on a GPU (label "cuda"): float32 against the CPU, bfloat16
// cached against bfloat16 full forwards, batched against one by one.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "loom/data/tokenizer.h"
#include "loom/generate/generator.h"
#include "loom/models/llama/init.h"
#include "loom/models/common/init.h"
#include "loom/models/common/kv_cache.h"
#include "unit/model_test_util.h"

namespace loom {
namespace {

loom::models::Transformer cuda_model(at::ScalarType dtype, loom::models::Transformer* cpu_copy) {
  auto args = testing::tiny_llama_args();
  args.vocab_size = 259;
  args.max_seq_len = 48;
  loom::models::Transformer cpu(args, at::TensorOptions().dtype(at::kFloat));
  models::llama::init_weights(cpu, 3);
  cpu->init_freqs_cis(at::kCPU);
  loom::models::Transformer gpu(args, at::TensorOptions().dtype(dtype).device(at::kCUDA));
  at::NoGradGuard no_grad;
  auto src = cpu->named_parameters();
  for (auto& item : gpu->named_parameters()) item.value().copy_(src[item.key()]);
  gpu->init_freqs_cis(at::kCUDA);
  if (cpu_copy) *cpu_copy = cpu;
  return gpu;
}

TEST(CudaGenerate, CachedForwardMatchesCpuAndFullForward) {
  ASSERT_TRUE(at::hasCUDA()) << "run the cuda label on a GPU machine only";
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor tokens = at::randint(259, {2, 10}, generator, at::kLong);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    loom::models::Transformer cpu{nullptr};
    auto gpu = cuda_model(dtype, &cpu);
    at::NoGradGuard no_grad;
    loom::models::KVCache cache(gpu->args, 2, 10, gpu->tok_embeddings->weight.options(), {3, 0});
    at::Tensor padded = tokens.clone();
    padded[0].slice(0, 0, 3).fill_(0);
    std::vector<at::Tensor> parts = {
        loom::models::forward_cached(*gpu, padded.slice(1, 0, 6).cuda(), cache)};
    for (int64_t i = 6; i < 10; ++i) {
      parts.push_back(loom::models::forward_cached(*gpu, padded.slice(1, i, i + 1).cuda(), cache));
    }
    const at::Tensor cached = at::cat(parts, 1).cpu();
    // Row 1 has no padding: the whole sequence at once; row 0 starts after its 3 pad slots.
    const at::Tensor reference = dtype == at::kFloat ? cpu->forward(tokens.slice(0, 1, 2))
                                                     : gpu->forward(tokens.slice(0, 1, 2).cuda()).cpu();
    const double tolerance = dtype == at::kFloat ? 1e-3 : 1e-1;
    EXPECT_LT((cached[1] - reference[0]).abs().max().item<double>(), tolerance);
    const at::Tensor row0 = dtype == at::kFloat
                                ? cpu->forward(tokens.slice(0, 0, 1).slice(1, 3))
                                : gpu->forward(tokens.slice(0, 0, 1).slice(1, 3).cuda()).cpu();
    EXPECT_LT((cached[0].slice(0, 3) - row0[0]).abs().max().item<double>(), tolerance);
  }
}

TEST(CudaGenerate, BatchedGreedyEqualsOneByOne) {
  ASSERT_TRUE(at::hasCUDA()) << "run the cuda label on a GPU machine only";
  generate::InferenceModel m;
  auto args = testing::tiny_llama_args();
  args.vocab_size = 259;
  args.max_seq_len = 48;
  auto lm = testing::decoder_lm(args, 3, at::TensorOptions().device(at::kCUDA));
  m.model = std::move(lm);
  m.tokenizer = std::make_unique<data::ByteTokenizer>();
  generate::GenerationOptions options;
  options.max_new_tokens = 8;
  options.stop_at_eos = false;
  generate::Generator generator(m, options);
  std::vector<std::vector<int32_t>> prompts = {generator.encode_prompt("ab"),
                                               generator.encode_prompt("a longer prompt")};
  const auto batched = generator.generate(prompts, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(generator.generate({prompts[i]}, i)[0].tokens, batched[i].tokens) << i;
  }
}

}  // namespace
}  // namespace loom
