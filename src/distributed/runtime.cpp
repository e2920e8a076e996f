#include "loom/distributed/runtime.h"

#include <chrono>

#include "loom/core/device.h"
#include "loom/core/env.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"

namespace loom::distributed {
namespace {

CommInit comm_init(const WorldInfo& world, const config::CommSection& comm,
                   const std::string& dump_folder, bool with_cuda, bool fault_tolerant) {
  CommInit init;
  init.rank = world.rank;
  init.world_size = world.world_size;
  init.master_addr = world.master_addr;
  init.master_port = world.master_port;
  init.run_id = world.run_id;
  init.restart_count = world.restart_count;
  init.options.init_timeout = std::chrono::seconds(comm.init_timeout_seconds);
  init.options.train_timeout = std::chrono::seconds(comm.train_timeout_seconds);
  init.with_cuda = with_cuda;
  init.store_hosted_by_agent = env::get("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  init.secret = job_secret_from_env(fault_tolerant);
  init.trace_buffer_size = static_cast<size_t>(comm.trace_buf_size);
  init.collective_watchdog = true;
  init.trace_dump_path =
      files::output_folder(dump_folder, comm.save_traces_folder, "comm.save_traces_folder") + "/" +
      comm.save_traces_file_prefix + std::to_string(world.rank) + ".json";
  return init;
}

std::vector<int> to_int(const std::vector<int64_t>& ranks) {
  return std::vector<int>(ranks.begin(), ranks.end());
}

}  // namespace

ParallelRuntime::ParallelRuntime(const config::JobConfig& config, WorldInfo world, bool with_cuda)
    : world_(std::move(world)),
      dims_(ParallelDims::from_config(config.parallelism, world_.world_size)),
      mesh_(dims_) {
  // Before the rendezvous: a rank without a GPU of its own must stop here, not hang in NCCL.
  bool shared_gpu = false;
  if (with_cuda) {
    shared_gpu = device::check_gpu_per_local_rank(config.training.device, world_.local_world_size,
                                                  device::query_accelerators().device_count);
  }
  CommInit init = comm_init(world_, config.comm, config.job.dump_folder, with_cuda,
                            config.fault_tolerance.enable);
  if (shared_gpu) {
    init.options.cuda_through_host = true;
    log::get("runtime")->warn(
        "{} local ranks share {} (training.device): NCCL takes one rank per GPU, so their "
        "collectives of CUDA tensors go through host memory over Gloo; correct, not fast (for "
        "checking a layout on one GPU)",
        world_.local_world_size, config.training.device);
  }
  groups_owner_ = std::make_unique<ProcessGroups>(init);
  for (MeshGroup kind : kAllMeshGroups) {
    groups_[static_cast<size_t>(kind)] =
        groups_owner_->new_group(to_string(kind), to_int(mesh_.group_ranks(kind, world_.rank)));
  }
  for (MeshGroup kind : kExpertMeshGroups) {
    groups_[static_cast<size_t>(kind)] =
        groups_owner_->new_group(to_string(kind), to_int(mesh_.group_ranks(kind, world_.rank)));
  }
  if (world_.world_size > 1) {
    log::get("runtime")->info("rank {} ({} launch, local rank {}, node {}): {}", world_.rank,
                              world_.source, world_.local_rank, world_.group_rank,
                              dims_.describe());
  }
}

std::unique_ptr<ParallelRuntime> ParallelRuntime::single(const config::JobConfig& config) {
  return std::unique_ptr<ParallelRuntime>(new ParallelRuntime(config, WorldInfo{}, false));
}

std::unique_ptr<ParallelRuntime> ParallelRuntime::for_world(const config::JobConfig& config,
                                                            WorldInfo world) {
  return std::unique_ptr<ParallelRuntime>(new ParallelRuntime(config, std::move(world), false));
}

}  // namespace loom::distributed
