// Checkpoint files from someone else: every alteration of an index, a shard's header, the train
// state or the RNG state is refused with loom::InputError naming the file, before any byte is
// read out of bounds (these cases crashed loom with SIGSEGV before the index was checked), and
// nothing loom did not write is removed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "../src/checkpoint/state_io.h"
#include "loom/checkpoint/chunk_index.h"
#include "loom/checkpoint/chunks.h"
#include "loom/checkpoint/resume_compat.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/checkpoint/safetensors_header.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "support/process.h"

namespace fs = std::filesystem;
using loom::checkpoint::CheckpointReader;
using nlohmann::json;

namespace {

// One step folder: "w" [6, 4] float32 in two dim-0 chunks, "b" [5] bfloat16 whole.
std::string save_step(const std::string& name) {
  const std::string folder = loom::testing::fresh_temp_dir(name);
  at::manual_seed(5);
  const at::Tensor w = at::randn({6, 4});
  const at::Tensor b = at::randn({5}).to(at::kBFloat16);
  loom::checkpoint::LocalChunk top{"w", {6, 4}, {0, 0}, w.narrow(0, 0, 3).clone()};
  loom::checkpoint::LocalChunk bottom{"w", {6, 4}, {3, 0}, w.narrow(0, 3, 3).clone()};
  auto part0 = loom::checkpoint::write_chunk_file(folder + "/rank-00000.safetensors",
                                                  {top, loom::checkpoint::whole_chunk("b", b)});
  auto part1 = loom::checkpoint::write_chunk_file(folder + "/rank-00001.safetensors", {bottom});
  json index = loom::checkpoint::step_index({part0, part1}, {3, 2, 2, false});
  loom::files::write_atomic(folder + "/index.json", index.dump(1));
  return folder;
}

json read_index(const std::string& folder) {
  return json::parse(std::ifstream(folder + "/index.json"));
}

// Applies `edit` to a fresh folder's index and expects reading every tensor to be refused with
// an InputError whose message holds `expected`.
void expect_refused(const std::string& name, const std::function<void(json&)>& edit,
                    const std::string& expected) {
  const std::string folder = save_step(name);
  json index = read_index(folder);
  edit(index);
  std::ofstream(folder + "/index.json") << index.dump(1);
  try {
    CheckpointReader reader(folder);
    for (const auto& fqn : reader.tensor_names()) reader.read_whole(fqn);
    ADD_FAILURE() << name << ": the altered index was accepted";
  } catch (const loom::InputError& error) {
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos)
        << name << ": " << error.what();
    EXPECT_NE(std::string(error.what()).find(folder), std::string::npos)
        << name << ": the message does not name the file: " << error.what();
  }
}

json& chunk(json& index, const char* fqn, size_t i) {
  return index["tensors"][fqn]["chunks"][i];
}

}  // namespace

