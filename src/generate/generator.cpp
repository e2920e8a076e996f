#include "loom/generate/generator.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "loom/core/check.h"
#include "loom/models/llama/kv_cache.h"

namespace loom::generate {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One prompt in flight.
struct Row {
  size_t index;  // position in the caller's batch
  std::vector<int32_t> sequence;
  size_t prompt_length;
  at::Generator generator;
  StreamingText text;
  std::optional<std::string> finished;
};

}  // namespace

void GenerationOptions::validate() const {
  LOOM_CHECK_AS(InputError, max_new_tokens > 0, "--max-new-tokens must be positive, got ",
                max_new_tokens);
  for (const auto& s : stop) LOOM_CHECK_AS(InputError, !s.empty(), "--stop: empty stop string");
  sampling.validate();
}

size_t complete_utf8_prefix(const std::string& text, size_t limit) {
  limit = std::min(limit, text.size());
  // Back up to the first byte of the last character that starts before `limit`.
  size_t start = limit;
  while (start > 0 && (static_cast<unsigned char>(text[start - 1]) & 0xC0) == 0x80 &&
         limit - start < 3) {
    --start;
  }
  if (start == 0) return limit;
  const auto lead = static_cast<unsigned char>(text[start - 1]);
  const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return (limit - (start - 1) >= length) ? limit : start - 1;
}

StreamingText::StreamingText(const data::Tokenizer& tokenizer, std::vector<std::string> stop)
    : tokenizer_(tokenizer), stop_(std::move(stop)) {
  for (const auto& s : stop_) hold_ = std::max(hold_, s.size() - 1);
}

std::string StreamingText::push(int32_t token) {
  if (stopped_) return {};
  ids_.push_back(token);
  text_ = tokenizer_.decode(ids_);
  size_t cut = std::string::npos;
  for (const auto& s : stop_) cut = std::min(cut, text_.find(s));
  size_t safe = text_.size() > hold_ ? text_.size() - hold_ : 0;
  if (cut != std::string::npos) {
    text_.resize(cut);
    stopped_ = true;
    safe = cut;
  } else {
    safe = complete_utf8_prefix(text_, safe);
  }
  if (safe <= emitted_) return {};
  std::string piece = text_.substr(emitted_, safe - emitted_);
  emitted_ = safe;
  return piece;
}

std::string StreamingText::finish() {
  std::string rest = emitted_ < text_.size() ? text_.substr(emitted_) : std::string();
  emitted_ = text_.size();
  return rest;
}

Generator::Generator(InferenceModel& model, GenerationOptions options)
    : model_(model), options_(std::move(options)) {
  options_.validate();
}

