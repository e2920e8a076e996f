// Where this process sits in a distributed job, read from the environment its launcher set.
//
// Three sources, tried in this order:
//   torchrun  RANK is set: the torchrun/torchelastic contract (also what `loom launch` sets):
//             RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are required;
//             LOCAL_WORLD_SIZE (default WORLD_SIZE), GROUP_RANK (default RANK / LOCAL_WORLD_SIZE),
//             TORCHELASTIC_RESTART_COUNT (default 0) and TORCHELASTIC_RUN_ID (default "none") are
//             optional.
//   slurm     SLURM_PROCID is set (one task per rank, started by srun): SLURM_PROCID,
//             SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, and SLURM_NTASKS_PER_NODE or
//             SLURM_TASKS_PER_NODE. The master address is MASTER_ADDR, else the first host of
//             SLURM_JOB_NODELIST; the port is MASTER_PORT, else derived from SLURM_JOB_ID (see
//             slurm_default_port). The run id is TORCHELASTIC_RUN_ID, else "slurm-<SLURM_JOB_ID>"
//             (".<SLURM_STEP_ID>" added when set).
//   single    neither: rank 0 of 1 on 127.0.0.1 (MASTER_ADDR/MASTER_PORT still honoured).
// Malformed or inconsistent values throw loom::InputError naming the variable.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "loom/distributed/world.h"

namespace loom::distributed {


WorldInfo read_world_info();

// A run id loom accepts (--rdzv-id, TORCHELASTIC_RUN_ID): 1..128 letters, digits, '-', '_', '.',
// ':', so it reads unambiguously inside a one-line error.
bool is_valid_run_id(std::string_view id);

// The first host name of a SLURM node list ("node[01-04,07],gpu3" gives "node01"); throws
// InputError naming `variable` when the list is malformed.
std::string slurm_first_host(std::string_view nodelist, const char* variable);

// The task count of node `node_id` in a SLURM_TASKS_PER_NODE value ("4(x2),3" gives 4, 4, 3);
// throws InputError naming `variable` when malformed or too short.
int slurm_tasks_on_node(std::string_view tasks_per_node, int node_id, const char* variable);

// The rendezvous port for a SLURM job without MASTER_PORT: 20000 + SLURM_JOB_ID % 10000, so
// jobs sharing a node rarely collide and every task of one job agrees without talking.
int slurm_default_port(int64_t job_id);

}  // namespace loom::distributed
