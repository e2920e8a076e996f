// The threads a training process runs, in one place: LibTorch's intra-op pool (OpenMP; MKL
// follows it) does the compute; beside it run the data prefetch thread, the asynchronous
// checkpoint writer and the collectives' Gloo threads, which mostly wait. Oversubscription comes
// from the intra-op pools: `ranks` processes on a node each running `intra_op` threads on
// `cpus` CPUs. loom launch sizes OMP_NUM_THREADS to avoid it (launch/launcher.h); a value
// set by hand, or a launcher that does not, can still oversubscribe, and spinning OpenMP threads
// then slow every rank down by much more than the extra threads add.
#pragma once

#include <string>
#include <vector>

namespace loom::train {

// A `loom train` process of another job on this host (not a rank of this one).
struct OtherTrainer {
  int pid = 0;
  int intra_op = 0;  // its OMP_NUM_THREADS, or the host's CPUs when it set none (LibTorch's default)
};

struct ThreadPlan {
  int intra_op = 1;  // at::get_num_threads()
  int ranks = 1;     // training processes on this node (LOCAL_WORLD_SIZE)
  int cpus = 1;      // CPUs this process may run on
  std::vector<OtherTrainer> others;  // other jobs' training processes on this host
  int other_threads() const;
  bool oversubscribed() const { return intra_op * ranks + other_threads() > cpus; }
  std::string describe() const;
};

// This process's plan; logs it, with a warning naming OMP_NUM_THREADS when the node's ranks
// together, with other jobs' training processes on the host, ask for more compute threads than
// there are CPUs (two launches on one host each sized their threads for the whole machine).
ThreadPlan check_thread_plan(int local_ranks);

// The `loom train` processes under `proc_root` (/proc) running `exe` that belong to another job
// than this one (`job`: this job's MASTER_ADDR:MASTER_PORT, empty for a lone process): their own
// pid aside, ranks of one job share that address. `cpus` stands for a process without
// OMP_NUM_THREADS.
std::vector<OtherTrainer> other_trainers(const std::string& proc_root, const std::string& exe,
                                         const std::string& job, int self_pid, int cpus);

}  // namespace loom::train
