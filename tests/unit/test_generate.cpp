// The KV-cache forward against the full forward, left-padded batches against single rows,
// sampling rules, streamed text with stop strings, and the generator end to end on a tiny model.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>

#include "loom/core/check.h"
#include "loom/data/tokenizer.h"
#include "loom/generate/generator.h"
#include "loom/generate/prompts.h"
#include "loom/models/common/init.h"
#include "loom/models/common/kv_cache.h"
#include "loom/models/deepseek_v3/args.h"
#include "loom/models/llama/init.h"
#include "support/process.h"
#include "unit/model_test_util.h"

namespace loom {
namespace {

using loom::models::forward_cached;
using loom::models::KVCache;
using loom::models::Transformer;

Transformer tiny_model(int64_t vocab = 97, uint64_t seed = 7) {
  auto args = testing::tiny_llama_args();
  args.vocab_size = vocab;
  args.max_seq_len = 48;
  Transformer model(args, at::TensorOptions().dtype(at::kFloat));
  models::llama::init_weights(model, seed);
  model->init_freqs_cis(at::kCPU);
  return model;
}

// The same size with multi-head latent attention (DeepSeek-V3's: q bottleneck, YaRN beyond 16
// positions with rotations of magnitude != 1): its cache holds latents, not keys and values.
Transformer tiny_latent_model(uint64_t seed = 7) {
  auto args = testing::tiny_llama_args();
  args.max_seq_len = 48;
  args.n_kv_heads.reset();
  args.use_scaled_rope = false;
  args.mla = models::MLAArgs{8, 16, 8, 8, 12, 1e-6};
  models::YarnScaling yarn;
  yarn.factor = 4.0;
  yarn.original_max_position_embeddings = 16;
  yarn.mscale = 1.0;
  yarn.mscale_all_dim = 0.5;
  args.yarn = yarn;
  Transformer model(args, at::TensorOptions().dtype(at::kFloat));
  models::init_weights(model, seed, models::deepseek_v3::init_parameter);
  model->init_freqs_cis(at::kCPU);
  return model;
}

// gpt-oss's attention: the first layer sees its last 3 keys, both layers have sinks (drawn away
// from zero, so they weigh in).
Transformer tiny_windowed_model(uint64_t seed = 7) {
  auto args = testing::tiny_llama_args();
  args.vocab_size = 97;
  args.max_seq_len = 48;
  args.layer_windows = {3, 0};
  args.attention_sinks = true;
  Transformer model(args, at::TensorOptions().dtype(at::kFloat));
  models::llama::init_weights(model, seed);
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& block : model->blocks) block->attention->sinks().normal_(0.0, 1.0, generator);
  model->init_freqs_cis(at::kCPU);
  return model;
}

// Every attention the cache serves: grouped-query, latent, and windowed with sinks.
std::vector<Transformer> every_attention() {
  return {tiny_model(), tiny_latent_model(), tiny_windowed_model()};
}

at::Tensor random_tokens(int64_t rows, int64_t length, int64_t vocab, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {rows, length}, generator, at::kLong);
}

