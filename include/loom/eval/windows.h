// How `loom eval` cuts token sequences into the windows it scores (docs/generate_eval.md).
//
// sliding (default; the recipe of transformers' perplexity guide): window k feeds tokens
// [k * stride, k * stride + seq_len) and predicts the token after each; only predictions not
// made by an earlier window count. Every token but a sequence's first is scored exactly once,
// with at least seq_len - stride tokens of context once the first window is past. stride ==
// seq_len (the default) gives disjoint windows.
//
// packed (what training's validation scores): samples of seq_len + 1 consecutive tokens, inputs
// the first seq_len, every next-token prediction counted; a sample's first token is never a
// target and the tail shorter than seq_len + 1 is dropped.
//
// Sequences are either the whole dataset as one stream (every document as BOS ids EOS, one after
// the other, as the training loader packs them) or each document alone (per_document: no window
// crosses a document boundary). No shuffling: windows are in dataset order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::eval {

enum class WindowMode { sliding, packed };
WindowMode parse_window_mode(const std::string& name);  // InputError naming --windows

struct WindowOptions {
  WindowMode mode = WindowMode::sliding;
  int64_t seq_len = 0;
  int64_t stride = 0;  // sliding only; 0: seq_len
  void validate() const;
};

// One window of one sequence: inputs are tokens [begin, end), targets tokens [begin + 1, end + 1);
// predictions of targets before `first_scored` (a token index in the sequence) do not count.
struct Window {
  int64_t sequence = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t first_scored = 0;
  int64_t inputs() const { return end - begin; }
  int64_t scored() const { return end + 1 - first_scored; }
};

// The windows of sequences with these lengths, in order.
std::vector<Window> make_windows(const std::vector<int64_t>& sequence_lengths,
                                 const WindowOptions& options);

}  // namespace loom::eval
