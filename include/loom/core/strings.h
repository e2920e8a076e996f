// Small string helpers shared by the config parser, the CLI and the error messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::strings {

// Levenshtein distance (insertions, deletions, substitutions, each 1).
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word`, if it is close enough to be a plausible typo.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

// Splits on `separator`, trimming blanks around each piece; "" gives an empty list.
std::vector<std::string> split_list(std::string_view text, char separator = ',');

std::string_view trim(std::string_view text);
bool ends_with(std::string_view text, std::string_view suffix);
std::string join(const std::vector<std::string>& parts, std::string_view separator);

// Whole-string numeric parsing: nullopt unless every character is consumed.
std::optional<int64_t> parse_int(std::string_view text);
std::optional<double> parse_double(std::string_view text);
// true/false, 1/0, yes/no, on/off (any case).
std::optional<bool> parse_bool(std::string_view text);

// A string quoted for messages and TOML/JSON output ("a\"b").
std::string quote(std::string_view text);

// `text` safe to print on a terminal: control characters (escape sequences that would move the
// cursor or recolor the screen, a metric name from a hostile metrics.jsonl) as \xNN.
std::string printable(std::string_view text);

}  // namespace loom::strings
