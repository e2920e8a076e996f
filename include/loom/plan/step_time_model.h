// Predicted time of one training step of a layout, in parts:
//   compute     the rank's FLOPs (the model's per-token training FLOPs x its tokens, / tp x cp
//               x pp, plus the recomputation activation checkpointing adds: a block's forward,
//               a third of its training FLOPs) over the profile's achievable rate
//   bubble      the schedule's idle share (pipeline_costs.h, from the simulator) x compute
//   exposed communication, from the wrappers' traffic formulas (docs/parallelism.md) over the
//               link the group spans (NVLink inside a node, InfiniBand across) plus a latency
//               per ring step:
//                 FSDP    all-gather (F-1)/F x unit bytes in the compute dtype, forward and again
//                         in backward; reduce-scatter (F-1)/F x float32 gradients; per forward.
//                         Hidden behind compute up to profile.fsdp_overlap.
//                 HSDP/DDP all-reduce 2(R-1)/R x the gradient shard, once a step, overlapped alike
//                 TP      per block two all-gathers and two reduce-scatters of the sequence in
//                         forward and again in backward: on the critical path
//                 CP      the keys and values all-gathered per block, their gradients
//                         reduce-scattered: on the critical path
//                 PP      each microbatch's activation and gradient across each stage boundary
//                 EP      dispatch and combine all-to-alls, forward and backward
//                 Muon    each cut matrix to its owner and back (optim/distributed_muon.h):
//                         2 x 4 x (C-1)/C x this rank's matrix elements, on the critical path
//   optimizer   AdamW's passes over the local shard (memory bound), plus Muon's Newton-Schulz
//               FLOPs spread over the ranks that cut the matrices — folded into compute
#pragma once

#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/plan/device_profile.h"
#include "loom/plan/layout.h"
#include "loom/plan/model_shape.h"

namespace loom::plan {

struct StepTimePlan {
  double compute_seconds = 0;
  double bubble_seconds = 0;
  double exposed_comm_seconds = 0;
  double comm_seconds = 0;  // before overlap
  double comm_bytes = 0;    // per rank per step, sent
  double step_seconds = 0;
  double bubble_fraction = 0;
  std::string detail;  // one line per part
};

StepTimePlan predict_step_time(const ModelShape& model, const config::JobConfig& config,
                               const Layout& layout, const DeviceProfile& profile);

// Time of a ring collective moving `bytes_per_rank` over `group` ranks whose ring spans ranks
// `span` apart in the mesh (crosses nodes when span x group exceeds devices_per_node).
double collective_seconds(double bytes_per_rank, int64_t group, int64_t stride,
                          const DeviceProfile& profile);

}  // namespace loom::plan
