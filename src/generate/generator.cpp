#include "loom/core/clock.h"
#include "loom/generate/generator.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "loom/core/check.h"

namespace loom::generate {
namespace {

using Clock = std::chrono::steady_clock;
}  // namespace

// One prompt in flight.
struct Generator::Row {
  size_t index;  // position in the caller's batch
  std::vector<int32_t> sequence;
  size_t prompt_length;
  at::Generator generator;
  StreamingText text;
  std::optional<std::string> finished;
};

namespace {
using Row = Generator::Row;
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

namespace {

// The prompts right-aligned in one [rows, longest] batch; `padding` gets each row's pad slots.
at::Tensor left_padded(const std::vector<std::vector<int32_t>>& prompts,
                       std::vector<int64_t>& padding) {
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  at::Tensor batch =
      at::zeros({static_cast<int64_t>(prompts.size()), static_cast<int64_t>(longest)}, at::kLong);
  auto ids = batch.accessor<int64_t, 2>();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const size_t pad = longest - prompts[i].size();
    padding.push_back(static_cast<int64_t>(pad));
    for (size_t j = 0; j < prompts[i].size(); ++j) {
      ids[static_cast<int64_t>(i)][static_cast<int64_t>(pad + j)] = prompts[i][j];
    }
  }
  return batch;
}

// The next token of every live row from its logits [live, vocab].
std::vector<int32_t> next_tokens(const at::Tensor& logits, const std::vector<Row*>& live,
                                 const SamplingOptions& sampling) {
  std::vector<int32_t> next(live.size());
  // NaN logits would pick token 0 (NUL bytes) on every step: the weights are broken.
  LOOM_CHECK_AS(InputError, at::isfinite(logits).all().item<bool>(),
                "the model's logits are not finite (NaN or infinite): the checkpoint's weights "
                "hold NaN or Inf values, or overflow in this dtype");
  if (sampling.greedy() && sampling.repetition_penalty == 1.0) {
    at::Tensor ids = logits.argmax(1).cpu();  // one transfer for the whole batch
    auto id = ids.accessor<int64_t, 1>();
    for (size_t r = 0; r < live.size(); ++r)
      next[r] = static_cast<int32_t>(id[static_cast<int64_t>(r)]);
    return next;
  }
  for (size_t r = 0; r < live.size(); ++r) {
    next[r] = sample_token(logits[static_cast<int64_t>(r)], live[r]->sequence, sampling,
                           live[r]->generator);
  }
  return next;
}

Completion completion_of(const Row& row) {
  Completion c;
  const auto split = row.sequence.begin() + static_cast<int64_t>(row.prompt_length);
  c.prompt_tokens.assign(row.sequence.begin(), split);
  c.tokens.assign(split, row.sequence.end());
  c.text = row.text.text();
  c.finish_reason = row.finished.value_or("");
  return c;
}

}  // namespace

bool Generator::append(Row& row, int32_t token, const TextSink& sink) {
  row.sequence.push_back(token);
  if (options_.stop_at_eos && token == model_.tokenizer->eos_id()) {
    row.finished = "eos";
  } else {
    std::string piece = row.text.push(token);
    if (sink && !piece.empty()) sink(row.index, piece);
    if (row.text.stopped()) row.finished = "stop";
  }
  const auto generated = static_cast<int64_t>(row.sequence.size() - row.prompt_length);
  if (!row.finished && (generated >= options_.max_new_tokens ||
                        static_cast<int64_t>(row.sequence.size()) >= model_.context())) {
    row.finished = "length";
  }
  if (!row.finished) return false;
  std::string rest = row.text.finish();
  if (sink && !rest.empty()) sink(row.index, rest);
  return true;
}

std::vector<Completion> Generator::generate(const std::vector<std::vector<int32_t>>& prompts,
                                            uint64_t first_index, const TextSink& sink) {
  at::NoGradGuard no_grad;
  if (prompts.empty()) return {};
  auto& model = *model_.model;
  const at::Device device = model_.device();
  const int64_t vocab = std::min<int64_t>(model_.tokenizer->vocab_size(), model.vocab_size());
  std::vector<Row> rows;
  for (size_t i = 0; i < prompts.size(); ++i) {
    check_fits(prompts[i], "prompt " + std::to_string(first_index + i));
    rows.push_back({i, prompts[i], prompts[i].size(),
                    sequence_generator(options_.sampling.seed, first_index + i),
                    StreamingText(*model_.tokenizer, options_.stop), std::nullopt});
    stats_.prompt_tokens += static_cast<int64_t>(prompts[i].size());
  }
  std::vector<int64_t> padding;
  const at::Tensor batch = left_padded(prompts, padding);
  // A row never goes past the context, whatever max_new_tokens asks: no slot beyond that.
  const int64_t most_padding = *std::max_element(padding.begin(), padding.end());
  const int64_t capacity =
      std::min(batch.size(1) + options_.max_new_tokens, most_padding + model_.context());
  auto cache = model.new_inference_cache(batch.size(0), capacity, padding);
  std::vector<Row*> live;  // the rows in the cache, in cache order
  for (auto& row : rows) live.push_back(&row);

  auto start = Clock::now();
  at::Tensor logits = model.forward_cached(batch.to(device), *cache, true);
  for (bool prefill = true;; prefill = false) {
    const auto next = next_tokens(logits.select(1, 0).slice(1, 0, vocab), live, options_.sampling);
    std::vector<int64_t> keep;
    std::vector<Row*> still_live;
    for (size_t r = 0; r < live.size(); ++r) {
      if (append(*live[r], next[r], sink)) continue;
      keep.push_back(static_cast<int64_t>(r));
      still_live.push_back(live[r]);
    }
    stats_.generated_tokens += static_cast<int64_t>(live.size());
    if (!prefill) stats_.decoded_tokens += static_cast<int64_t>(live.size());
    (prefill ? stats_.prefill_s : stats_.decode_s) += seconds_since(start);
    start = Clock::now();
    if (still_live.empty()) break;
    if (still_live.size() < live.size()) cache->keep_rows(keep);  // finished rows leave
    std::vector<int64_t> step;
    for (const Row* row : still_live) step.push_back(row->sequence.back());
    live = std::move(still_live);
    logits =
        model.forward_cached(at::tensor(step, at::kLong).view({-1, 1}).to(device), *cache, true);
  }
  std::vector<Completion> out;
  for (const auto& row : rows) out.push_back(completion_of(row));
  return out;
}

}  // namespace loom::generate
