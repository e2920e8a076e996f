// The docs agree with the code (issue 54): a feature that `loom config validate` accepts is never
// called planned, refused or unimplemented in README.md or docs/*.md. Each feature is a set of
// config keys that turn it on; the docs are cut into fragments (sentences, table cells) and a
// fragment that names the feature may not say it is missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/process.h"

namespace fs = std::filesystem;

namespace {

struct Feature {
  std::string what;
  std::string validate_args;          // after `config validate --config <debug toml>`
  std::vector<std::string> names;     // how the docs name it (lower case)
};

// What a doc says about a feature that is not there.
const std::vector<std::string>& missing_phrases() {
  static const std::vector<std::string> phrases = {
      "is planned",        "(planned)",         "planned (",          "are planned",
      "refused at start when set", "refused with a clear error", "until it lands",
      "not implemented",   "refused otherwise", "only family",        "models only"};
  return phrases;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// Paragraphs joined into one line, then cut at sentence ends and table cells.
std::vector<std::string> fragments(const std::string& path) {
  std::ifstream in(path);
  std::string text, line;
  while (std::getline(in, line)) {
    const bool starts_block = line.empty() || line[0] == '|' || line[0] == '#' ||
                              line.rfind("- ", 0) == 0 || line.rfind("```", 0) == 0;
    text += (starts_block ? "\n" : " ") + line;
  }
  std::vector<std::string> out;
  std::string current;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const bool sentence_end = (c == '.' || c == ';') && (i + 1 == text.size() || text[i + 1] == ' ');
    if (c == '\n' || c == '|' || sentence_end) {
      if (!current.empty()) out.push_back(lower(current));
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) out.push_back(lower(current));
  return out;
}

std::vector<std::string> doc_files() {
  std::vector<std::string> files = {std::string(LOOM_SOURCE_DIR) + "/README.md"};
  for (const auto& entry : fs::directory_iterator(std::string(LOOM_SOURCE_DIR) + "/docs")) {
    if (entry.path().extension() == ".md") files.push_back(entry.path().string());
  }
  return files;
}

// The features shipped by now, as config validate sees them.
const std::vector<Feature>& features() {
  static const std::vector<Feature> list = {
      {"context parallelism",
       "--parallelism.context_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 "
       "--world-size 2",
       {"context parallelism", "context_parallel_degree"}},
      {"expert parallelism",
       "--model.name qwen3_moe --model.flavor debugmodel_moe --parallelism.expert_parallel_degree 2"
       " --world-size 2",
       {"expert parallelism", "expert_parallel_degree"}},
      {"float8 converters", "--model.converters float8", {"model.converters", "float8"}},
      {"block_causal document masks", "--model.attn_mask_type block_causal",
       {"block_causal", "document mask"}},
      {"pipeline parallelism",
       "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B "
       "--world-size 2",
       {"pipeline parallelism"}},
      {"other model families", "--model.name deepseek_v3 --model.flavor debugmodel",
       {"llama3", "qwen3", "deepseek", "famil"}},
  };
  return list;
}

TEST(DocsAgree, NoShippedFeatureIsCalledPlannedOrRefused) {
  const std::string config = std::string(LOOM_SOURCE_DIR) + "/configs/llama3_debug.toml";
  std::vector<std::vector<std::string>> docs;
  const auto files = doc_files();
  for (const auto& file : files) docs.push_back(fragments(file));
  for (const auto& feature : features()) {
    const auto result =
        loom::testing::run_loom("config validate --config '" + config + "' " + feature.validate_args);
    ASSERT_EQ(result.exit_code, 0) << feature.what << " is not accepted:\n" << result.output;
    for (size_t f = 0; f < files.size(); ++f) {
      for (const auto& fragment : docs[f]) {
        const bool names = std::any_of(feature.names.begin(), feature.names.end(),
                                       [&](const auto& n) { return fragment.find(n) != std::string::npos; });
        if (!names) continue;
        for (const auto& phrase : missing_phrases()) {
          EXPECT_EQ(fragment.find(phrase), std::string::npos)
              << files[f] << " calls " << feature.what << " (shipped) '" << phrase << "': \""
              << fragment << "\"";
        }
      }
    }
  }
}

// The check can fail: a planted sentence is found.
TEST(DocsAgree, APlantedClaimIsFound) {
  const std::string path = loom::testing::fresh_temp_dir("docs_agree") + "/planted.md";
  std::ofstream(path) << "# Status\n\nTensor parallelism works. Context parallelism is planned\n"
                         "(its degree is refused at start when set).\n";
  const auto parts = fragments(path);
  bool found = false;
  for (const auto& part : parts) {
    found = found || (part.find("context parallelism") != std::string::npos &&
                      part.find("is planned") != std::string::npos);
  }
  EXPECT_TRUE(found);
}

}  // namespace
