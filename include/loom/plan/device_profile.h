// A device profile: what the planner knows about one kind of accelerator and the links between
// them (configs/devices/<name>.toml; docs/planning.md lists the keys). Rates are what training
// achieves, not the datasheet's peak: a dense bfloat16 GEMM rate, and per link the bus
// bandwidth a ring collective reaches with its latency per step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::plan {

struct LinkProfile {
  std::string name;           // "nvlink", "infiniband", "loopback"
  double bandwidth_gbps = 0;  // GB/s per device of ring bus bandwidth (1e9 bytes)
  double latency_us = 0;      // per ring step
};

struct DeviceProfile {
  std::string name;  // "h100"
  std::string description;
  std::string source;       // the file it came from
  double memory_bytes = 0;  // usable memory per device
  double gemm_tflops = 0;   // achievable dense GEMM rate per device (compute dtype)
  // The same in float32 (no TF32: LibTorch's default), what Muon's Newton-Schulz runs at with
  // optimizer.muon_ns_dtype = float32. Unset in a file: gemm_tflops (a CPU computes in float32).
  double fp32_gemm_tflops = 0;
  // Fraction of the GEMM rate a whole training step of a transformer reaches (attention,
  // norms, element-wise ops, launch overheads): MFU over GEMM efficiency. Fitted by --calibrate.
  double model_efficiency = 0.8;
  int devices_per_node = 8;
  // CPU: the ranks of a node share its cores, so each rank computes at
  // gemm_tflops / ranks on the node; a GPU computes alone.
  bool node_shares_compute = false;
  LinkProfile intra_node;  // within a node
  LinkProfile inter_node;  // between nodes
  // Fraction of communication hidden behind compute: FSDP's prefetched all-gathers and
  // reduce-scatters, and data-parallel all-reduces of earlier buckets. TP's collectives sit on
  // the critical path and do not overlap.
  double fsdp_overlap = 0.8;
  // Memory beyond the tensors the planner counts: the runtime's own (CUDA context, or a
  // process's code and libraries on CPU), and the allocator's slack as a factor on the tensors
  // (PyTorch's caching allocator reserves more than it allocates).
  double runtime_bytes = 0;
  // More of it on each rank of a distributed job (world > 1): the process groups' communicators
  // and buffers (Gloo's, NCCL's).
  double distributed_runtime_bytes = 0;
  // More again on a rank that FSDP shards (dp_shard x cp > 1), beyond the gathered units and
  // gradient buffers the planner counts (on CPU: fitted; loom's FSDP over Gloo holds about
  // 150 MiB more per rank than the tensors explain).
  double fsdp_runtime_bytes = 0;
  double allocator_factor = 1.0;
  // Scales the per-block activation bytes (fitted by --calibrate; 1: the analytic count).
  double activation_factor = 1.0;
  // Achievable memory bandwidth (GB/s): the optimizer step is AdamW's passes over the local
  // shard, bound by it.
  double memory_bandwidth_gbps = 1000;
  // Compute dtype bytes (2: bfloat16 on GPUs; 4: CPU trains in float32).
  int compute_bytes = 2;
  bool calibrated = false;

  // Rate one rank computes at with `ranks_on_node` ranks sharing its node.
  double rank_flops(int64_t ranks_on_node) const;
  const LinkProfile& link(bool crosses_nodes) const {
    return crosses_nodes ? inter_node : intra_node;
  }
};

// "80GiB", "80 GiB", "96GB", "512MiB", "1.5TiB", "1073741824" -> bytes. Throws InputError naming
// `option` and the accepted forms for anything else (or a size <= 0 or past 1 PiB).
double parse_memory_size(const std::string& text, const std::string& option);

// The folder of the shipped profiles (configs/devices in the source tree, or LOOM_DEVICE_PROFILES).
std::string device_profiles_dir();
std::vector<std::string> device_profile_names();

// A profile by name ("h100": <device_profiles_dir>/h100.toml) or by path (a name with '/' or
// ending in .toml). Throws InputError naming --device and the shipped names for an unknown one,
// and the file and key for a malformed one.
DeviceProfile load_device_profile(const std::string& name_or_path);
DeviceProfile parse_device_profile(const std::string& toml_text, const std::string& source);
std::string device_profile_to_toml(const DeviceProfile& profile);

}  // namespace loom::plan
