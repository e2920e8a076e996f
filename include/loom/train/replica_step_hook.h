// Fault-tolerant replica groups as the trainer's step hook (step_hook.h): each step's quorum
// and healing, the gradient average over the quorum's groups, the commit barrier, and the
// semi-synchronous periods, all through one ReplicaManager (replica_manager.h).
#pragma once

#include <memory>

#include "loom/train/replica_manager.h"
#include "loom/train/step_hook.h"

namespace loom::train {

struct Run;

// The hook over `run`'s local tensors, buffers and optimizer; `run` outlives it.
std::unique_ptr<StepHook> replica_step_hook(std::unique_ptr<ReplicaManager> replicas, Run& run);

}  // namespace loom::train
