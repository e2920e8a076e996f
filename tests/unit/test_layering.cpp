// The layers of docs/architecture.md, enforced: a file under include/loom/<layer>/ or
// src/<layer>/ includes "loom/<other>/..." only when <other> is its own layer or one below.
// Reads the source tree, so a planted upward include fails this test without a rebuild.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/process.h"

namespace fs = std::filesystem;

namespace {

// "layers: core < config < ... < eval = generate = plan < train < cli" from docs/architecture.md:
// each layer's rank.
std::map<std::string, int> layer_ranks() {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/docs/architecture.md");
  std::string line;
  std::map<std::string, int> ranks;
  while (std::getline(in, line)) {
    if (line.rfind("layers: ", 0) != 0) continue;
    std::stringstream words(line.substr(8));
    std::string word;
    int rank = 0;
    while (words >> word) {
      if (word == "<") {
        ++rank;
      } else if (word != "=") {
        ranks[word] = rank;
      }
    }
  }
  return ranks;
}

// Upward includes that are known and have an issue: "file -> layer".
const std::set<std::string>& known_exceptions() {
  static const std::set<std::string> known = {};
  return known;
}

// Every upward include under `root` (a folder holding one subfolder per layer).
std::vector<std::string> upward_includes(const fs::path& root, const std::string& prefix,
                                         const std::map<std::string, int>& ranks) {
  static const std::regex include(R"(^\s*#\s*include\s*"loom/([a-z_0-9]+)/)");
  std::vector<std::string> found;
  if (!fs::exists(root)) return found;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    const auto ext = entry.path().extension().string();
    if (ext != ".h" && ext != ".cpp" && ext != ".inc" && ext != ".cu" && ext != ".cuh") continue;
    const std::string layer = fs::relative(entry.path(), root).begin()->string();
    auto own = ranks.find(layer);
    if (own == ranks.end()) continue;
    std::ifstream in(entry.path());
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      std::smatch match;
      if (!std::regex_search(line, match, include)) continue;
      auto target = ranks.find(match[1].str());
      if (target == ranks.end() || target->second <= own->second) continue;
      const std::string file = prefix + fs::relative(entry.path(), root).string();
      if (known_exceptions().count(file + " -> " + match[1].str())) continue;
      found.push_back(file + ":" + std::to_string(number) + " (" + layer + ") includes loom/" +
                      match[1].str() + "/");
    }
  }
  return found;
}

std::vector<std::string> tree_violations(const fs::path& source,
                                         const std::map<std::string, int>& ranks) {
  auto found = upward_includes(source / "include/loom", "include/loom/", ranks);
  auto more = upward_includes(source / "src", "src/", ranks);
  found.insert(found.end(), more.begin(), more.end());
  return found;
}

}  // namespace

TEST(Layering, NoFileIncludesFromALayerAboveItsOwn) {
  const auto ranks = layer_ranks();
  ASSERT_GE(ranks.size(), 15u) << "docs/architecture.md lost its 'layers:' line";
  // Every folder of the tree is a layer of the list (a new folder needs its place in it).
  for (const auto& entry : fs::directory_iterator(std::string(LOOM_SOURCE_DIR) + "/src")) {
    if (entry.is_directory()) {
      EXPECT_TRUE(ranks.count(entry.path().filename().string()))
          << "src/" << entry.path().filename().string()
          << " is not in docs/architecture.md's layers";
    }
  }
  const auto found = tree_violations(LOOM_SOURCE_DIR, ranks);
  std::string all;
  for (const auto& v : found) all += "\n  " + v;
  EXPECT_TRUE(found.empty()) << "includes from a layer above:" << all;
}

// The check can fail: a copy of one header with a planted upward include is found.
TEST(Layering, APlantedUpwardIncludeIsFound) {
  const auto ranks = layer_ranks();
  const fs::path tree = loom::testing::fresh_temp_dir("layering_plant");
  fs::create_directories(tree / "include/loom/core");
  fs::create_directories(tree / "src/parallel");
  std::ofstream(tree / "include/loom/core/planted.h") << "#pragma once\n#include \"loom/train/trainer.h\"\n";
  std::ofstream(tree / "src/parallel/fine.cpp") << "#include \"loom/distributed/comm.h\"\n";
  const auto found = tree_violations(tree, ranks);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NE(found[0].find("include/loom/core/planted.h:2 (core) includes loom/train/"),
            std::string::npos)
      << found[0];
}
