// bin/libloom_cuda.so: loom's CUDA support (include/loom/core/cuda_support.h). Built only when
// LOOM_WITH_CUDA; links LibTorch's CUDA half, and nothing of loom's but headers, so that it binds
// to no copy of loom's own state.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/memory_snapshot.h>

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#if LOOM_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
// LibTorch's own NCCL wrapper: asks the NCCL library LibTorch loads, not whichever one the
// linker would find first.
#include <torch/csrc/cuda/nccl.h>
#else
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include "loom/core/cuda_support.h"

namespace loom::device {
namespace {

// The step's work on a pool stream (a graph cannot be captured on the default stream), fenced
// with events: it starts after the current stream's work (the batch's copies) and the current
// stream's next work (reading the loss, validation) starts after it.
class CudaStepGraph final : public StepGraph {
 public:
  explicit CudaStepGraph(int index)
      : index_(static_cast<c10::DeviceIndex>(index)),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index_)) {}

  void run(const std::function<void()>& body) override { on_graph_stream(body); }

  void capture(const std::function<void()>& body) override {
    // The eager steps' activations sit cached in the allocator's general pool; the graph gets a
    // pool of its own, so without this the step's activations would be held twice (one-time
    // device synchronization).
    c10::cuda::CUDACachingAllocator::emptyCache();
    on_graph_stream([&] {
      // Autocast's cache of cast weights would outlive the region it was made in inside the
      // graph's pool; PyTorch captures with it off.
      const bool cache = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);
      // Thread-local: another thread's CUDA calls during the capture (c10d's NCCL watchdog
      // querying its events, the checkpoint writer's copies) neither fail nor spoil the graph.
      graph_.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        body();
      } catch (...) {
        // End the capture so the stream and the allocator leave capture mode and the original
        // error is the one reported (ending an invalidated capture fails too; that is expected).
        try {
          graph_.capture_end();
        } catch (...) {
        }
        graph_.reset();
        at::autocast::set_autocast_cache_enabled(cache);
        throw;
      }
      graph_.capture_end();
      at::autocast::set_autocast_cache_enabled(cache);
    });
  }

  void replay() override {
    on_graph_stream([&] {
      graph_.replay();
      replays_.emplace_back();
      replays_.back().record(stream_);
    });
  }

  void wait_for_replays(size_t in_flight) override {
    while (replays_.size() > in_flight) {
      replays_.front().synchronize();
      replays_.pop_front();
    }
  }

 private:
  void on_graph_stream(const std::function<void()>& work) {
    c10::cuda::CUDAGuard device(index_);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(index_);
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(stream_);
    {
      c10::cuda::CUDAStreamGuard on_stream(stream_);
      work();
    }
    at::cuda::CUDAEvent done;
    done.record(stream_);
    done.block(current);
  }

  c10::DeviceIndex index_;
  c10::cuda::CUDAStream stream_;
  at::cuda::CUDAGraph graph_;
  std::deque<at::cuda::CUDAEvent> replays_;  // recorded after each replay, oldest first
};

class CudaSupportLibrary final : public CudaSupport {
 public:
  std::string runtime_version() const override {
    int runtime = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) return "";
    return std::to_string(runtime / 1000) + "." + std::to_string((runtime / 10) % 100);
  }

  std::string nccl_version() const override {
#if LOOM_WITH_NCCL
    // torch::cuda::nccl::version() packs major << 32 | minor << 16 | patch.
    const std::uint64_t nccl = torch::cuda::nccl::version();
    return std::to_string(nccl >> 32) + "." + std::to_string((nccl >> 16) & 0xffff) + "." +
           std::to_string(nccl & 0xffff);
#else
    return "";
#endif
  }

  int device_count() const override {
    return c10::cuda::device_count();
  }

  std::optional<CudaDeviceProperties> properties(int index) const override {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) return std::nullopt;
    return CudaDeviceProperties{properties.name, properties.major, properties.minor,
                                static_cast<double>(properties.totalGlobalMem)};
  }

  double peak_allocated_bytes(int index) const override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return static_cast<double>(stats.allocated_bytes[0].peak);
  }

  void record_memory_history(int64_t max_entries) const override {
    // (Explicit optionals: a string literal would pick the bool overload.)
    torch::cuda::_record_memory_history(std::optional<std::string>("all"),
                                        std::optional<std::string>("all"), "all", max_entries);
  }

  std::string memory_snapshot_pickled() const override {
    return torch::cuda::_memory_snapshot_pickled();
  }

  at::Generator make_generator(int index, uint64_t seed) const override {
    auto generator = at::make_generator<at::CUDAGeneratorImpl>(index);
    generator.set_current_seed(seed);
    return generator;
  }

  c10::intrusive_ptr<c10d::Backend> make_nccl_backend(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      std::chrono::milliseconds timeout) const override {
#if LOOM_WITH_NCCL
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
    (void)store, (void)rank, (void)size, (void)timeout;
    TORCH_CHECK(false,
                "CUDA collectives need NCCL, and this loom was built without it "
                "(LOOM_WITH_NCCL=OFF)");
#endif
  }

  std::unique_ptr<StepGraph> make_step_graph(int index) const override {
    return std::make_unique<CudaStepGraph>(index);
  }

  double time_on_device(int index, const std::function<void()>& work, int repeats) const override {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(index));
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
    work();  // first-use costs (workspaces, plans, autotuning) stay out of the timing
    std::vector<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>> marks(
        static_cast<size_t>(std::max(1, repeats)));
    for (auto& [start, end] : marks) {
      start = at::cuda::CUDAEvent(cudaEventDefault);
      end = at::cuda::CUDAEvent(cudaEventDefault);
      start.record(stream);
      work();
      end.record(stream);
    }
    stream.synchronize();
    std::vector<double> ms;
    for (auto& [start, end] : marks) ms.push_back(start.elapsed_time(end));
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return ms[ms.size() / 2];
  }

  bool capturing(int index) const override {
    c10::cuda::CUDAGuard device(static_cast<c10::DeviceIndex>(index));
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(), &status));
    return status != cudaStreamCaptureStatusNone;
  }
};

}  // namespace
}  // namespace loom::device

extern "C" __attribute__((visibility("default"))) const loom::device::CudaSupport*
loom_cuda_support() {
  static const loom::device::CudaSupportLibrary instance;
  return &instance;
}
