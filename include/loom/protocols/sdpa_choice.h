// Which of LibTorch's fused attention kernels runs loom's causal attention on a GPU. LibTorch
// picks by a fixed priority (FlashAttention, then memory-efficient, then cuDNN last), though
// cuDNN's kernel is often the fastest on Hopper and the order flips with head dim and length.
// loom measures instead: the first time a shape is seen, each kernel runs the forward and the
// backward (the forward only under inference mode) on that shape, its results are checked against
// LibTorch's own choice, and the fastest that agrees serves every later call of that shape. One log
// line per shape names the times and the winner (training.sdpa_backend, docs/performance.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace loom::models {

// training.sdpa_backend: "fastest" (measured per shape), "libtorch" (LibTorch's own order), or
// one kernel by name ("flash", "cudnn", "efficient"), which must run every shape it is given.
void set_sdpa_policy(const std::string& policy);
std::string sdpa_policy();

// Causal attention of q, k, v [b, heads, s, d] (k, v with q's heads) on a CUDA device by the
// policy above: the same as at::scaled_dot_product_attention(..., is_causal=true, scale).
at::Tensor causal_fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  double scale);

// One way to compute causal attention; `run` throws where it cannot take the inputs.
struct SdpaCandidate {
  std::string name;
  std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale)>
      run;
};

// LibTorch's dispatcher first (the reference the others must agree with), then its kernels one
// by one: flash, cudnn, efficient.
std::vector<SdpaCandidate> fused_sdpa_candidates();

// How a candidate fared on one shape.
struct SdpaTrial {
  std::string name;
  bool usable = false;
  double ms = 0;  // median time of a forward (+ backward) where usable
  std::string
      refusal;  // why not, where not usable: its error, or how far it was from the reference
};

// Times `work` (one forward, or forward + backward) of the candidate named on `device`; ms.
using SdpaTimer = std::function<double(const std::string& candidate, const at::Device& device,
                                       const std::function<void()>& work)>;

// Chooses among candidates per input shape, by measurement (policy "fastest") or by name; the
// first candidate is the reference. Thread-safe: ranks on threads share one chooser.
class SdpaChooser {
 public:
  SdpaChooser(std::vector<SdpaCandidate> candidates, SdpaTimer timer);

  // The candidate that serves these inputs' shape under `policy`: under "fastest", the one
  // measured fastest among those agreeing with the reference (measured the first time the shape
  // is seen; `measured_now` says whether this call measured); else the candidate of that name.
  const SdpaCandidate& choose(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              double scale, const std::string& policy,
                              bool* measured_now = nullptr);
  // Whether the shape of q, k, v has been measured.
  bool knows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;

  // The trials of the shape of q, k, v, in candidate order (empty until measured).
  std::vector<SdpaTrial> trials(const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v) const;
  int measurements() const;

 private:
  using Key = std::tuple<std::string, std::vector<int64_t>, bool>;
  struct Decision {
    size_t winner = 0;
    std::vector<SdpaTrial> trials;
  };
  static Key key_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  Decision measure(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   double scale) const;

  std::vector<SdpaCandidate> candidates_;
  SdpaTimer timer_;
  mutable std::mutex mutex_;
  std::map<Key, Decision> decisions_;
};

// The chooser causal_fused_attention asks (its trials say what each shape measured).
SdpaChooser& fused_sdpa_chooser();

// "attention [2, 16, 2048, 128] bfloat16 with backward: cudnn 0.81 ms, flash 0.93 ms, ... -> cudnn"
std::string describe_sdpa_trials(const at::Tensor& q, bool backward,
                                 const std::vector<SdpaTrial>& trials, const std::string& winner);

}  // namespace loom::models