TEST(KVCache, IncrementalDecodingMatchesTheFullForward) {
  for (Transformer model : every_attention()) {
    SCOPED_TRACE(model->args.mla                     ? "latent attention"
                 : model->args.layer_windows.empty() ? "grouped-query attention"
                                                     : "sliding window and sinks");
    at::NoGradGuard no_grad;
    const at::Tensor tokens = random_tokens(2, 12, 97, 1);
    const at::Tensor full = model->forward(tokens);
    // Prefill 5, then a chunk of 4 (a causal mask at an offset), then one token at a time.
    KVCache cache(model->args, 2, 12, at::TensorOptions().dtype(at::kFloat));
    std::vector<at::Tensor> parts;
    parts.push_back(forward_cached(*model, tokens.slice(1, 0, 5), cache));
    parts.push_back(forward_cached(*model, tokens.slice(1, 5, 9), cache));
    for (int64_t i = 9; i < 12; ++i)
      parts.push_back(forward_cached(*model, tokens.slice(1, i, i + 1), cache));
    const at::Tensor cached = at::cat(parts, 1);
    EXPECT_EQ(cache.length(), 12);
    EXPECT_LT((cached - full).abs().max().item<double>(), 2e-5);
    // last_only returns the last slot's logits alone.
    KVCache again(model->args, 2, 12, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor last = forward_cached(*model, tokens, again, /*last_only=*/true);
    EXPECT_EQ(last.size(1), 1);
    EXPECT_LT((last.select(1, 0) - full.select(1, 11)).abs().max().item<double>(), 2e-5);
  }
}

TEST(KVCache, LeftPaddedRowsComputeWhatTheyWouldAlone) {
  for (Transformer model : every_attention()) {
    SCOPED_TRACE(model->args.mla                     ? "latent attention"
                 : model->args.layer_windows.empty() ? "grouped-query attention"
                                                     : "sliding window and sinks");
    at::NoGradGuard no_grad;
    const std::vector<int64_t> lengths = {3, 7, 5};
    const int64_t longest = 7, steps = 4;
    const at::Tensor prompts = random_tokens(3, longest, 97, 2);
    const at::Tensor continuation = random_tokens(3, steps, 97, 3);
    std::vector<int64_t> padding;
    at::Tensor batch = at::zeros({3, longest}, at::kLong);
    for (int64_t r = 0; r < 3; ++r) {
      padding.push_back(longest - lengths[r]);
      batch[r].slice(0, padding[r]).copy_(prompts[r].slice(0, 0, lengths[r]));
    }
    KVCache cache(model->args, 3, longest + steps, at::TensorOptions().dtype(at::kFloat), padding);
    std::vector<at::Tensor> batched = {forward_cached(*model, batch, cache, true)};
    for (int64_t s = 0; s < steps; ++s) {
      batched.push_back(forward_cached(*model, continuation.slice(1, s, s + 1), cache));
    }
    for (int64_t r = 0; r < 3; ++r) {
      // The row alone, without cache: its prompt and continuation in one full forward.
      at::Tensor alone =
          at::cat({prompts[r].slice(0, 0, lengths[r]), continuation[r]}).unsqueeze(0);
      at::Tensor full = model->forward(alone);
      for (int64_t s = 0; s <= steps; ++s) {
        at::Tensor expected = full[0][lengths[r] - 1 + s];
        EXPECT_LT((batched[static_cast<size_t>(s)][r][0] - expected).abs().max().item<double>(),
                  2e-5)
            << "row " << r << " step " << s;
      }
    }
  }
}

TEST(KVCache, DroppedRowsLeaveTheOthersUnchanged) {
  for (Transformer model : every_attention()) {
    SCOPED_TRACE(model->args.mla                     ? "latent attention"
                 : model->args.layer_windows.empty() ? "grouped-query attention"
                                                     : "sliding window and sinks");
    at::NoGradGuard no_grad;
    const at::Tensor tokens = random_tokens(3, 9, 97, 4);
    KVCache cache(model->args, 3, 9, at::TensorOptions().dtype(at::kFloat), {2, 0, 1});
    at::Tensor prompt = tokens.slice(1, 0, 6).clone();
    forward_cached(*model, prompt, cache);
    cache.keep_rows({0, 2});
    EXPECT_EQ(cache.batch(), 2);
    at::Tensor step = at::stack({tokens[0][6], tokens[2][6]}).view({2, 1});
    at::Tensor out = forward_cached(*model, step, cache);
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t r = k == 0 ? 0 : 2, pad = r == 0 ? 2 : 1;
      at::Tensor alone = tokens[r].slice(0, pad, 7).unsqueeze(0);
      at::Tensor full = model->forward(alone);
      EXPECT_LT((out[k][0] - full[0][-1]).abs().max().item<double>(), 2e-5);
    }
  }
}

TEST(KVCache, PositionsBeyondTheContextAreRejected) {
  Transformer model = tiny_model();
  KVCache cache(model->args, 1, 64, at::TensorOptions().dtype(at::kFloat));
  EXPECT_THROW(forward_cached(*model, random_tokens(1, 49, 97, 5), cache), InputError);
}

