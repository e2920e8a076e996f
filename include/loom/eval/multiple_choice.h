// Multiple-choice tasks scored as lm-eval-harness scores them: each choice's log-likelihood is
// the sum of log p(choice tokens | context tokens); the prediction is the choice with the
// highest log-likelihood (accuracy) or the highest log-likelihood per character of the choice
// (length-normalized accuracy, lm-eval's acc_norm).
//
// Task file: see choice_file.h.
// Tokens as lm-eval: trailing spaces of the context move to the front of each choice; the
// choice's tokens are those of encode(context + choice) after the first len(encode(context)).
// A sequence longer than the context window loses tokens from the left.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"
#include "loom/eval/choice_file.h"
#include "loom/eval/loss.h"

namespace loom::eval {

struct ChoiceOptions {
  bool add_bos = true;
  int64_t max_seq_len = 0;  // the model's context
  int64_t batch_size = 8;
};

struct ItemScore {
  std::vector<double> loglik;  // per choice
  int64_t predicted = 0;       // argmax loglik (first on ties)
  int64_t predicted_norm = 0;  // argmax loglik / characters
};

struct ChoiceResult {
  int64_t items = 0;
  double accuracy = 0;
  double accuracy_norm = 0;
  int64_t truncated = 0;  // (item, choice) sequences cut on the left to fit the context
  std::vector<ItemScore> per_item;
};

ChoiceResult evaluate_choices(const ForwardFn& forward, const data::Tokenizer& tokenizer,
                              const std::vector<ChoiceItem>& items, const ChoiceOptions& options,
                              const Progress& progress = {});

// Characters (Unicode code points) of UTF-8 text: lm-eval's length for acc_norm.
int64_t utf8_characters(const std::string& text);

}  // namespace loom::eval
