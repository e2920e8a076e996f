#include "loom/config/diagnostics.h"

#include <algorithm>
#include <sstream>
#include <tuple>

namespace loom::config {
namespace {

std::string format(const std::vector<Diagnostic>& diagnostics) {
  std::ostringstream out;
  out << "invalid job config: " << diagnostics.size()
      << (diagnostics.size() == 1 ? " problem" : " problems");
  for (const auto& item : diagnostics) {
    out << "\n  " << item.origin.to_string() << ": ";
    if (!item.key.empty()) {
      out << item.key << ": ";
    }
    out << item.message;
  }
  return out.str();
}

}  // namespace

std::string Origin::to_string() const {
  std::string text = source.empty() ? "defaults" : source;
  if (line > 0) {
    text += ":" + std::to_string(line);
    if (column > 0) {
      text += ":" + std::to_string(column);
    }
  }
  return text;
}

ConfigError::ConfigError(std::vector<Diagnostic> diagnostics, const char* file, int line)
    : InputError(format(diagnostics), file, line), diagnostics_(std::move(diagnostics)) {}

void Diagnostics::throw_if_any() const {
  if (items_.empty()) {
    return;
  }
  // File problems in line order, then the command line (parsers may visit keys in any order).
  std::vector<Diagnostic> sorted = items_;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Diagnostic& a, const Diagnostic& b) {
    auto rank = [](const Diagnostic& d) {
      return std::make_tuple(d.origin.source == "command line", d.origin.source == "defaults",
                             d.origin.line, d.origin.column);
    };
    return rank(a) < rank(b);
  });
  throw ConfigError(std::move(sorted), __FILE__, __LINE__);
}

}  // namespace loom::config
