// loom tokenize --tokenizer PATH (--text STR | --input FILE) [--format json] [--decode]
#include <nlohmann/json.hpp>

#include <chrono>
#include <climits>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/json.h"
#include "loom/core/strings.h"
#include "loom/data/tokenizer.h"

namespace loom::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer = "byte";
  std::optional<std::string> text;
  std::optional<std::string> input;
  std::string format = "text";
  bool decode = false;
  bool stats = false;
};

std::string read_input(const TokenizeArgs& args) {
  if (args.text) return *args.text;
  files::require_regular_file(*args.input, "--input file");
  std::ifstream in(*args.input, std::ios::binary);
  LOOM_CHECK_AS(InputError, in.good(), "cannot open --input file '", *args.input, "'");
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// Ids as a JSON array or whitespace/comma-separated integers.
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string trimmed(strings::trim(text));
  if (!trimmed.empty() && trimmed.front() == '[') {
    const auto values = json::int_array(json::parse_strict(trimmed, "--decode input"),
                                        "--decode input", 0, INT32_MAX);
    return std::vector<int32_t>(values.begin(), values.end());
  }
  for (char& c : trimmed) {
    if (c == ',') c = ' ';
  }
  std::istringstream in(trimmed);
  std::string token;
  while (in >> token) {
    auto id = strings::parse_int(token);
    LOOM_CHECK_AS(InputError, id.has_value() && *id >= 0 && *id <= INT32_MAX, "--decode: '", token,
                  "' is not a token id");
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

int run_tokenize(const TokenizeArgs& args) {
  auto tokenizer = data::load_tokenizer(args.tokenizer);
  const std::string input = read_input(args);
  if (args.decode) {
    std::cout << tokenizer->decode(parse_ids(input));
    if (args.format == "json") std::cout << "\n";
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto ids = tokenizer->encode(input);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (args.stats) {
    std::cerr << "encoded " << input.size() << " bytes into " << ids.size() << " tokens in "
              << seconds << " s (" << static_cast<double>(input.size()) / seconds / 1e6
              << " MB/s, one thread)\n";
  }
  if (args.format == "json") {
    std::cout << nlohmann::json(ids).dump() << "\n";
  } else {
    std::vector<std::string> parts;
    for (int32_t id : ids) parts.push_back(std::to_string(id));
    std::cout << strings::join(parts, " ") << "\n";
  }
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, CommandRun& run) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* command =
      app.add_subcommand("tokenize", "Encode text to token ids, or decode ids (for debugging)");
  command
      ->add_option(
          "--tokenizer", args->tokenizer,
          "'byte', or a tiktoken-format file (X.tiktoken with X.json beside it, or a known "
          "encoding: cl100k_base, gpt2, o200k_base, o200k_harmony, Llama 3 tokenizer.model)")
      ->capture_default_str();
  auto* text = command->add_option("--text", args->text, "Text to encode (or ids to decode)");
  auto* input = command->add_option("--input", args->input, "File to encode (or ids to decode)");
  text->excludes(input);
  command->add_option("--format", args->format, "Output: text (ids separated by spaces) or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  command->add_flag("--decode", args->decode, "Decode ids (JSON array or numbers) back to text");
  command->add_flag("--stats", args->stats, "Print encoding time and throughput to stderr");
  command->callback([command, args, &run] {
    if (!args->text && !args->input) throw CLI::RequiredError("--text or --input");
    run = [args] { return run_tokenize(*args); };
  });
}

}  // namespace loom::cli
