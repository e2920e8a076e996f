#include "loom/eval/multiple_choice.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <fstream>

#include "loom/core/check.h"

namespace loom::eval {
namespace {

// One (item, choice): the tokens, and where the choice's tokens start.
struct Request {
  size_t item = 0, choice = 0;
  std::vector<int32_t> tokens;
  size_t continuation = 0;
};

Request encode_request(const data::Tokenizer& tokenizer, const ChoiceItem& item, size_t choice,
                       const ChoiceOptions& options, int64_t& truncated) {
  std::string context = item.context;
  std::string continuation = item.choices[choice];
  const size_t kept = context.find_last_not_of(' ');
  const size_t spaces = kept == std::string::npos ? context.size() : context.size() - kept - 1;
  if (spaces > 0) {
    continuation = context.substr(context.size() - spaces) + continuation;
    context.resize(context.size() - spaces);
  }
  std::vector<int32_t> whole, context_ids;
  if (options.add_bos) {
    whole.push_back(tokenizer.bos_id());
    context_ids.push_back(tokenizer.bos_id());
  }
  const auto body = tokenizer.encode(context + continuation);
  whole.insert(whole.end(), body.begin(), body.end());
  const auto context_body = tokenizer.encode(context);
  context_ids.insert(context_ids.end(), context_body.begin(), context_body.end());
  size_t start = std::min(context_ids.size(), whole.size());
  LOOM_CHECK_AS(InputError, start < whole.size(), "line ", item.line, ": choice ", choice,
                " adds no tokens to the context");
  LOOM_CHECK_AS(InputError, start >= 1, "line ", item.line,
                ": the context is empty and --no-bos is set: nothing to condition the choice on");
  // Inputs are tokens[0, n - 1): at most max_seq_len of them, cut from the left.
  const auto limit = static_cast<size_t>(options.max_seq_len) + 1;
  if (whole.size() > limit) {
    const size_t cut = whole.size() - limit;
    LOOM_CHECK_AS(InputError, cut < start, "line ", item.line, ": choice ", choice, " alone has ",
                  whole.size() - start, " tokens, more than the model's context of ",
                  options.max_seq_len);
    whole.erase(whole.begin(), whole.begin() + static_cast<int64_t>(cut));
    start -= cut;
    ++truncated;
  }
  return {0, choice, std::move(whole), start};
}

}  // namespace

int64_t utf8_characters(const std::string& text) {
  int64_t count = 0;
  for (unsigned char c : text) count += (c & 0xC0) != 0x80;
  return count;
}

ChoiceResult evaluate_choices(const ForwardFn& forward, const data::Tokenizer& tokenizer,
                              const std::vector<ChoiceItem>& items, const ChoiceOptions& options,
                              const Progress& progress) {
  LOOM_CHECK_AS(InputError, options.batch_size > 0, "--batch-size must be positive");
  at::NoGradGuard no_grad;
  ChoiceResult result;
  std::vector<Request> requests;
  for (size_t i = 0; i < items.size(); ++i) {
    result.per_item.push_back({std::vector<double>(items[i].choices.size(), 0.0), 0, 0});
    for (size_t c = 0; c < items[i].choices.size(); ++c) {
      Request r = encode_request(tokenizer, items[i], c, options, result.truncated);
      r.item = i;
      requests.push_back(std::move(r));
    }
  }
  const auto total = static_cast<int64_t>(requests.size());
  for (int64_t first = 0; first < total; first += options.batch_size) {
    const int64_t last = std::min(total, first + options.batch_size);
    std::vector<std::vector<int64_t>> inputs, targets;
    for (int64_t k = first; k < last; ++k) {
      const Request& r = requests[static_cast<size_t>(k)];
      std::vector<int64_t> in(r.tokens.begin(), r.tokens.end() - 1), target;
      for (size_t i = 1; i < r.tokens.size(); ++i) {
        target.push_back(i >= r.continuation ? r.tokens[i] : kNotScored);
      }
      inputs.push_back(std::move(in));
      targets.push_back(std::move(target));
    }
    auto [in, target] = pad_rows(inputs, targets);
    at::Tensor sums = target_nll_sums(forward(in), target);
    for (int64_t k = first; k < last; ++k) {
      const Request& r = requests[static_cast<size_t>(k)];
      result.per_item[r.item].loglik[r.choice] = -sums[k - first].item<double>();
    }
    if (progress) progress(last, total);
  }
  int64_t correct = 0, correct_norm = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    auto& score = result.per_item[i];
    double best = 0, best_norm = 0;
    for (size_t c = 0; c < score.loglik.size(); ++c) {
      const double norm = score.loglik[c] / static_cast<double>(utf8_characters(items[i].choices[c]));
      if (c == 0 || score.loglik[c] > best) {
        best = score.loglik[c];
        score.predicted = static_cast<int64_t>(c);
      }
      if (c == 0 || norm > best_norm) {
        best_norm = norm;
        score.predicted_norm = static_cast<int64_t>(c);
      }
    }
    correct += score.predicted == items[i].answer;
    correct_norm += score.predicted_norm == items[i].answer;
  }
  result.items = static_cast<int64_t>(items.size());
  result.accuracy = static_cast<double>(correct) / static_cast<double>(result.items);
  result.accuracy_norm = static_cast<double>(correct_norm) / static_cast<double>(result.items);
  return result;
}

}  // namespace loom::eval
