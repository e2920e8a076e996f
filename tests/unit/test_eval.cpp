// Window construction, loss/perplexity scoring and multiple-choice scoring against hand-computed
// values from a stand-in model whose next-token distribution depends on the current token only.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include "loom/core/check.h"
#include "loom/data/tokenizer.h"
#include "loom/eval/loss.h"
#include "loom/eval/multiple_choice.h"
#include "loom/eval/windows.h"
#include "support/process.h"

namespace loom {
namespace {

using eval::make_windows;
using eval::WindowMode;
using eval::WindowOptions;

// Every token 1 .. n-1 of every sequence is scored exactly once; inputs fit seq_len.
void expect_each_token_scored_once(const std::vector<int64_t>& lengths, const WindowOptions& o) {
  const auto windows = make_windows(lengths, o);
  std::map<std::pair<int64_t, int64_t>, int> scored;
  for (const auto& w : windows) {
    EXPECT_LE(w.inputs(), o.seq_len);
    EXPECT_GE(w.first_scored, w.begin + 1);
    for (int64_t t = w.first_scored; t <= w.end; ++t) ++scored[{w.sequence, t}];
    // Past the first window, a scored token sees at least seq_len - stride tokens of context.
    const int64_t stride = o.stride > 0 ? o.stride : o.seq_len;
    if (w.begin > 0) {
      EXPECT_GE(w.first_scored - w.begin, o.seq_len - stride);
    }
  }
  for (size_t s = 0; s < lengths.size(); ++s) {
    for (int64_t t = 1; t < lengths[s]; ++t) {
      EXPECT_EQ((scored[{static_cast<int64_t>(s), t}]), 1) << "sequence " << s << " token " << t;
    }
  }
}

TEST(Windows, SlidingWindowsScoreEveryTokenOnce) {
  for (int64_t length : {1, 2, 5, 9, 10, 11, 33}) {
    for (int64_t seq_len : {1, 3, 4, 8}) {
      for (int64_t stride = 1; stride <= seq_len; ++stride) {
        WindowOptions o;
        o.seq_len = seq_len;
        o.stride = stride;
        expect_each_token_scored_once({length, 3, length + 4}, o);
      }
    }
  }
}

TEST(Windows, DisjointAndPackedLayouts) {
  WindowOptions o;
  o.seq_len = 4;
  auto w = make_windows({10}, o);  // predicts 1..4, 5..8, 9
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[1].begin, 4);
  EXPECT_EQ(w[1].end, 8);
  EXPECT_EQ(w[2].end, 9);
  EXPECT_EQ(w[2].scored(), 1);
  o.mode = WindowMode::packed;
  w = make_windows({11}, o);  // samples [0, 5) and [5, 10); the 11th token is dropped
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[1].begin, 5);
  EXPECT_EQ(w[1].scored(), 4);
  o.stride = 2;
  EXPECT_THROW(make_windows({11}, o), InputError);
  o.mode = WindowMode::sliding;
  o.stride = 5;
  EXPECT_THROW(make_windows({11}, o), InputError);
  EXPECT_THROW(eval::parse_window_mode("tumbling"), InputError);
}

// Next-token log-probabilities depend on the current token only (a bigram table), so any window
// layout must give the same loss as scoring the whole sequence at once.
struct Bigram {
  at::Tensor table;  // [vocab, vocab] logits
  explicit Bigram(int64_t vocab) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(9);
    table = at::randn({vocab, vocab}, generator, at::kFloat);
  }
  eval::ForwardFn forward() const {
    return [t = table](const at::Tensor& tokens) { return t.index({tokens}); };
  }
  double nll(int32_t from, int32_t to) const {
    return -at::log_softmax(table[from], 0)[to].item<double>();
  }
};

TEST(Loss, AnyWindowLayoutGivesTheSequenceLoss) {
  Bigram model(13);
  std::vector<std::vector<int32_t>> sequences = {
      {1, 5, 7, 2, 2, 9, 12, 0, 3, 4, 6}, {8, 1}, {3, 3, 3, 11, 10, 5}};
  double expected = 0;
  int64_t tokens = 0;
  for (const auto& s : sequences) {
    for (size_t i = 1; i < s.size(); ++i, ++tokens) expected += model.nll(s[i - 1], s[i]);
  }
  std::vector<int64_t> lengths;
  for (const auto& s : sequences) lengths.push_back(static_cast<int64_t>(s.size()));
  for (int64_t seq_len : {1, 3, 5, 16}) {
    for (int64_t stride = 1; stride <= seq_len; stride += 2) {
      WindowOptions o;
      o.seq_len = seq_len;
      o.stride = stride;
      for (int64_t batch : {1, 4}) {
        auto r = eval::evaluate_loss(model.forward(), sequences, make_windows(lengths, o), batch);
        EXPECT_EQ(r.tokens, tokens);
        EXPECT_NEAR(r.nll_sum, expected, 1e-4);
        EXPECT_NEAR(r.perplexity(), std::exp(expected / tokens), 1e-4);
        ASSERT_EQ(r.sequences.size(), 3u);
        EXPECT_EQ(r.sequences[1].tokens, 1);
        EXPECT_NEAR(r.sequences[1].nll, model.nll(8, 1), 1e-5);
      }
    }
  }
}

