// The checkpoint reader end to end (LibTorch): a real step folder (two shard files written by
// loom at start-up) read through a fuzzed index.json. Every tensor the index lists is read;
// any index gives tensors or a loom::InputError, never a read outside the mapped files. With
// LOOM_FUZZ_SEED_OUT set, start-up also copies the folder's files there (the seed corpora).
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>

#include "fuzz_util.h"
#include "loom/checkpoint/chunks.h"
#include "loom/core/check.h"
#include "loom/core/files.h"

namespace {

std::string make_step_folder() {
  const std::string folder = loom::fuzz::scratch_dir() + "/step";
  std::filesystem::create_directories(folder);
  at::manual_seed(1);
  const at::Tensor w = at::randn({6, 4});
  loom::checkpoint::LocalChunk top{"w", {6, 4}, {0, 0}, w.narrow(0, 0, 3).clone()};
  loom::checkpoint::LocalChunk bottom{"w", {6, 4}, {3, 0}, w.narrow(0, 3, 3).clone()};
  auto b = loom::checkpoint::whole_chunk("b", at::randn({5}).to(at::kBFloat16));
  auto n = loom::checkpoint::whole_chunk("n", at::arange(3, at::kLong));
  auto part0 = loom::checkpoint::write_chunk_file(folder + "/rank-00000.safetensors", {top, b});
  auto part1 = loom::checkpoint::write_chunk_file(folder + "/rank-00001.safetensors", {bottom, n});
  auto index = loom::checkpoint::step_index({part0, part1}, {2, 2, 2, false});
  loom::files::write_atomic(folder + "/seed-index.json", index.dump(1));
  if (const char* out = std::getenv("LOOM_FUZZ_SEED_OUT")) {
    std::filesystem::create_directories(out);
    for (const char* name :
         {"seed-index.json", "rank-00000.safetensors", "rank-00001.safetensors"}) {
      std::filesystem::copy_file(folder + "/" + name, std::string(out) + "/" + name,
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }
  return folder;
}

std::string g_folder;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_folder = make_step_folder();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& folder = g_folder;
  loom::fuzz::write_input("step/index.json", data, size);
  try {
    loom::checkpoint::CheckpointReader reader(folder);
    for (const auto& fqn : reader.tensor_names()) reader.read_whole(fqn);
  } catch (const loom::InputError&) {
  }
  return 0;
}
