#include "loom/core/cpu_memory_limit.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace loom {
namespace {

// Wraps the allocator LibTorch had: keeps each block's size and its original deleter so that
// frees (through the returned DataPtr or raw_deallocate) give the bytes back.
class LimitedCpuAllocator final : public c10::Allocator {
 public:
  explicit LimitedCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    const uint64_t live = live_.fetch_add(n) + n;
    const uint64_t limit = limit_.load();
    if (limit > 0 && live > limit) {
      live_.fetch_sub(n);
      TORCH_CHECK_WITH(
          OutOfMemoryError, false,
          fmt::format("CPU tensor memory exhausted: allocating {:.1f} MiB with "
                      "{:.1f} MiB live would pass {} = {:.3f} GiB",
                      n / 1048576.0, (live - n) / 1048576.0, key(), limit / 1073741824.0));
    }
    c10::DataPtr inner;
    try {
      inner = base_->allocate(n);
    } catch (...) {
      live_.fetch_sub(n);
      throw;
    }
    void* data = inner.get();
    if (data == nullptr) {
      live_.fetch_sub(n);
      return inner;
    }
    uint64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    const c10::DeleterFnPtr deleter = inner.get_deleter();
    TORCH_INTERNAL_ASSERT(inner.get_context() == data, "the CPU allocator's pointers are simple");
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[data] = Block{n, deleter};
    }
    return {data, data, &LimitedCpuAllocator::free, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &LimitedCpuAllocator::free; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void set_limit(uint64_t bytes, const std::string& key) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      key_ = key;
    }
    limit_ = bytes;
  }
  CpuTensorMemory usage() const { return {live_.load(), peak_.load()}; }

  static LimitedCpuAllocator* instance;

 private:
  struct Block {
    size_t bytes;
    c10::DeleterFnPtr deleter;
  };

  static void free(void* data) {
    LimitedCpuAllocator& self = *instance;
    Block block{};
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.blocks_.find(data);
      TORCH_INTERNAL_ASSERT(it != self.blocks_.end(), "freeing a CPU block loom did not count");
      block = it->second;
      self.blocks_.erase(it);
    }
    self.live_.fetch_sub(block.bytes);
    block.deleter(data);
  }

  std::string key() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return key_;
  }

  c10::Allocator* base_;
  std::atomic<uint64_t> live_{0}, peak_{0}, limit_{0};
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  std::string key_;
};

LimitedCpuAllocator* LimitedCpuAllocator::instance = nullptr;

}  // namespace

void limit_cpu_tensor_memory(uint64_t bytes, const std::string& key) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    // Lives as long as the process: blocks may be freed during static destruction.
    LimitedCpuAllocator::instance = new LimitedCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(LimitedCpuAllocator::instance, /*priority=*/100);
  });
  LimitedCpuAllocator::instance->set_limit(bytes, key);
}

CpuTensorMemory cpu_tensor_memory() {
  return LimitedCpuAllocator::instance ? LimitedCpuAllocator::instance->usage() : CpuTensorMemory{};
}

}  // namespace loom
