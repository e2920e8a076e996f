// Where this process sits in a distributed job: plain data, filled by the launcher's worker
// contract (launch/world_info.h reads it from torchrun's or SLURM's environment) or by a test.
#pragma once

#include <string>

namespace loom::distributed {

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;  // the node's rank among the nodes
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int restart_count = 0;          // TORCHELASTIC_RESTART_COUNT: how often the launcher restarted us
  // The job's identity in the rendezvous store: every rank of a job has the same, and a rank
  // refuses a store of another run (store_identity.h). "none" when no launcher named the run.
  std::string run_id = "none";
  std::string source = "single";  // "single" | "torchrun" | "slurm"

  bool is_distributed() const { return world_size > 1; }
};

}  // namespace loom::distributed
