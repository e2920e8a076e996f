// Mean loss and perplexity of a model over text, scored window by window (windows.h), and the
// building blocks `loom eval` shares with multiple-choice scoring and with training's validation
// (Trainer::validate scores its batches with target_nll_sums): per-token negative
// log-likelihoods of a batch and right-padded batches of token rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"
#include "loom/eval/windows.h"

namespace loom::eval {

constexpr int64_t kNotScored = -100;

// tokens [bs, seq] int64 on the CPU -> logits [bs, seq, vocab] float32 on any device.
using ForwardFn = std::function<at::Tensor(const at::Tensor& tokens)>;
// (units done, units in all)
using Progress = std::function<void(int64_t done, int64_t total)>;

// logits [bs, seq, vocab], targets [bs, seq] (kNotScored: ignored) -> per-row sums of the
// negative log-likelihoods of the targets, float64 [bs] on the CPU.
at::Tensor target_nll_sums(const at::Tensor& logits, const at::Tensor& targets);

// Rows of different lengths -> (inputs, targets) [rows, longest] right-padded with token 0 and
// kNotScored. targets[r][i] is rows_targets[r][i].
std::pair<at::Tensor, at::Tensor> pad_rows(const std::vector<std::vector<int64_t>>& inputs,
                                           const std::vector<std::vector<int64_t>>& targets);

struct ScoredUnit {
  int64_t index = 0;   // window or sequence (document) index
  int64_t tokens = 0;  // scored tokens
  double nll = 0;      // summed negative log-likelihood (nats)
};

struct LossResult {
  double nll_sum = 0;
  int64_t tokens = 0;
  std::vector<ScoredUnit> windows;    // one per window, in order
  std::vector<ScoredUnit> sequences;  // one per sequence with scored tokens
  double loss() const;                // mean nll per scored token
  double perplexity() const;          // exp(loss)
};

// Scores `windows` of `sequences` in batches of batch_size.
LossResult evaluate_loss(const ForwardFn& forward, const std::vector<std::vector<int32_t>>& sequences,
                         const std::vector<Window>& windows, int64_t batch_size,
                         const Progress& progress = {});

// The documents of a text dataset: "brown", "brown_validation" or a path (file, folder or glob of
// .jsonl/.json/.txt, optionally .gz) read with `text_field`.
std::vector<std::string> read_text_dataset(const std::string& source, const std::string& text_field);

// Token sequences as training packs them (each document BOS ids EOS): one stream of all
// documents, or one sequence per document.
std::vector<std::vector<int32_t>> tokenize_documents(const std::vector<std::string>& documents,
                                                     const data::Tokenizer& tokenizer,
                                                     bool per_document);

}  // namespace loom::eval
