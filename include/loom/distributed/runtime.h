// Where a training process sits in the job, and its process groups: the launcher's environment
// (WorldInfo), the parallel degrees (ParallelDims), the mesh, and one group per mesh dimension
// and derived dimension this rank belongs to. Built once by the trainer.
#pragma once

#include <array>
#include <memory>

#include "loom/config/job_config.h"
#include "loom/distributed/comm.h"
#include "loom/distributed/device_mesh.h"
#include "loom/distributed/parallel_dims.h"
#include "loom/distributed/process_groups.h"
#include "loom/distributed/world.h"

namespace loom::distributed {

class ParallelRuntime {
 public:
  // Validates the degrees against `world` (the launcher's worker contract: launch/world_info.h
  // reads it from the environment), joins the rendezvous and creates every group (in the same
  // order on every rank, so creation cannot deadlock).
  ParallelRuntime(const config::JobConfig& config, WorldInfo world, bool with_cuda);
  // A one-rank runtime without environment or rendezvous (tests, tools).
  static std::unique_ptr<ParallelRuntime> single(const config::JobConfig& config);
  // The runtime of one rank of `world` without reading the environment (thread-rank tests: each
  // thread joins the rendezvous at world.master_addr:master_port).
  static std::unique_ptr<ParallelRuntime> for_world(const config::JobConfig& config,
                                                    WorldInfo world);

  const WorldInfo& world() const { return world_; }
  const ParallelDims& dims() const { return dims_; }
  const DeviceMesh& mesh() const { return mesh_; }
  int rank() const { return world_.rank; }
  bool is_main_rank() const { return world_.rank == 0; }

  Comm& world_group() { return groups_owner_->world(); }
  std::shared_ptr<Comm> world_group_ptr() { return groups_owner_->world_ptr(); }
  // This rank's group of the given kind (a local one-rank group when the kind has size 1).
  Comm& group(MeshGroup kind) { return *groups_[static_cast<size_t>(kind)]; }
  std::shared_ptr<Comm> group_ptr(MeshGroup kind) { return groups_[static_cast<size_t>(kind)]; }

  // The data loader's slice: rank and size of the dp group.
  int64_t dp_rank() const { return mesh_.group_rank(MeshGroup::dp, world_.rank); }
  int64_t dp_size() const { return dims_.dp_degree(); }

  void use_train_timeout() { groups_owner_->use_train_timeout(); }
  uint64_t total_wire_bytes() const { return groups_owner_->total_wire_bytes(); }
  std::array<uint64_t, kCollectiveKinds> wire_bytes_by_collective() const {
    return groups_owner_->wire_bytes_by_collective();
  }
  ProcessGroups& process_groups() { return *groups_owner_; }
  const ProcessGroups& process_groups() const { return *groups_owner_; }

 private:
  WorldInfo world_;
  ParallelDims dims_;
  DeviceMesh mesh_;
  std::unique_ptr<ProcessGroups> groups_owner_;
  std::array<std::shared_ptr<Comm>, kMeshGroupCount> groups_;
};

}  // namespace loom::distributed