TEST(Loss, UniformLogitsGivePerplexityOfTheVocabulary) {
  eval::ForwardFn uniform = [](const at::Tensor& tokens) {
    return at::zeros({tokens.size(0), tokens.size(1), 50}, at::kFloat);
  };
  std::vector<std::vector<int32_t>> sequences = {std::vector<int32_t>(40, 3)};
  WindowOptions o;
  o.seq_len = 8;
  auto r = eval::evaluate_loss(uniform, sequences, make_windows({40}, o), 3);
  EXPECT_NEAR(r.perplexity(), 50.0, 1e-3);
}

// NaN weights give NaN logits: an error, not "loss": null with exit 0.
TEST(Loss, NonFiniteLogitsAreAnError) {
  eval::ForwardFn broken = [](const at::Tensor& tokens) {
    return at::full({tokens.size(0), tokens.size(1), 50}, std::nan(""), at::kFloat);
  };
  std::vector<std::vector<int32_t>> sequences = {std::vector<int32_t>(40, 3)};
  WindowOptions o;
  o.seq_len = 8;
  try {
    eval::evaluate_loss(broken, sequences, make_windows({40}, o), 3);
    ADD_FAILURE() << "a NaN loss was reported";
  } catch (const loom::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("loss is not finite"), std::string::npos) << e.what();
  }
}

TEST(Loss, DocumentsAreStreamedOrKeptApartAsTrainingPacksThem) {
  data::ByteTokenizer tokenizer;
  auto stream = eval::tokenize_documents({"ab", "c"}, tokenizer, false);
  ASSERT_EQ(stream.size(), 1u);
  EXPECT_EQ(stream[0], (std::vector<int32_t>{256, 'a', 'b', 257, 256, 'c', 257}));
  auto apart = eval::tokenize_documents({"ab", "c"}, tokenizer, true);
  ASSERT_EQ(apart.size(), 2u);
  EXPECT_EQ(apart[1], (std::vector<int32_t>{256, 'c', 257}));
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = testing::fresh_temp_dir("eval_unit_" + name) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(MultipleChoice, ScoresSummedLogLikelihoodAndLengthNormalized) {
  Bigram model(259);
  data::ByteTokenizer tokenizer;
  const auto path = write_file("task.jsonl",
                               "{\"context\": \"ab \", \"choices\": [\"c\", \"dd\", \"e\"], "
                               "\"answer\": 1}\n");
  const auto items = eval::read_choice_items(path);
  eval::ChoiceOptions options;
  options.max_seq_len = 32;
  const auto r = eval::evaluate_choices(model.forward(), tokenizer, items, options);
  // lm-eval moves the context's trailing space into the choice: "ab" | " c", " dd", " e".
  auto loglik = [&](const std::string& choice) {
    std::vector<int32_t> ids = {256, 'a', 'b'};
    for (char ch : " " + choice) ids.push_back(static_cast<unsigned char>(ch));
    double sum = 0;
    for (size_t i = 3; i < ids.size(); ++i) sum -= model.nll(ids[i - 1], ids[i]);
    return sum;
  };
  ASSERT_EQ(r.per_item.size(), 1u);
  const std::vector<std::string> choices = {"c", "dd", "e"};
  int64_t best = 0, best_norm = 0;
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(r.per_item[0].loglik[c], loglik(choices[c]), 1e-4);
    if (loglik(choices[c]) > loglik(choices[static_cast<size_t>(best)]))
      best = static_cast<int64_t>(c);
    if (loglik(choices[c]) / choices[c].size() > loglik(choices[static_cast<size_t>(best_norm)]) /
                                                     choices[static_cast<size_t>(best_norm)].size())
      best_norm = static_cast<int64_t>(c);
  }
  EXPECT_EQ(r.per_item[0].predicted, best);
  EXPECT_EQ(r.per_item[0].predicted_norm, best_norm);
  EXPECT_DOUBLE_EQ(r.accuracy, best == 1 ? 1.0 : 0.0);
  EXPECT_DOUBLE_EQ(r.accuracy_norm, best_norm == 1 ? 1.0 : 0.0);
  // A context longer than the window is cut on the left and counted.
  options.max_seq_len = 3;
  EXPECT_EQ(eval::evaluate_choices(model.forward(), tokenizer, items, options).truncated, 3);
}

TEST(MultipleChoice, BadItemsAreNamedByLine) {
  for (const std::string& bad :
       {std::string("{\"context\": \"x\", \"choices\": [\"a\"], \"answer\": 0}"),
        std::string("{\"context\": \"x\", \"choices\": [\"a\", \"b\"], \"answer\": 2}"),
        std::string("{\"question\": \"x\"}"), std::string("[1, 2")}) {
    const auto path = write_file("bad.jsonl",
                                 "{\"context\": \"x\", \"choices\": [\"a\", \"b\"], "
                                 "\"answer\": 0}\n" +
                                     bad + "\n");
    try {
      eval::read_choice_items(path);
      FAIL() << "accepted " << bad;
    } catch (const InputError& e) {
      EXPECT_NE(e.message().find(path + ":2"), std::string::npos) << e.message();
    }
  }
  EXPECT_EQ(eval::utf8_characters("h\xC3\xA9llo"), 5);
}

}  // namespace
}  // namespace loom
