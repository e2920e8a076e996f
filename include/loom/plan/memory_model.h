// Per-rank memory of a layout by component, from the model's shapes (model_shape.h) and a
// device profile, without allocating anything.
//
// What is counted (each a component, in bytes, for the rank that needs the most, the first
// pipeline rank unless a later one holds more):
//   parameters        this rank's share: its pipeline stages, / tp, then / (dp_shard x cp)
//                     under FSDP, routed experts too (ep x efsdp ways), in float32 (FSDP's
//                     masters) or training.dtype
//   gradients         as the parameters
//   optimizer state   AdamW's two moments, as the parameters
//   activations       what one forward keeps per block under the AC mode (model_shape.h), in the
//                     compute dtype, / tp (sequence parallel), / cp, x the microbatches the
//                     pipeline schedule keeps in flight (schedule.h peak_live_activations);
//                     checkpointed blocks keep their input, plus one block recomputed at a time
//   output and loss   the head's logits (compute dtype) and their float32 loss copy, / tp
//   fsdp gather       the gathered unit and the prefetched next, in the compute dtype
//   comm buffers      a unit's unsharded gradient before its reduce-scatter, TP's gathered
//                     sequence, a pipeline's send/receive buffers, MoE dispatch buffers
//   float8            a block's float8 weight casts and transposes (model.converters float8)
//   muon step         Muon's working set at the optimizer step (muon_step_bytes), beyond the
//                     activations and logits the backward has freed by then
// The tensors' sum is scaled by the profile's allocator_factor; the runtime's own memory
// (profile.runtime_bytes) comes on top.
#pragma once

#include <string>
#include <vector>

#include "loom/config/job_config.h"
#include "loom/plan/device_profile.h"
#include "loom/plan/layout.h"
#include "loom/plan/model_shape.h"

namespace loom::plan {

struct MemoryComponent {
  std::string name;  // "parameters", "activations", ...
  double bytes = 0;
  std::string detail;  // how it was counted, one line
};

struct MemoryPlan {
  std::vector<MemoryComponent> components;  // tensors, before the allocator's factor
  double tensor_bytes = 0;                  // their sum
  double allocator_bytes = 0;               // (factor - 1) x tensor_bytes
  double runtime_bytes = 0;
  double peak_bytes = 0;                    // tensors x allocator_factor + runtime
  int pipeline_rank = 0;                    // the rank this is for (pp > 1)
  std::vector<double> pipeline_rank_peaks;  // peak_bytes of every pipeline rank (pp > 1)
  std::vector<std::string> notes;

  double component(const std::string& name) const;
};

MemoryPlan predict_memory(const ModelShape& model, const config::JobConfig& config,
                          const Layout& layout, const DeviceProfile& profile);

// Bytes of parameters rank `pipeline_rank` holds before sharding (its stages; used by the step
// time model too), and the largest FSDP unit among them.
struct RankParameters {
  double params = 0;         // / tp and experts / ep applied
  double largest_unit = 0;   // largest of embedding, each block, head (same division)
  double block_params = 0;   // of params, those in transformer blocks (where float8 converts)
  double expert_params = 0;  // of params, the routed experts' (an expert-parallel rank's share)
  int64_t blocks = 0;        // transformer blocks on the rank
  bool head = false;         // holds the output projection
  bool embedding = false;
  // Each FSDP unit's parameters: those of dense linears and norms (which the float8 all-gather
  // carries at a byte each), and the rest (tables, routed experts: the param dtype).
  struct Unit {
    double dense = 0, other = 0;
  };
  std::vector<Unit> units;
  // Bytes of the largest unit gathered: `element_bytes` each, or a byte for the dense part with
  // the float8 all-gather.
  double largest_gathered_bytes(double element_bytes, bool float8_gather) const;
};
RankParameters rank_parameters(const ModelShape& model, const config::JobConfig& config,
                               const Layout& layout, int pipeline_rank);

// Muon's working set at the optimizer step beyond parameters, gradients and state
// (optim/muon.cpp, optim/distributed_muon.h). Whole matrices are stepped one at a time: the
// Nesterov update, with skip_nonfinite_steps the momentum's copy and the stepped copy, and
// Newton-Schulz's iterate, Gram, polynomial and next iterate (at most 4 matrices' worth); an
// expert stack holds its experts' results and their stack. Cut matrices go a round of the
// exchange at a time: the round's updates and its float32 buffers (about 2x this rank's pieces
// and 5x the boxes it owns), plus Newton-Schulz on the largest whole matrix an owner assembles.
struct MuonStepShape {
  double whole_matrix = 0;  // elements of the largest 2-D matrix stepped whole on this rank
  double whole_stack = 0;   // of the largest expert stack stepped whole here (its local experts)
  double stack_expert = 0;  // of one expert's matrix in it
  double round = 0;         // this rank's pieces in one round of the exchange (0: nothing cut)
  double cut_matrix = 0;    // the largest cut matrix, whole (what its owner orthogonalizes)
  // Cut twice (FSDP's rows of TP's pieces): the FSDP round's buffers (its pieces, what it
  // received, the boxes it assembled, their results) stay while the TP exchange runs.
  bool nested = false;
};
double muon_step_bytes(const MuonStepShape& shape, const config::OptimizerSection& optimizer,
                       bool skip_nonfinite, double param_bytes);

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// "12.34 GiB"
std::string format_bytes(double bytes);

}  // namespace loom::plan
