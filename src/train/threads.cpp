#include "loom/train/threads.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "loom/core/logging.h"
#include "loom/launch/launcher.h"

namespace loom::train {

std::string ThreadPlan::describe() const {
  return std::to_string(intra_op) + " intra-op threads x " + std::to_string(ranks) +
         " ranks on this node, " + std::to_string(cpus) +
         " CPUs; plus the data prefetch thread, the checkpoint writer and Gloo's threads "
         "(waiting, not computing)";
}

ThreadPlan check_thread_plan(int local_ranks) {
  ThreadPlan plan;
  plan.intra_op = at::get_num_threads();
  plan.ranks = std::max(1, local_ranks);
  plan.cpus = distributed::available_cpus();
  auto log = log::get("trainer");
  log->info("threads: {}", plan.describe());
  if (plan.oversubscribed()) {
    log->warn(
        "threads: {} ranks x {} intra-op threads exceed the {} CPUs: OpenMP threads will "
        "compete for cores and slow every rank; set OMP_NUM_THREADS={} (or leave it unset "
        "under loom launch)",
        plan.ranks, plan.intra_op, plan.cpus,
        distributed::threads_per_rank(plan.cpus, plan.ranks));
  }
  return plan;
}

}  // namespace loom::train
