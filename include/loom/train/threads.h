// The threads a training process runs, in one place: LibTorch's intra-op pool (OpenMP; MKL
// follows it) does the compute; beside it run the data prefetch thread, the asynchronous
// checkpoint writer and the collectives' Gloo threads, which mostly wait. Oversubscription comes
// from the intra-op pools: `ranks` processes on a node each running `intra_op` threads on
// `cpus` CPUs. loom launch sizes OMP_NUM_THREADS to avoid it (launch/launcher.h); a value
// set by hand, or a launcher that does not, can still oversubscribe, and spinning OpenMP threads
// then slow every rank down by much more than the extra threads add.
#pragma once

#include <string>

namespace loom::train {

struct ThreadPlan {
  int intra_op = 1;  // at::get_num_threads()
  int ranks = 1;     // training processes on this node (LOCAL_WORLD_SIZE)
  int cpus = 1;      // CPUs this process may run on
  bool oversubscribed() const { return intra_op * ranks > cpus; }
  std::string describe() const;
};

// This process's plan; logs it, with a warning naming OMP_NUM_THREADS when the node's ranks
// together ask for more compute threads than there are CPUs.
ThreadPlan check_thread_plan(int local_ranks);

}  // namespace loom::train
