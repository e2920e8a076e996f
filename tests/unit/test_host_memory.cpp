// keep_freed_host_memory(): big blocks come from the heap and stay there once freed, so a
// training step reuses last step's pages; malloc settings the user chose are left alone.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cstring>
#include <optional>
#include <string>

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

// The AnonHugePages of the mapping holding `address` in /proc/self/smaps, in KiB (-1: not found).
long huge_kib_at(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(':') > 20) {
      inside = begin <= target && target < end;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stol(line.substr(14));
    }
  }
  return -1;
}

std::string transparent_huge_page_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const auto open = line.find('['), close = line.find(']');
  return open == std::string::npos || close == std::string::npos
             ? ""
             : line.substr(open + 1, close - open - 1);
}

// Its own suite, so its own process under ctest: a heap that earlier tests filled and freed
// serves the next block from pages they already touched (4 KiB ones, advised or not).
TEST(HostHugePages, AdvisedHeapServesTheNextTensorsFromHugePages) {
  if (transparent_huge_page_mode() != "madvise") {
    GTEST_SKIP() << "transparent huge pages are '" << transparent_huge_page_mode()
                 << "' here, not 'madvise'";
  }
  EnvGuard tunables("GLIBC_TUNABLES", std::nullopt);
  ASSERT_TRUE(loom::train::keep_freed_host_memory().applied);
  constexpr size_t kAdvised = 256u << 20;
  EXPECT_GE(loom::train::advise_heap_huge_pages(kAdvised), kAdvised - (4u << 20));
  // An activation-sized block from the advised heap, written as a kernel's output would be.
  constexpr size_t kBlock = 24u << 20;
  char* block = static_cast<char*>(std::malloc(kBlock));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBlock);
  // Without the advice the heap's pages are 4 KiB ones: AnonHugePages stays 0. (The block's
  // first bytes may lie in the heap's mapping before the advised range; its middle does not.)
  EXPECT_GE(huge_kib_at(block + kBlock / 2), 16 << 10) << "the block is not in huge pages";
  std::free(block);
}
#endif

}  // namespace
