#include "loom/eval/loss.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "loom/core/check.h"
#include "loom/data/documents.h"
#include "loom/data/packed_loader.h"
#include "loom/data/shards.h"
#include "loom/data/token_stream.h"

namespace loom::eval {

at::Tensor target_nll_sums(const at::Tensor& logits, const at::Tensor& targets) {
  const int64_t bs = targets.size(0), seq = targets.size(1);
  at::Tensor t = targets.to(logits.device());
  at::Tensor nll =
      at::cross_entropy_loss(logits.reshape({bs * seq, -1}).to(at::kFloat), t.flatten(),
                             /*weight=*/{}, at::Reduction::None, kNotScored);
  at::Tensor sums = nll.view({bs, seq}).to(at::kDouble).sum(1).cpu();
  // A NaN loss would print as null, and NaN log-likelihoods tie every choice.
  LOOM_CHECK_AS(InputError, at::isfinite(sums).all().item<bool>(),
                "the model's loss is not finite (NaN or infinite logits): the checkpoint's "
                "weights hold NaN or Inf values, or overflow in this dtype");
  return sums;
}

std::pair<at::Tensor, at::Tensor> pad_rows(const std::vector<std::vector<int64_t>>& inputs,
                                           const std::vector<std::vector<int64_t>>& targets) {
  LOOM_CHECK(inputs.size() == targets.size() && !inputs.empty(), "rows and targets differ");
  size_t longest = 0;
  for (const auto& row : inputs) longest = std::max(longest, row.size());
  const auto rows = static_cast<int64_t>(inputs.size()), width = static_cast<int64_t>(longest);
  at::Tensor in = at::zeros({rows, width}, at::kLong);
  at::Tensor out = at::full({rows, width}, kNotScored, at::kLong);
  auto in_a = in.accessor<int64_t, 2>();
  auto out_a = out.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    const auto& row = inputs[static_cast<size_t>(r)];
    const auto& target = targets[static_cast<size_t>(r)];
    LOOM_CHECK(row.size() == target.size(), "a row and its targets differ in length");
    for (size_t i = 0; i < row.size(); ++i) {
      in_a[r][static_cast<int64_t>(i)] = row[i];
      out_a[r][static_cast<int64_t>(i)] = target[i];
    }
  }
  return {in, out};
}

double LossResult::loss() const {
  return tokens > 0 ? nll_sum / static_cast<double>(tokens) : 0.0;
}

double LossResult::perplexity() const {
  return std::exp(loss());
}

LossResult evaluate_loss(const ForwardFn& forward,
                         const std::vector<std::vector<int32_t>>& sequences,
                         const std::vector<Window>& windows, int64_t batch_size,
                         const Progress& progress) {
  LOOM_CHECK_AS(InputError, batch_size > 0, "--batch-size must be positive");
  at::NoGradGuard no_grad;
  LossResult result;
  std::vector<ScoredUnit> per_sequence(sequences.size());
  const auto total = static_cast<int64_t>(windows.size());
  for (int64_t first = 0; first < total; first += batch_size) {
    const int64_t last = std::min(total, first + batch_size);
    std::vector<std::vector<int64_t>> inputs, targets;
    for (int64_t w = first; w < last; ++w) {
      const Window& window = windows[static_cast<size_t>(w)];
      const auto& tokens = sequences[static_cast<size_t>(window.sequence)];
      std::vector<int64_t> in, target;
      for (int64_t i = window.begin; i < window.end; ++i) {
        in.push_back(tokens[static_cast<size_t>(i)]);
        target.push_back(i + 1 >= window.first_scored ? tokens[static_cast<size_t>(i + 1)]
                                                      : kNotScored);
      }
      inputs.push_back(std::move(in));
      targets.push_back(std::move(target));
    }
    auto [in, target] = pad_rows(inputs, targets);
    at::Tensor sums = target_nll_sums(forward(in), target);
    for (int64_t w = first; w < last; ++w) {
      const Window& window = windows[static_cast<size_t>(w)];
      const double nll = sums[w - first].item<double>();
      result.windows.push_back({w, window.scored(), nll});
      auto& seq = per_sequence[static_cast<size_t>(window.sequence)];
      seq.index = window.sequence;
      seq.tokens += window.scored();
      seq.nll += nll;
      result.nll_sum += nll;
      result.tokens += window.scored();
    }
    if (progress) progress(last, total);
  }
  for (const auto& seq : per_sequence) {
    if (seq.tokens > 0) result.sequences.push_back(seq);
  }
  return result;
}

std::vector<std::string> read_text_dataset(const std::string& source,
                                           const std::string& text_field) {
  const std::string location = source == "brown" || source == "brown_validation"
                                   ? data::dataset_location(source, std::nullopt, "--dataset")
                                   : source;
  LOOM_CHECK_AS(InputError, !data::is_prepared_dataset(location), "--dataset '", source,
                "' is a prepared (pre-tokenized) dataset; loom eval reads text: point it at the "
                "text files instead");
  std::vector<std::string> documents;
  for (const auto& file : data::expand_dataset_path(location)) {
    auto part = data::read_documents(file, text_field);
    documents.insert(documents.end(), std::make_move_iterator(part.begin()),
                     std::make_move_iterator(part.end()));
  }
  LOOM_CHECK_AS(InputError, !documents.empty(), "--dataset '", source, "' holds no documents");
  return documents;
}

std::vector<std::vector<int32_t>> tokenize_documents(const std::vector<std::string>& documents,
                                                     const data::Tokenizer& tokenizer,
                                                     bool per_document) {
  std::vector<std::vector<int32_t>> sequences(per_document ? 0 : 1);
  for (const auto& document : documents) {
    if (per_document) sequences.emplace_back();
    data::append_document(tokenizer, document, sequences.back());
  }
  return sequences;
}

}  // namespace loom::eval