std::vector<int32_t> Generator::encode_prompt(const std::string& text) const {
  std::vector<int32_t> ids;
  if (options_.add_bos) ids.push_back(model_.tokenizer->bos_id());
  const auto body = model_.tokenizer->encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

void Generator::check_fits(const std::vector<int32_t>& prompt, const std::string& what) const {
  LOOM_CHECK_AS(InputError, !prompt.empty(), what, ": the prompt is empty (and --no-bos is set)");
  LOOM_CHECK_AS(InputError, static_cast<int64_t>(prompt.size()) < model_.context(), what,
                ": the prompt has ", prompt.size(), " tokens, the model's context is ",
                model_.context(), " (at least one token must remain for generation)");
}

std::vector<Completion> Generator::generate(const std::vector<std::vector<int32_t>>& prompts,
                                            uint64_t first_index, const TextSink& sink) {
  at::NoGradGuard no_grad;
  if (prompts.empty()) return {};
  auto& model = *model_.model;
  const at::Device device = model_.device();
  const auto& tokenizer = *model_.tokenizer;
  const int64_t vocab = std::min<int64_t>(tokenizer.vocab_size(), model.args.vocab_size);
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    check_fits(prompts[i], "prompt " + std::to_string(first_index + i));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[i].size()));
  }
  std::vector<Row> rows;
  std::vector<int64_t> padding;
  at::Tensor batch = at::zeros({static_cast<int64_t>(prompts.size()), longest}, at::kLong);
  auto batch_ids = batch.accessor<int64_t, 2>();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    const int64_t pad = longest - static_cast<int64_t>(p.size());
    padding.push_back(pad);
    for (size_t j = 0; j < p.size(); ++j) batch_ids[static_cast<int64_t>(i)][pad + static_cast<int64_t>(j)] = p[j];
    rows.push_back({i, p, p.size(), sequence_generator(options_.sampling.seed, first_index + i),
                    StreamingText(tokenizer, options_.stop), std::nullopt});
    stats_.prompt_tokens += static_cast<int64_t>(p.size());
  }
  const auto options = model.tok_embeddings->weight.options();
  models::llama::KVCache cache(model.args, static_cast<int64_t>(rows.size()),
                               longest + options_.max_new_tokens, options, padding);
  std::vector<Completion> out(prompts.size());
  std::vector<size_t> live(rows.size());  // rows in the cache, in cache order
  for (size_t i = 0; i < live.size(); ++i) live[i] = i;

  auto start = Clock::now();
  at::Tensor logits = models::llama::forward_cached(model, batch.to(device), cache, true);
  bool first = true;
  const bool batched_argmax =
      options_.sampling.greedy() && options_.sampling.repetition_penalty == 1.0;
  while (!live.empty()) {
    at::Tensor last = logits.select(1, 0).slice(1, 0, vocab);  // [live, vocab]
    std::vector<int32_t> next(live.size());
    if (batched_argmax) {
      at::Tensor ids = last.argmax(1).cpu();
      auto id = ids.accessor<int64_t, 1>();
      for (size_t r = 0; r < live.size(); ++r) next[r] = static_cast<int32_t>(id[static_cast<int64_t>(r)]);
    } else {
      for (size_t r = 0; r < live.size(); ++r) {
        Row& row = rows[live[r]];
        next[r] = sample_token(last[static_cast<int64_t>(r)], row.sequence, options_.sampling,
                               row.generator);
      }
    }
    std::vector<int64_t> keep;
    std::vector<size_t> still_live;
    for (size_t r = 0; r < live.size(); ++r) {
      Row& row = rows[live[r]];
      const int32_t token = next[r];
      row.sequence.push_back(token);
      const auto generated = static_cast<int64_t>(row.sequence.size() - row.prompt_length);
      if (options_.stop_at_eos && token == tokenizer.eos_id()) {
        row.finished = "eos";
      } else {
        std::string piece = row.text.push(token);
        if (sink && !piece.empty()) sink(row.index, piece);
        if (row.text.stopped()) row.finished = "stop";
      }
      if (!row.finished && (generated >= options_.max_new_tokens ||
                            static_cast<int64_t>(row.sequence.size()) >= model_.context())) {
        row.finished = "length";
      }
      if (row.finished) {
        std::string rest = row.text.finish();
        if (sink && !rest.empty()) sink(row.index, rest);
        Completion& c = out[row.index];
        c.prompt_tokens.assign(row.sequence.begin(),
                               row.sequence.begin() + static_cast<int64_t>(row.prompt_length));
        c.tokens.assign(row.sequence.begin() + static_cast<int64_t>(row.prompt_length),
                        row.sequence.end());
        c.text = row.text.text();
        c.finish_reason = *row.finished;
      } else {
        keep.push_back(static_cast<int64_t>(r));
        still_live.push_back(live[r]);
      }
    }
    stats_.generated_tokens += static_cast<int64_t>(live.size());
    if (first) {
      stats_.prefill_s += seconds_since(start);
      start = Clock::now();
    } else {
      stats_.decoded_tokens += static_cast<int64_t>(live.size());
    }
    first = false;
    if (still_live.empty()) break;
    if (still_live.size() < live.size()) cache.keep_rows(keep);
    std::vector<int64_t> step_ids;
    for (size_t r : still_live) step_ids.push_back(rows[r].sequence.back());
    at::Tensor step = at::tensor(step_ids, at::kLong).view({-1, 1});
    live = std::move(still_live);
    logits = models::llama::forward_cached(model, step.to(device), cache, true);
  }
  if (!first) stats_.decode_s += seconds_since(start);
  return out;
}

}  // namespace loom::generate