TEST(HostileCheckpoints, UnalteredStepReadsBack) {
  const std::string folder = save_step("hostile_ok");
  CheckpointReader reader(folder);
  EXPECT_EQ(reader.read_whole("w").sizes().vec(), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(reader.read_whole("b").scalar_type(), at::kBFloat16);
}

TEST(HostileCheckpoints, IndexAlterationsAreRefusedBeforeAnyRead) {
  // Used to read past the chunk (SIGSEGV): a wider dtype than the bytes hold.
  expect_refused(
      "hostile_f64", [](json& i) { i["tensors"]["w"]["dtype"] = "F64"; }, "need 96 bytes");
  // A shortened byte range whose CRC matches the shorter bytes: used to read past it too.
  expect_refused(
      "hostile_short_range",
      [](json& i) {
        auto& c = chunk(i, "w", 0);
        c["byte_range"][1] = c["byte_range"][1].get<uint64_t>() - 8;
      },
      "need 48 bytes");
  expect_refused(
      "hostile_rank", [](json& i) { chunk(i, "w", 0)["offsets"] = {0}; }, "tensor's rank 2");
  expect_refused(
      "hostile_outside",
      [](json& i) {
        chunk(i, "w", 1)["offsets"] = {5, 0};
      },
      "outside the tensor");
  expect_refused(
      "hostile_lengths",
      [](json& i) {
        chunk(i, "w", 0)["lengths"] = {7, 4};
      },
      "outside the tensor");
  expect_refused(
      "hostile_negative",
      [](json& i) {
        chunk(i, "w", 0)["offsets"] = {-3, 0};
      },
      "outside [0,");
  expect_refused(
      "hostile_overlap",
      [](json& i) {
        chunk(i, "w", 1)["offsets"] = {2, 0};
      },
      "overlap");
  expect_refused(
      "hostile_gap", [](json& i) { i["tensors"]["w"]["chunks"].erase(1); }, "cover 12 of its 24");
  expect_refused(
      "hostile_range_outside",
      [](json& i) {
        auto& c = chunk(i, "b", 0);
        c["byte_range"] = {1u << 30, (1u << 30) + 10};
      },
      "outside 'rank-00000.safetensors'");
  expect_refused(
      "hostile_shared_bytes",
      [](json& i) {
        // "b" (10 bytes) moved onto the first bytes of "w"'s chunk in the same file.
        chunk(i, "b", 0)["byte_range"] = {chunk(i, "w", 0)["byte_range"][0],
                                          chunk(i, "w", 0)["byte_range"][0].get<uint64_t>() + 10};
      },
      "share bytes");
  expect_refused(
      "hostile_version", [](json& i) { i["version"] = 2; }, "index version 2");
  expect_refused(
      "hostile_no_version", [](json& i) { i.erase("version"); }, "'version' is missing");
  expect_refused(
      "hostile_dtype", [](json& i) { i["tensors"]["b"]["dtype"] = "C64"; }, "unsupported dtype");
  expect_refused(
      "hostile_type", [](json& i) { chunk(i, "w", 0)["crc32"] = "abc"; },
      "crc32 must be an integer");
  expect_refused(
      "hostile_crc_range", [](json& i) { chunk(i, "w", 0)["crc32"] = 1ull << 33; }, "crc32 is");
  expect_refused(
      "hostile_fraction",
      [](json& i) {
        chunk(i, "w", 0)["lengths"] = {3.5, 4};
      },
      "must be an integer, found 3.5");
  expect_refused(
      "hostile_escape",
      [](json& i) {
        i["files"]["../rank-00000.safetensors"] = i["files"]["rank-00000.safetensors"];
      },
      "plain name inside the step folder");
  expect_refused(
      "hostile_unknown_file", [](json& i) { chunk(i, "w", 1)["file"] = "other"; },
      "not listed under \"files\"");
  expect_refused(
      "hostile_huge_shape",
      [](json& i) {
        i["tensors"]["w"]["shape"] = {1ll << 40, 1ll << 40};
      },
      "shape too large");
  expect_refused(
      "hostile_unaligned",
      [](json& i) {
        auto& c = chunk(i, "w", 0);
        c["byte_range"] = {c["byte_range"][0].get<uint64_t>() + 2,
                           c["byte_range"][1].get<uint64_t>() + 2};
      },
      "not aligned");
}

TEST(HostileCheckpoints, DuplicateKeysAreRefused) {
  const std::string folder = save_step("hostile_duplicate");
  std::string text = loom::testing::read_text(folder + "/index.json");
  // The same key twice in one object: which one is meant is ambiguous.
  text.insert(text.find('{') + 1, "\"version\": 1, ");
  std::ofstream(folder + "/index.json") << text;
  try {
    CheckpointReader reader(folder);
    FAIL() << "an index with a duplicate key was accepted";
  } catch (const loom::InputError& error) {
    EXPECT_NE(std::string(error.what()).find("'version' appears twice"), std::string::npos)
        << error.what();
  }
}

TEST(HostileCheckpoints, FifoAndFolderInPlaceOfFilesAreRefusedWithoutHanging) {
  {
    const std::string folder = save_step("hostile_fifo_index");
    fs::remove(folder + "/index.json");
    ASSERT_EQ(::mkfifo((folder + "/index.json").c_str(), 0644), 0);
    try {
      CheckpointReader reader(folder);
      FAIL() << "a FIFO index was opened";
    } catch (const loom::InputError& error) {
      EXPECT_NE(std::string(error.what()).find("FIFO"), std::string::npos) << error.what();
    }
  }
  {
    const std::string folder = save_step("hostile_fifo_shard");
    fs::remove(folder + "/rank-00001.safetensors");
    ASSERT_EQ(::mkfifo((folder + "/rank-00001.safetensors").c_str(), 0644), 0);
    CheckpointReader reader(folder);
    EXPECT_THROW(reader.read_whole("w"), loom::InputError);
  }
  {
    const std::string folder = save_step("hostile_dir_index");
    fs::remove(folder + "/index.json");
    fs::create_directories(folder + "/index.json");
    EXPECT_THROW(CheckpointReader{folder}, loom::InputError);
  }
}

TEST(HostileSafetensors, HeaderAlterationsAreRefused) {
  const std::string folder = loom::testing::fresh_temp_dir("hostile_st");
  auto header_file = [&](const std::string& name, const std::string& header, size_t data) {
    std::string content(8, '\0');
    for (int i = 0; i < 8; ++i) content[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    content += header + std::string(data, '\0');
    std::ofstream(folder + "/" + name, std::ios::binary) << content;
    return folder + "/" + name;
  };
  auto refused = [&](const std::string& path, const std::string& expected) {
    try {
      loom::checkpoint::load_safetensors(path);
      ADD_FAILURE() << path << " was accepted";
    } catch (const loom::InputError& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    }
  };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(loom::checkpoint::load_safetensors(header_file("ok.st", ok, 8)).tensors.size(), 1u);
  refused(header_file("dup.st",
                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                      16),
          "appears twice");
  refused(header_file("overlap.st",
                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      16),
          "overlapping data_offsets");
  refused(
      header_file("negative.st", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
      "outside [0,");
  refused(header_file(
              "huge.st",
              R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
          "more bytes than the file holds");
  refused(header_file("past.st", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8),
          "outside the data section");
  refused(header_file("short.st", R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", 16),
          "need 16 bytes");
  refused(header_file("notobject.st", R"([1,2])", 0), "expected a JSON object");
  refused(header_file("deep.st", std::string(5000, '[') + std::string(5000, ']'), 0),
          "nested deeper");
}

TEST(HostileCheckpointState, TrainStateAndRngStateAreChecked) {
  const std::string folder = loom::testing::fresh_temp_dir("hostile_state");
  using namespace loom::checkpoint::detail;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(folder + "/" + name) << text;
    return folder + "/" + name;
  };
  EXPECT_EQ(read_train_state(
                write("ok.json", R"({"step":4,"tokens_seen":10,"lr_scheduler":{"step":4}})"), 4)
                .step,
            4);
  EXPECT_THROW(
      read_train_state(
          write("neg.json", R"({"step":-4,"tokens_seen":10,"lr_scheduler":{"step":0}})"), -1),
      loom::InputError);
  EXPECT_THROW(
      read_train_state(
          write("other.json", R"({"step":9,"tokens_seen":10,"lr_scheduler":{"step":0}})"), 4),
      loom::InputError);
  EXPECT_THROW(
      read_train_state(
          write("lr.json", R"({"step":4,"tokens_seen":10,"lr_scheduler":{"step":-1}})"), 4),
      loom::InputError);
  // The schedule's position may pass the step: a run that excluded train_state but kept the
  // schedule counts its steps from 1 again.
  EXPECT_EQ(read_train_state(
                write("ahead.json", R"({"step":4,"tokens_seen":10,"lr_scheduler":{"step":9}})"), 4)
                .lr_step,
            9);
  EXPECT_THROW(
      read_train_state(
          write("type.json", R"({"step":"4","tokens_seen":10,"lr_scheduler":{"step":0}})"), 4),
      loom::InputError);
  // The RNG state: wrong length, bytes outside 0..255, or an invalid Mersenne Twister position.
  EXPECT_THROW(restore_generator(std::vector<uint8_t>(7, 0), "x"), loom::InputError);
  EXPECT_THROW(
      read_rank_state(write("rng.json", R"({"state":{"dp_rank":0,"rng":{"cpu":[1,300]}}})")),
      loom::InputError);
  const auto good = generator_state()["cpu"].get<std::vector<uint8_t>>();
  auto bad = good;
  // The position ("left", an int after the 8-byte seed) far beyond the 624-word state.
  bad[8] = 0xff;
  bad[9] = 0xff;
  bad[10] = 0x00;
  bad[11] = 0x00;
  EXPECT_THROW(restore_generator(bad, "rank.json"), loom::InputError);
  const float before = at::rand({1}).item<float>();
  restore_generator(good, "rank.json");  // the generator still works
  (void)before;
  EXPECT_TRUE(std::isfinite(at::rand({1}).item<float>()));
}

TEST(HostileCheckpointState, StepFoldersHoldingForeignFilesAreNeverRemoved) {
  using namespace loom::checkpoint::detail;
  const std::string folder = save_step("hostile_remove");
  std::ofstream(folder + "/notes.txt") << "mine";
  EXPECT_THROW(remove_step_folder(folder), loom::IoError);
  EXPECT_TRUE(fs::exists(folder + "/notes.txt"));
  fs::remove(folder + "/notes.txt");
  std::ofstream(folder + "/COMPLETE") << "step 3\n";
  remove_step_folder(folder);
  EXPECT_FALSE(fs::exists(folder));
  // Not a folder at all.
  const std::string file = loom::testing::fresh_temp_dir("hostile_remove_file") + "/step-1";
  std::ofstream(file) << "x";
  EXPECT_THROW(remove_step_folder(file), loom::IoError);
  EXPECT_TRUE(fs::exists(file));
}

// A resume whose config tokenizes another field of each record continues the loader's position
// in another token stream: refused for the data loader's state, named, and allowed once the
// loader's state is excluded.
TEST(ResumeConflicts, AnotherTextFieldIsTheDataLoadersConflict) {
  loom::config::JobConfig saved, current;
  saved.training.dataset_text_field = "text";
  current.training.dataset_text_field = "content";
  const auto changes = loom::checkpoint::config_changes(saved, current);
  const auto conflicts = loom::checkpoint::resume_conflicts(changes, current, false);
  ASSERT_EQ(conflicts.size(), 1u);
  EXPECT_NE(conflicts[0].find("training.dataset_text_field \"text\" -> \"content\""),
            std::string::npos)
      << conflicts[0];
  EXPECT_NE(conflicts[0].find("exclude_from_loading = [\"dataloader\"]"), std::string::npos);
  current.checkpoint.exclude_from_loading = {"dataloader"};
  EXPECT_TRUE(loom::checkpoint::resume_conflicts(changes, current, false).empty());
}

// Another number of MTP depths is named before any load: the saved weights lack (or hold more)
// MTP modules, and every step was tried and called unreadable in turn.
TEST(ResumeConflicts, AChangedNumberOfMtpDepthsIsNamed) {
  loom::config::JobConfig saved, current;
  saved.model.num_mtp_layers = 0;
  current.model.num_mtp_layers = 1;
  const auto conflicts = loom::checkpoint::resume_conflicts(
      loom::checkpoint::config_changes(saved, current), current, false);
  ASSERT_EQ(conflicts.size(), 1u);
  EXPECT_NE(conflicts[0].find("model.num_mtp_layers 0 -> 1"), std::string::npos) << conflicts[0];
}

// A checkpoint saved without debug.seed before the drawn seed was recorded resumes under the seed
// this run drew: the data loader's own state decides (a streamed dataset's order has no seed).
// An explicit seed that differs from a saved one is still the data loader's conflict.
TEST(ResumeConflicts, ASeedDrawnWithoutARecordIsNoConflict) {
  loom::config::JobConfig saved, current;
  current.debug.seed = 1234;
  EXPECT_TRUE(loom::checkpoint::resume_conflicts(loom::checkpoint::config_changes(saved, current),
                                                 current, false)
                  .empty());
  saved.debug.seed = 7;
  EXPECT_EQ(loom::checkpoint::resume_conflicts(loom::checkpoint::config_changes(saved, current),
                                               current, false)
                .size(),
            1u);
}
