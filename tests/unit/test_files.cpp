#include <gtest/gtest.h>

#include <filesystem>

#include "loom/core/check.h"
#include "loom/core/files.h"
#include "support/process.h"

namespace fs = std::filesystem;

TEST(Files, WriteAtomicReplacesContentAndLeavesNoTemporaries) {
  std::string dir = loom::testing::fresh_temp_dir("files_atomic");
  std::string path = dir + "/config.toml";
  loom::files::write_atomic(path, "first");
  loom::files::write_atomic(path, "second version");
  EXPECT_EQ(loom::testing::read_text(path), "second version");
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(Files, WriteAtomicIntoMissingFolderNamesThePath) {
  std::string dir = loom::testing::fresh_temp_dir("files_missing");
  try {
    loom::files::write_atomic(dir + "/no/such/folder/x.txt", "x");
    FAIL() << "expected IoError";
  } catch (const loom::IoError& error) {
    EXPECT_NE(error.message().find("no/such/folder"), std::string::npos) << error.message();
  }
}

TEST(Files, CreateDirectoriesMakesParents) {
  std::string dir = loom::testing::fresh_temp_dir("files_dirs");
  loom::files::create_directories(dir + "/a/b/c");
  EXPECT_TRUE(fs::is_directory(dir + "/a/b/c"));
  // A file in the way is an error that names the path.
  loom::files::write_atomic(dir + "/blocker", "x");
  EXPECT_THROW(loom::files::create_directories(dir + "/blocker/sub"), loom::IoError);
}

// Output subfolders: relative inside the dump folder, absolute as given, climbing out refused
// naming the key.
TEST(Files, OutputFoldersStayInsideTheDumpFolderUnlessAbsolute) {
  using loom::files::output_folder;
  EXPECT_EQ(output_folder("/runs/a", "tb", "metrics.save_tb_folder"), "/runs/a/tb");
  EXPECT_EQ(output_folder("/runs/a", "logs/tb", "metrics.save_tb_folder"), "/runs/a/logs/tb");
  EXPECT_EQ(output_folder("/runs/a", "/shared/tb", "metrics.save_tb_folder"), "/shared/tb");
  EXPECT_EQ(output_folder("/runs/a", "", "checkpoint.folder"), "/runs/a");
  for (const char* escape : {"../x", "tb/../../x", ".."}) {
    try {
      output_folder("/runs/a", escape, "metrics.save_tb_folder");
      ADD_FAILURE() << escape << " was accepted";
    } catch (const loom::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("metrics.save_tb_folder = \"" + std::string(escape)),
                std::string::npos)
          << e.what();
    }
  }
}
