// FSDP's internals shared by fsdp.cpp and fsdp_float8.cpp (not a public header).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/parallel/fsdp.h"
#include "loom/protocols/gather_codec.h"

namespace loom::parallel {

struct FullyShardedDataParallel::Param {
  std::string name;
  at::Tensor unsharded;  // the model's parameter: full shape, param dtype, storage freed if sharded
  at::Tensor shard;      // float32 leaf: this rank's rows
  int64_t numel = 0;
  int64_t chunk = 0;        // elements per rank in collectives (padded rows x row size)
  int64_t local_numel = 0;  // elements of `shard` (<= chunk)
  int64_t offset = 0;       // of this parameter's chunk in the unit's per-rank buffer
  Placement placement;      // of `shard` in the global parameter
  // Gathered through a codec (fsdp_gather_codec.cpp; float8): the codec and this parameter's
  // slot in the unit's per-rank byte buffer.
  std::shared_ptr<models::GatherCodec> codec;
  int64_t byte_offset = 0;
};

struct FullyShardedDataParallel::Unit {
  enum class State { kSharded, kGathering, kUnsharded };
  std::string name;
  std::shared_ptr<distributed::Comm> shard;  // the ranks that split this unit's parameters
  std::vector<Param> params;
  int64_t chunk = 0;  // per-rank buffer: sum of the parameters' chunks
  // float32 [chunk]: the shards live here, at their offsets (zeros in the padding), so that the
  // buffer is the all-gather's input as it is (float32) or after one cast.
  at::Tensor shards;
  bool reshard_after_forward = true;
  State state = State::kSharded;
  at::Tensor gather_in, gather_out;
  distributed::Work gather_work;
  size_t ready = 0;                    // parameters whose gradient arrived in this backward
  bool reduce_launched = false;        // a reduce-scatter not yet folded into grad_sum
  bool reduced_this_backward = false;  // launched since the last prepare_microbatch
  at::Tensor reduce_in, reduce_out;
  distributed::Work reduce_work;
  at::Tensor grad_sum;  // float32 [chunk]: reduced gradients, summed over the step's microbatches
  // Per-rank bytes of the all-gather when some parameter gathers through a codec (then the
  // gather buffers are bytes: each such parameter in its encoding, the others in the param
  // dtype); 0: the plain gather in the param dtype.
  int64_t gather_bytes = 0;
};

namespace fsdp_detail {

// A leaf of `shape` whose storage holds nothing yet (allocated by unsharding). Saved for
// backward by reference, so re-allocating its storage later is what backward reads.
inline at::Tensor empty_unsharded(at::IntArrayRef shape, at::ScalarType dtype,
                                  const at::Device& device) {
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  t.set_requires_grad(true);
  return t;
}

inline void allocate_storage(const at::Tensor& t) {
  const c10::DeviceGuard on_device(t.device());  // the allocator serves the current device
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == bytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

inline void free_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) return;
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

// Between a flat tensor of `numel` elements and its padded per-rank layout `rows` [N, chunk]:
// rank k's chunk holds elements [k·chunk, (k+1)·chunk) of the flat tensor, zero padding past
// numel (written here, so `rows` may come uninitialized: zeroing whole buffers first cost a
// pass over every gradient).
inline void copy_flat_to_rows(const at::Tensor& rows, const at::Tensor& flat, int64_t numel) {
  const int64_t chunk = rows.size(1);
  if (chunk == 0) return;
  const int64_t full = numel / chunk;
  if (full > 0) rows.narrow(0, 0, full).copy_(flat.narrow(0, 0, full * chunk).view({full, chunk}));
  const int64_t rest = numel - full * chunk;
  if (rest > 0) {
    rows[full].narrow(0, 0, rest).copy_(flat.narrow(0, full * chunk, rest));
    rows[full].narrow(0, rest, chunk - rest).zero_();
  }
  const int64_t first_padded_row = full + (rest > 0 ? 1 : 0);
  if (first_padded_row < rows.size(0)) {
    rows.narrow(0, first_padded_row, rows.size(0) - first_padded_row).zero_();
  }
}

inline void copy_rows_to_flat(const at::Tensor& flat, const at::Tensor& rows, int64_t numel) {
  const int64_t chunk = rows.size(1);
  if (chunk == 0) return;
  const int64_t full = numel / chunk;
  if (full > 0) flat.narrow(0, 0, full * chunk).view({full, chunk}).copy_(rows.narrow(0, 0, full));
  const int64_t rest = numel - full * chunk;
  if (rest > 0) flat.narrow(0, full * chunk, rest).copy_(rows[full].narrow(0, 0, rest));
}

}  // namespace fsdp_detail

}  // namespace loom::parallel
