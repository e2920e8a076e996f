// loom's CUDA support lives in its own shared library, bin/libloom_cuda.so, which links
// LibTorch's CUDA half (libtorch_cuda, cuDNN, cuBLAS, NCCL). loom and the test binaries link only
// LibTorch's CPU half and load that library at start-up where a GPU may be present: loading the
// CUDA libraries costs ~0.2 s of CPU and ~130 MB of touched pages per process, which a CPU job,
// the launcher and every CLI command would otherwise pay.
//
// LibTorch caches its CUDA hooks the first time anything asks about CUDA (at::hasCUDA,
// at::manual_seed, ...): the library must be loaded before that, so `loom` loads it first thing
// in main() (load_cuda_support), and every function below loads it on first use as well.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace loom::device {

struct CudaDeviceProperties {
  std::string name;
  int major = 0;  // compute capability
  int minor = 0;
  double total_memory_bytes = 0;
};

// A training step recorded once as a CUDA graph and then replayed (train/step_graph.h). Its work
// runs on a stream of its own, ordered after what the current stream holds and before what the
// current stream is given next.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Runs `body` now, on the graph's stream (the eager steps before the capture).
  virtual void run(const std::function<void()>& body) = 0;
  // Records `body` into the graph, running none of its device work.
  virtual void capture(const std::function<void()>& body) = 0;
  // Runs the recorded work again (queued: the host does not wait for it).
  virtual void replay() = 0;
  // Blocks until at most `in_flight` replays are still queued or running, so the host runs at
  // most that many steps ahead of the device (and a replay that never ends blocks the host
  // here, where the collective watchdog sees it).
  virtual void wait_for_replays(size_t in_flight) = 0;
};

// What the CUDA library provides: everything of loom's that calls into CUDA, cuDNN or NCCL.
// Both sides are built from one tree by one build, so the interface is not versioned.
class CudaSupport {
 public:
  virtual ~CudaSupport() = default;
  virtual std::string runtime_version() const = 0;  // "13.0"; empty when the runtime is absent
  virtual std::string nccl_version() const = 0;     // "2.28.9"; empty without NCCL
  virtual int device_count() const = 0;             // 0 without a driver or a device
  virtual std::optional<CudaDeviceProperties> properties(int index) const = 0;
  // Peak bytes LibTorch's caching allocator has handed out on `index` since the start.
  virtual double peak_allocated_bytes(int index) const = 0;
  // The caching allocator's memory history: every allocation and free with its C++ context, up
  // to `max_entries`; and its snapshot, pickled for pytorch.org/memory_viz.
  virtual void record_memory_history(int64_t max_entries) const = 0;
  virtual std::string memory_snapshot_pickled() const = 0;
  // A fresh CUDA generator of `index` seeded with `seed`.
  virtual at::Generator make_generator(int index, uint64_t seed) const = 0;
  // c10d's NCCL backend (throws c10::Error where this build has no NCCL).
  virtual c10::intrusive_ptr<c10d::Backend> make_nccl_backend(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      std::chrono::milliseconds timeout) const = 0;
  // A step graph on GPU `index` (at::cuda::CUDAGraph, with its own memory pool).
  virtual std::unique_ptr<StepGraph> make_step_graph(int index) const = 0;
  // Milliseconds of device time `work` takes on GPU `index`'s current stream, the median of
  // `repeats` timed runs after one untimed (CUDA events; synchronizes once at the end).
  virtual double time_on_device(int index, const std::function<void()>& work,
                                int repeats) const = 0;
  // Whether GPU `index`'s current stream is recording a CUDA graph (nothing may synchronize).
  virtual bool capturing(int index) const = 0;
};

// Loads bin/libloom_cuda.so (next to the running executable) when this build has CUDA paths and
// the machine may have a GPU: NVIDIA's device nodes (/dev/nvidiactl, /dev/nvidia0) or WSL's
// /dev/dxg exist, or LOOM_CUDA=1 asks for it; LOOM_CUDA=0 never loads it. Idempotent and
// thread-safe; the first call decides. A library that is missing or fails to load is logged once
// as a warning (the job then runs on CPU, and asking for CUDA is the usual error).
void load_cuda_support();

// The loaded CUDA support (loading it first where load_cuda_support would); null on a machine
// without a GPU, in a build without CUDA, or when the library did not load.
const CudaSupport* cuda_support();

// Another entry point of the loaded library (the models' CUDA kernels register theirs there:
// include/loom/models/kernels/cuda.h); null where the library is not loaded or lacks it.
void* cuda_support_symbol(const char* name);

// Where the library was looked for and why it is or is not loaded, for `loom --version`.
std::string cuda_support_status();

}  // namespace loom::device

// The library's one exported symbol: its CudaSupport singleton.
extern "C" const loom::device::CudaSupport* loom_cuda_support();
