// A yes/no answer about a CUDA device that is costly to find out (its properties, whether a
// kernel agrees with a reference on it), asked once per device index and kept. Thread-safe.
#pragma once

#include <ATen/core/TensorBody.h>

#include <map>
#include <mutex>

namespace loom {

class PerDeviceAnswer {
 public:
  // `ask(index)` the first time a device index is seen; the kept answer after.
  template <typename Ask>
  bool get(const at::Device& device, Ask ask) {
    const int index = device.has_index() ? device.index() : 0;
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = known_.find(index);
    if (it == known_.end()) it = known_.emplace(index, ask(index)).first;
    return it->second;
  }

 private:
  std::mutex mutex_;
  std::map<int, bool> known_;
};

}  // namespace loom