TEST(Sampling, GreedyTopKTopPAndRepetitionPenaltyFollowTransformers) {
  const at::Tensor logits = at::tensor({1.0, 3.0, 2.0, -1.0, 0.5}, at::kFloat);
  generate::SamplingOptions greedy;
  auto generator = generate::sequence_generator(1, 0);
  EXPECT_EQ(generate::sample_token(logits, {}, greedy, generator), 1);
  // Repetition penalty: positive logits divided, negative multiplied.
  greedy.repetition_penalty = 2.0;
  at::Tensor penalized = generate::process_logits(logits, {1, 3}, greedy);
  EXPECT_FLOAT_EQ(penalized[1].item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(penalized[3].item<float>(), -2.0f);
  EXPECT_EQ(generate::sample_token(logits, {1}, greedy, generator), 2);

  generate::SamplingOptions top_k;
  top_k.temperature = 1.0;
  top_k.top_k = 2;
  at::Tensor kept = generate::process_logits(logits, {}, top_k);
  EXPECT_EQ(at::isfinite(kept).sum().item<int64_t>(), 2);
  EXPECT_TRUE(at::isfinite(kept[1]).item<bool>() && at::isfinite(kept[2]).item<bool>());

  // top_p: the most likely tokens until their mass reaches p.
  generate::SamplingOptions top_p;
  top_p.temperature = 1.0;
  top_p.top_p = 0.7;  // softmax: 0.63 (id 1) + 0.23 (id 2) reaches 0.7
  kept = generate::process_logits(logits, {}, top_p);
  EXPECT_EQ(at::isfinite(kept).sum().item<int64_t>(), 2);
  top_p.top_p = 0.5;
  EXPECT_EQ(at::isfinite(generate::process_logits(logits, {}, top_p)).sum().item<int64_t>(), 1);

  // A temperature near the smallest float leaves the most likely token alone, never NaN.
  generate::SamplingOptions cold;
  cold.temperature = 1e-38;
  at::Tensor frozen = generate::process_logits(logits, {}, cold);
  EXPECT_FALSE(at::isnan(frozen).any().item<bool>());
  // The others go to -inf or to about -1e38 (finite in float32): no mass either way.
  const at::Tensor probabilities = at::softmax(frozen, 0);
  EXPECT_EQ(probabilities[1].item<float>(), 1.0f);
  EXPECT_EQ(probabilities.sum().item<float>(), 1.0f);
  EXPECT_EQ(generate::sample_token(logits, {}, cold, generator), 1);

  generate::SamplingOptions bad;
  bad.top_p = 0;
  EXPECT_THROW(bad.validate(), InputError);
}

TEST(Sampling, DrawsFollowTheDistributionAndRepeatWithTheSeed) {
  const at::Tensor logits = at::log(at::tensor({0.7, 0.2, 0.1}, at::kFloat));
  generate::SamplingOptions options;
  options.temperature = 1.0;
  auto a = generate::sequence_generator(5, 3), b = generate::sequence_generator(5, 3);
  std::vector<int> counts(3, 0);
  for (int i = 0; i < 3000; ++i) {
    const int32_t x = generate::sample_token(logits, {}, options, a);
    EXPECT_EQ(x, generate::sample_token(logits, {}, options, b));
    ++counts[static_cast<size_t>(x)];
  }
  EXPECT_NEAR(counts[0] / 3000.0, 0.7, 0.04);
  EXPECT_NEAR(counts[1] / 3000.0, 0.2, 0.04);
  EXPECT_NEAR(counts[2] / 3000.0, 0.1, 0.04);
}

std::vector<int32_t> byte_ids(const std::string& text) {
  return data::ByteTokenizer().encode(text);
}

TEST(StreamingText, HoldsBackPossibleStopStringsAndPartialCharacters) {
  data::ByteTokenizer tokenizer;
  generate::StreamingText text(tokenizer, {"STOP"});
  std::string emitted;
  for (int32_t id : byte_ids("hello wor")) emitted += text.push(id);
  EXPECT_EQ(emitted, "hello ");  // "wor" could still begin "STOP"? no, but 3 bytes are held
  for (int32_t id : byte_ids("ld ST")) emitted += text.push(id);
  EXPECT_FALSE(text.stopped());
  for (int32_t id : byte_ids("OP and more")) emitted += text.push(id);
  EXPECT_TRUE(text.stopped());
  emitted += text.finish();
  EXPECT_EQ(emitted, "hello world ");
  EXPECT_EQ(text.text(), "hello world ");

  generate::StreamingText utf8(tokenizer, {});
  const auto e_acute = byte_ids("\xC3\xA9");
  EXPECT_EQ(utf8.push(e_acute[0]), "");
  EXPECT_EQ(utf8.push(e_acute[1]), "\xC3\xA9");
  EXPECT_EQ(generate::complete_utf8_prefix("ab\xE2\x82", 4), 2u);
  EXPECT_EQ(generate::complete_utf8_prefix("ab\xE2\x82\xAC", 5), 5u);
}

// A model over the byte tokenizer's vocabulary.
generate::InferenceModel byte_model() {
  generate::InferenceModel m;
  auto args = testing::tiny_llama_args();
  args.vocab_size = 259;
  args.max_seq_len = 48;
  m.model = testing::decoder_lm(args, 11);
  m.tokenizer = std::make_unique<data::ByteTokenizer>();
  m.format = "test";
  return m;
}

TEST(Generator, GreedyWithTheCacheEqualsRecomputingEveryStep) {
  auto m = byte_model();
  generate::GenerationOptions options;
  options.max_new_tokens = 12;
  options.stop_at_eos = false;
  generate::Generator generator(m, options);
  const auto prompt = generator.encode_prompt("The cat");
  const auto out = generator.generate({prompt}, 0);
  ASSERT_EQ(out[0].tokens.size(), 12u);
  EXPECT_EQ(out[0].finish_reason, "length");
  std::vector<int64_t> sequence(prompt.begin(), prompt.end());
  at::NoGradGuard no_grad;
  for (int i = 0; i < 12; ++i) {
    at::Tensor logits = m.model->forward(at::tensor(sequence, at::kLong).unsqueeze(0));
    sequence.push_back(logits[0][-1].argmax().item<int64_t>());
    EXPECT_EQ(sequence.back(), out[0].tokens[static_cast<size_t>(i)]) << "token " << i;
  }
}

TEST(Generator, BatchedPromptsEqualOneByOneGreedyAndSampled) {
  auto m = byte_model();
  for (double temperature : {0.0, 0.9}) {
    generate::GenerationOptions options;
    options.max_new_tokens = 10;
    options.sampling.temperature = temperature;
    options.sampling.top_k = temperature > 0 ? 40 : 0;
    options.sampling.seed = 3;
    generate::Generator generator(m, options);
    std::vector<std::vector<int32_t>> prompts = {generator.encode_prompt("a"),
                                                 generator.encode_prompt("Once upon a time"),
                                                 generator.encode_prompt("xyz 123")};
    const auto batched = generator.generate(prompts, 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto alone = generator.generate({prompts[i]}, i);
      EXPECT_EQ(alone[0].tokens, batched[i].tokens) << "prompt " << i << " T=" << temperature;
      EXPECT_EQ(alone[0].text, batched[i].text);
    }
  }
}

TEST(Generator, PromptsMustLeaveRoomInTheContext) {
  auto m = byte_model();
  generate::GenerationOptions options;
  options.stop_at_eos = false;
  options.max_new_tokens = int64_t{1} << 40;  // the cache is sized by the context, not this
  generate::Generator generator(m, options);
  const auto prompt = generator.encode_prompt(std::string(47, 'a'));  // BOS + 47 = 48 = context
  EXPECT_THROW(generator.check_fits(prompt, "--prompt"), InputError);
  try {
    generator.check_fits(prompt, "p.jsonl:3");
  } catch (const InputError& e) {
    EXPECT_NE(e.message().find("p.jsonl:3"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("48 tokens"), std::string::npos) << e.message();
  }
  // Generation stops at the context: 47 prompt tokens leave one; 40 leave 8, also when batched
  // with a longer prompt.
  const auto out = generator.generate({generator.encode_prompt(std::string(46, 'a')),
                                       generator.encode_prompt(std::string(39, 'b'))},
                                      0);
  EXPECT_EQ(out[0].tokens.size(), 1u);
  EXPECT_EQ(out[0].finish_reason, "length");
  EXPECT_EQ(out[1].tokens.size(), 8u);
  EXPECT_EQ(out[1].finish_reason, "length");
}

TEST(Prompts, BadLinesAreNamedByLine) {
  const std::string dir = testing::fresh_temp_dir("prompts_unit");
  const std::string path = dir + "/p.jsonl";
  std::ofstream(path)
      << "{\"prompt\": \"one\", \"id\": 7}\n\n{\"text\": \"two\"}\n{\"prompt\": 3}\n";
  try {
    generate::read_prompts(path);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(e.message().find(path + ":4"), std::string::npos) << e.message();
  }
  std::ofstream(path) << "{\"prompt\": \"one\", \"id\": 7}\n\n{\"text\": \"two\"}\n";
  const auto prompts = generate::read_prompts(path);
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_EQ(prompts[0].id, 7);
  EXPECT_EQ(prompts[1].text, "two");
  EXPECT_EQ(prompts[1].where, path + ":3");
  std::ofstream(path) << "not json\n";
  EXPECT_THROW(generate::read_prompts(path), InputError);
}

}  // namespace
}  // namespace loom
