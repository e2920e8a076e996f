#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "loom/config/dump.h"
#include "loom/config/schema.h"
#include "unit/config_test_util.h"

namespace {

loom::config::JobConfig unusual_config() {
  return loom::testing::load_toml(R"(
[job]
description = "quotes \" and \\ backslashes, tabs\t and unicode é"
[training]
steps = 123
max_norm = 0.5
dataset_path = "/data/x.jsonl"
[optimizer]
lr = 1.2345678901234567e-4
[lr_scheduler]
decay_ratio = 0.25
[debug]
seed = 7
[parallelism]
module_fqns_per_model_part = [["a"], ["b", "c"]]
)")
      .config;
}

}  // namespace

TEST(ConfigDump, TomlRoundTripsExactly) {
  auto original = unusual_config();
  std::string first = loom::config::to_toml(original);
  auto reloaded = loom::testing::load_toml(first).config;
  reloaded.job.config_file = original.job.config_file;
  EXPECT_EQ(loom::config::to_toml(reloaded), first);
  EXPECT_DOUBLE_EQ(reloaded.optimizer.lr, 1.2345678901234567e-4);
  EXPECT_EQ(reloaded.job.description, original.job.description);
}

TEST(ConfigDump, JsonRoundTripsExactly) {
  auto original = unusual_config();
  std::string first = loom::config::to_json(original);
  auto reloaded = loom::testing::load_json(first).config;
  reloaded.job.config_file = original.job.config_file;
  EXPECT_EQ(loom::config::to_json(reloaded), first);
}

TEST(ConfigDump, UnsetKeysAreCommentedInTomlAndNullInJson) {
  loom::config::JobConfig defaults;
  std::string toml = loom::config::to_toml(defaults);
  EXPECT_NE(toml.find("# seed = (unset)"), std::string::npos);
  EXPECT_NE(toml.find("[quantize.linear.float8]"), std::string::npos);
  EXPECT_EQ(toml.find("[quantize]\n"), std::string::npos);  // container sections hold no keys
  std::string json = loom::config::to_json(defaults);
  EXPECT_NE(json.find("\"seed\": null"), std::string::npos);
}

// docs/config.md documents every key the parser knows.
TEST(ConfigDocs, EveryKeyIsInDocsConfigMd) {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in.good()) << "docs/config.md is missing";
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string docs = buffer.str();
  const auto& schema = loom::config::job_config_schema();
  for (const auto& section : schema.sections()) {
    if (schema.keys_of(section.name).empty()) continue;
    const std::string heading = "### [" + section.name + "]";
    size_t start = docs.find(heading);
    ASSERT_NE(start, std::string::npos) << "docs/config.md has no section " << heading;
    size_t end = docs.find("\n### ", start + heading.size());
    std::string body =
        docs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    for (const auto& key : schema.keys_of(section.name)) {
      EXPECT_NE(body.find("| `" + key + "` |"), std::string::npos)
          << "docs/config.md does not document " << section.name << "." << key
          << " (regenerate the reference with: build/bin/loom config docs)";
    }
  }
}
