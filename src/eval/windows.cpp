#include "loom/eval/windows.h"

#include <algorithm>

#include "loom/core/check.h"

namespace loom::eval {

WindowMode parse_window_mode(const std::string& name) {
  if (name == "sliding") return WindowMode::sliding;
  if (name == "packed") return WindowMode::packed;
  LOOM_THROW(InputError, "--windows '", name, "': expected sliding or packed");
}

void WindowOptions::validate() const {
  LOOM_CHECK_AS(InputError, seq_len > 0, "--seq-len must be positive, got ", seq_len);
  LOOM_CHECK_AS(InputError, stride >= 0 && stride <= seq_len, "--stride must be in [1, --seq-len ",
                seq_len, "], got ", stride, " (a larger stride would skip tokens)");
  LOOM_CHECK_AS(InputError, mode == WindowMode::sliding || stride == 0 || stride == seq_len,
                "--stride applies to --windows sliding only");
}

std::vector<Window> make_windows(const std::vector<int64_t>& sequence_lengths,
                                 const WindowOptions& options) {
  options.validate();
  const int64_t length = options.seq_len;
  const int64_t stride = options.stride > 0 ? options.stride : length;
  std::vector<Window> windows;
  for (size_t s = 0; s < sequence_lengths.size(); ++s) {
    const int64_t n = sequence_lengths[s];
    const auto seq = static_cast<int64_t>(s);
    if (options.mode == WindowMode::packed) {
      for (int64_t begin = 0; begin + length + 1 <= n; begin += length + 1) {
        windows.push_back({seq, begin, begin + length, begin + 1});
      }
      continue;
    }
    // Inputs [begin, end) predict tokens begin + 1 .. end; the last token to predict is n - 1.
    int64_t predicted = 0;  // tokens 1 .. predicted are scored already
    for (int64_t begin = 0; predicted < n - 1; begin += stride) {
      const int64_t end = std::min(begin + length, n - 1);
      windows.push_back({seq, begin, end, std::max(predicted + 1, begin + 1)});
      predicted = end;
    }
  }
  return windows;
}

}  // namespace loom::eval
