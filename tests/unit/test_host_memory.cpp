// keep_freed_host_memory(): big blocks come from the heap and stay there once freed, so a
// training step reuses last step's pages; malloc settings the user chose are left alone.
#include <gtest/gtest.h>

#include <cstdlib>
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
#endif

}  // namespace
