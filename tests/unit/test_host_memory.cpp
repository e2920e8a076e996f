// keep_freed_host_memory(): big blocks come from the heap and stay there once freed, so a
// training step reuses last step's pages; malloc settings the user chose are left alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "loom/train/host_memory.h"

namespace {

// Sets (or, with nullopt, unsets) an environment variable for the scope of the guard.
class EnvGuard {
 public:
  EnvGuard(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~EnvGuard() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(HostMemory, UserMallocSettingsAreKept) {
  {
    EnvGuard tunables("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=4096");
    const auto policy = loom::train::keep_freed_host_memory();
    EXPECT_FALSE(policy.applied);
    EXPECT_NE(policy.description.find("GLIBC_TUNABLES"), std::string::npos) << policy.description;
  }
  {
    EnvGuard tunables("GLIBC_TUNABLES", std::nullopt);
    EnvGuard arenas("MALLOC_ARENA_MAX", "2");
    const auto policy = loom::train::keep_freed_host_memory();
    EXPECT_FALSE(policy.applied);
    EXPECT_NE(policy.description.find("MALLOC_ARENA_MAX"), std::string::npos);
  }
}

#if defined(__GLIBC__)
TEST(HostMemory, FreedBlocksStayInTheHeapForTheNextStep) {
  EnvGuard tunables("GLIBC_TUNABLES", std::nullopt);
  const auto policy = loom::train::keep_freed_host_memory();
  ASSERT_TRUE(policy.applied) << policy.description;  // names a MALLOC_* the test env sets
  // Three activation-sized blocks, 72 MiB in all: glibc's own trim threshold never passes
  // 64 MiB (twice its learned mmap threshold), so without the policy freeing them trims the
  // heap whatever this process allocated before.
  constexpr size_t kBlock = 24u << 20;
  static_assert(kBlock < loom::train::kHeapBlockLimitBytes);
  const struct mallinfo2 before = mallinfo2();
  char* blocks[3];
  for (char*& block : blocks) {
    block = static_cast<char*>(std::malloc(kBlock));
    ASSERT_NE(block, nullptr);
    std::memset(block, 1, kBlock);
  }
  const struct mallinfo2 held = mallinfo2();
  EXPECT_EQ(held.hblks, before.hblks) << "a block got its own mmap";
  for (char* block : blocks) std::free(block);
  const struct mallinfo2 freed = mallinfo2();
  EXPECT_GE(freed.arena, held.arena) << "the heap was trimmed on free";
  EXPECT_GE(freed.fordblks, 3 * kBlock) << "the freed blocks are not kept for reuse";
  // The next step's blocks reuse them: the heap does not grow.
  for (char*& block : blocks) block = static_cast<char*>(std::malloc(kBlock));
  EXPECT_EQ(mallinfo2().arena, freed.arena);
  for (char* block : blocks) std::free(block);
}

// The AnonHugePages of the mappings overlapping [begin, end) in /proc/self/smaps, in KiB.
long huge_kib_in(uintptr_t begin, uintptr_t end) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool overlaps = false;
  long kib = 0;
  while (std::getline(smaps, line)) {
    uintptr_t from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2 && line.find(':') > 20) {
      overlaps = from < end && begin < to;
    } else if (overlaps && line.rfind("AnonHugePages:", 0) == 0) {
      kib += std::stol(line.substr(14));
    }
  }
  return kib;
}

TEST(HostMemory, AdvisedHeapServesTheNextTensorsFromHugePages) {
  const std::string mode = loom::train::transparent_huge_page_mode();
  if (mode != "madvise") GTEST_SKIP() << "transparent huge pages are '" << mode << "' here";
  EnvGuard tunables("GLIBC_TUNABLES", std::nullopt);
  ASSERT_TRUE(loom::train::keep_freed_host_memory().applied);
  constexpr size_t kAdvised = 256u << 20;
  EXPECT_GE(loom::train::advise_heap_huge_pages(kAdvised), kAdvised - (4u << 20));
  // A step's worth of activation-sized heap blocks, written as kernels' outputs would be. The
  // first may reuse free heap pages touched before the advice (4 KiB ones, e.g. the previous
  // test's); the rest come from the advised address space.
  constexpr size_t kBlock = 24u << 20;
  std::vector<char*> blocks;
  uintptr_t lowest = UINTPTR_MAX, highest = 0;
  for (size_t total = 0; total + kBlock <= kAdvised - (16u << 20); total += kBlock) {
    char* block = static_cast<char*>(std::malloc(kBlock));
    ASSERT_NE(block, nullptr);
    std::memset(block, 1, kBlock);
    blocks.push_back(block);
    lowest = std::min(lowest, reinterpret_cast<uintptr_t>(block));
    highest = std::max(highest, reinterpret_cast<uintptr_t>(block) + kBlock);
  }
  // Without the advice the heap's pages are all 4 KiB ones: AnonHugePages stays 0.
  EXPECT_GE(huge_kib_in(lowest, highest), 64 << 10) << "the blocks are not in huge pages";
  for (char* block : blocks) std::free(block);
}
#endif

}  // namespace
