#include "loom/parallel/fsdp.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/accumulate.h>

#include <cmath>
#include <map>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/parallel/grad_hooks.h"

namespace loom::parallel {

struct FullyShardedDataParallel::Param {
  std::string name;
  at::Tensor unsharded;  // the model's parameter: full shape, param dtype, storage freed if sharded
  at::Tensor shard;      // float32 leaf: this rank's rows
  int64_t numel = 0;
  int64_t chunk = 0;        // elements per rank in collectives (padded rows x row size)
  int64_t local_numel = 0;  // elements of `shard` (<= chunk)
  int64_t offset = 0;       // of this parameter's chunk in the unit's per-rank buffer
  int64_t first_row = 0;    // of `shard` in the full parameter
};

struct FullyShardedDataParallel::Unit {
  enum class State { kSharded, kGathering, kUnsharded };
  std::string name;
  std::vector<Param> params;
  int64_t chunk = 0;  // per-rank buffer: sum of the parameters' chunks
  bool reshard_after_forward = true;
  State state = State::kSharded;
  at::Tensor gather_in, gather_out;
  distributed::Work gather_work;
  size_t ready = 0;  // parameters whose gradient arrived in this backward
  bool reduce_launched = false;
  at::Tensor reduce_in, reduce_out;
  distributed::Work reduce_work;
};

namespace {

// A leaf of `shape` whose storage holds nothing yet (allocated by unsharding). Saved for
// backward by reference, so re-allocating its storage later is what backward reads.
at::Tensor empty_unsharded(at::IntArrayRef shape, at::ScalarType dtype, const at::Device& device) {
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  t.set_requires_grad(true);
  return t;
}

void allocate_storage(const at::Tensor& t) {
  const c10::DeviceGuard on_device(t.device());  // the allocator serves the current device
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == bytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) return;
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

// Between a flat tensor of `numel` elements and its padded per-rank layout `rows` [N, chunk]:
// rank k's chunk holds elements [k·chunk, (k+1)·chunk) of the flat tensor, padding past numel.
void copy_flat_to_rows(const at::Tensor& rows, const at::Tensor& flat, int64_t numel) {
  const int64_t chunk = rows.size(1);
  if (chunk == 0) return;
  const int64_t full = numel / chunk;
  if (full > 0) rows.narrow(0, 0, full).copy_(flat.narrow(0, 0, full * chunk).view({full, chunk}));
  const int64_t rest = numel - full * chunk;
  if (rest > 0) rows[full].narrow(0, 0, rest).copy_(flat.narrow(0, full * chunk, rest));
}

void copy_rows_to_flat(const at::Tensor& flat, const at::Tensor& rows, int64_t numel) {
  const int64_t chunk = rows.size(1);
  if (chunk == 0) return;
  const int64_t full = numel / chunk;
  if (full > 0) flat.narrow(0, 0, full * chunk).view({full, chunk}).copy_(rows.narrow(0, 0, full));
  const int64_t rest = numel - full * chunk;
  if (rest > 0) flat.narrow(0, full * chunk, rest).copy_(rows[full].narrow(0, 0, rest));
}

}  // namespace

ReshardPolicy parse_reshard_policy(const std::string& value) {
  if (value == "default") return ReshardPolicy::kDefault;
  if (value == "always") return ReshardPolicy::kAlways;
  if (value == "never") return ReshardPolicy::kNever;
  LOOM_THROW(InputError,
             "parallelism.fsdp_reshard_after_forward must be default, always or never, got '",
             value, "'");
}

FsdpOptions fsdp_options(const config::JobConfig& config, at::ScalarType param_dtype) {
  FsdpOptions options;
  options.param_dtype = param_dtype;
  LOOM_CHECK_AS(InputError, config.training.mixed_precision_reduce == "float32",
                "training.mixed_precision_reduce: only float32 is supported, got '",
                config.training.mixed_precision_reduce, "'");
  options.reduce_dtype = at::kFloat;
  options.reshard = parse_reshard_policy(config.parallelism.fsdp_reshard_after_forward);
  return options;
}

FullyShardedDataParallel::FullyShardedDataParallel(models::CausalLM& model,
                                                   std::shared_ptr<distributed::Comm> shard,
                                                   std::shared_ptr<distributed::Comm> replicate,
                                                   const at::Device& device, uint64_t seed,
                                                   FsdpOptions options)
    : model_(model),
      shard_(std::move(shard)),
      replicate_(std::move(replicate)),
      device_(device),
      options_(options) {
  LOOM_CHECK(shard_ != nullptr, "FSDP needs a shard group");
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> existing;
  for (const auto& item : model_.module().named_parameters()) existing[item.key()] = item.value();
  const auto specs = model_.sharding_units();
  size_t covered = 0;
  for (size_t u = 0; u < specs.size(); ++u) {
    auto unit = std::make_unique<Unit>();
    unit->name = specs[u].name;
    const bool last = u + 1 == specs.size();
    unit->reshard_after_forward = options_.reshard == ReshardPolicy::kAlways ||
                                  (options_.reshard == ReshardPolicy::kDefault && !last);
    for (const std::string& name : specs[u].parameters) {
      auto it = existing.find(name);
      LOOM_CHECK(it != existing.end(), "FSDP unit ", unit->name, " names unknown parameter ", name);
      unit->params.push_back(shard_parameter(name, it->second.sizes().vec(), u, unit->chunk, seed));
      unit->chunk += unit->params.back().chunk;
      shards_.push_back(unit->params.back().shard);
      names_.push_back(name);
      ++covered;
    }
    units_.push_back(std::move(unit));
  }
  LOOM_CHECK(covered == existing.size(), "FSDP units cover ", covered, " of the model's ",
             existing.size(), " parameters");
  model_.init_buffers(device_);
  models::UnitHooks hooks;
  hooks.before_forward = [this](size_t u) { before_forward(u); };
  hooks.after_forward = [this](size_t u, const at::Tensor& out) { return after_forward(u, out); };
  model_.set_unit_hooks(std::move(hooks));
  const double local_mb = static_cast<double>(local_numel()) * 4 / (1 << 20);
  log::get("fsdp")->info(
      "{} parameters in {} units sharded over group '{}' ({} ranks{}); {:.1f} MiB of float32 "
      "shards here; all-gather in {}, reduce-scatter in {}",
      names_.size(), units_.size(), shard_->name(), shard_->size(),
      replicate_ && replicate_->size() > 1
          ? ", replicated over " + std::to_string(replicate_->size())
          : std::string(),
      local_mb, c10::toString(options_.param_dtype), c10::toString(options_.reduce_dtype));
}

// This rank's shard of one parameter, and the unsharded holder that replaces it in the model.
FullyShardedDataParallel::Param FullyShardedDataParallel::shard_parameter(
    const std::string& name, const std::vector<int64_t>& shape, size_t unit, int64_t offset,
    uint64_t seed) {
  LOOM_CHECK(!shape.empty() && shape[0] > 0, "FSDP: parameter ", name, " has no dim 0 to shard");
  const int64_t n = shard_->size();
  Param p;
  p.name = name;
  p.numel = c10::multiply_integers(shape);
  const int64_t row = p.numel / shape[0];
  const int64_t rows = (shape[0] + n - 1) / n;
  const int64_t first = std::min(shard_->rank() * rows, shape[0]);
  const int64_t local_rows = std::min(rows, shape[0] - first);
  p.chunk = rows * row;
  p.local_numel = local_rows * row;
  p.first_row = first;
  p.offset = offset;
  {
    // Layout-independent init: the full draw, one parameter at a time, sliced.
    at::Tensor full = at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(device_));
    model_.init_parameter(name, full, seed);
    p.shard = full.narrow(0, first, local_rows).clone();
  }
  p.shard.set_requires_grad(true);
  p.unsharded = empty_unsharded(shape, options_.param_dtype, device_);
  model_.replace_parameter(name, p.unsharded);
  set_gradient_ready_hook(p.unsharded, [this, unit] { on_gradient_ready(unit); });
  return p;
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  model_.set_unit_hooks({});
  for (auto& unit : units_) {
    for (auto& p : unit->params) clear_gradient_ready_hook(p.unsharded);
    try {
      unit->gather_work.wait();
      unit->reduce_work.wait();
    } catch (const std::exception&) {
      // Already reported by the step that launched it.
    }
  }
}

void FullyShardedDataParallel::start_unshard(Unit& unit, bool prefetch) {
  if (unit.state != Unit::State::kSharded) return;
  at::NoGradGuard no_grad;
  const auto options = at::TensorOptions().dtype(options_.param_dtype).device(device_);
  unit.gather_in = at::zeros({unit.chunk}, options);
  for (const auto& p : unit.params) {
    unit.gather_in.narrow(0, p.offset, p.local_numel).copy_(p.shard.detach().reshape({-1}));
  }
  unit.gather_out = at::empty({unit.chunk * shard_->size()}, options);
  unit.gather_work = shard_->all_gather_into_tensor(unit.gather_out, unit.gather_in, true);
  unit.state = Unit::State::kGathering;
  ++stats_.all_gathers;
  int64_t gathered = 0;
  for (const auto& u : units_) gathered += u->state != Unit::State::kSharded ? 1 : 0;
  stats_.peak_gathered_units = std::max(stats_.peak_gathered_units, gathered);
  if (prefetch) ++stats_.prefetched;
}

void FullyShardedDataParallel::wait_unshard(Unit& unit) {
  if (unit.state == Unit::State::kUnsharded) return;
  start_unshard(unit, false);
  unit.gather_work.wait();
  at::NoGradGuard no_grad;
  const at::Tensor rows = unit.gather_out.view({shard_->size(), unit.chunk});
  for (auto& p : unit.params) {
    allocate_storage(p.unsharded);
    // variable_data(): a fresh version counter, so autograd's saved copies stay valid.
    copy_rows_to_flat(p.unsharded.variable_data().view({-1}), rows.narrow(1, p.offset, p.chunk),
                      p.numel);
  }
  unit.gather_in = at::Tensor();
  unit.gather_out = at::Tensor();
  unit.state = Unit::State::kUnsharded;
}

void FullyShardedDataParallel::reshard(Unit& unit) {
  if (unit.state == Unit::State::kGathering) {
    unit.gather_work.wait();
    unit.gather_in = at::Tensor();
    unit.gather_out = at::Tensor();
  }
  for (auto& p : unit.params) free_storage(p.unsharded);
  unit.state = Unit::State::kSharded;
}

void FullyShardedDataParallel::before_forward(size_t u) {
  wait_unshard(*units_[u]);
  if (options_.prefetch && u + 1 < units_.size()) start_unshard(*units_[u + 1], true);
}

at::Tensor FullyShardedDataParallel::after_forward(size_t u, const at::Tensor& output) {
  Unit& unit = *units_[u];
  const bool backward_follows = at::GradMode::is_enabled() && output.requires_grad();
  // Without a backward to come (validation), nothing needs the unit gathered any more.
  if (!backward_follows || unit.reshard_after_forward) reshard(unit);
  if (backward_follows) {
    output.register_hook([this, u](const at::Tensor& /*grad*/) { before_backward(u); });
  }
  return output;
}

void FullyShardedDataParallel::before_backward(size_t u) {
  Unit& unit = *units_[u];
  unit.ready = 0;
  wait_unshard(unit);
  if (options_.prefetch && u > 0) start_unshard(*units_[u - 1], true);
}

void FullyShardedDataParallel::on_gradient_ready(size_t u) {
  Unit& unit = *units_[u];
  if (++unit.ready < unit.params.size()) return;
  // Every parameter of the unit has its gradient: its backward is over.
  unit.ready = 0;
  if (sync_) launch_reduce_scatter(unit);
  reshard(unit);
}

void FullyShardedDataParallel::launch_reduce_scatter(Unit& unit) {
  LOOM_CHECK(!unit.reduce_launched, "FSDP unit ", unit.name,
             " finished backward twice in one synchronized step; turn gradient sync off for all "
             "but the last microbatch");
  at::NoGradGuard no_grad;
  const int64_t n = shard_->size();
  const auto options = at::TensorOptions().dtype(options_.reduce_dtype).device(device_);
  unit.reduce_in = at::zeros({n * unit.chunk}, options);
  const at::Tensor rows = unit.reduce_in.view({n, unit.chunk});
  for (auto& p : unit.params) {
    at::Tensor grad = p.unsharded.grad();
    if (!grad.defined()) continue;  // unused: zeros, as DDP does
    copy_flat_to_rows(rows.narrow(1, p.offset, p.chunk), grad.reshape({-1}), p.numel);
    p.unsharded.mutable_grad() = at::Tensor();  // the unsharded gradient is no longer needed
  }
  unit.reduce_out = at::empty({unit.chunk}, options);
  unit.reduce_work = shard_->reduce_scatter_tensor(unit.reduce_out, unit.reduce_in,
                                                   distributed::ReduceOp::kSum, true);
  unit.reduce_launched = true;
  ++stats_.reduce_scatters;
}

void FullyShardedDataParallel::finish_gradient_sync() {
  LOOM_CHECK(sync_, "finish_gradient_sync with gradient sync turned off");
  at::NoGradGuard no_grad;
  for (auto& unit : units_) {
    if (!unit->reduce_launched) {
      launch_reduce_scatter(*unit);
      ++stats_.launched_at_finish;
    }
  }
  const bool hsdp = replicate_ && replicate_->size() > 1;
  for (auto& unit : units_) {
    unit->reduce_work.wait();
    unit->reduce_in = at::Tensor();
    // HSDP: each replica reduced its own shard group's batch; sum the replicas.
    if (hsdp) {
      unit->reduce_work =
          replicate_->all_reduce(unit->reduce_out, distributed::ReduceOp::kSum, true);
    }
  }
  for (auto& unit : units_) {
    unit->reduce_work.wait();
    for (auto& p : unit->params) {
      at::Tensor grad = unit->reduce_out.narrow(0, p.offset, p.local_numel)
                            .view(p.shard.sizes())
                            .to(at::kFloat, false, /*copy=*/true);
      if (p.shard.grad().defined()) {
        p.shard.mutable_grad().add_(grad);
      } else {
        p.shard.mutable_grad() = grad;
      }
    }
    unit->reduce_out = at::Tensor();
    unit->reduce_launched = false;
    unit->ready = 0;
    reshard(*unit);
  }
}

double FullyShardedDataParallel::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  at::Tensor squared = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (const auto& s : shards_) {
    if (s.grad().defined()) squared += s.grad().to(at::kDouble).pow(2).sum();
  }
  if (shard_->size() > 1) shard_->all_reduce(squared);
  const double total = std::sqrt(squared.item<double>());
  // The rule of train::clip_grad_norm (torch.nn.utils.clip_grad_norm_).
  const double scale = max_norm / (total + 1e-6);
  if (max_norm > 0 && std::isfinite(total) && scale < 1.0) {
    for (const auto& s : shards_) {
      if (s.grad().defined()) s.grad().mul_(scale);
    }
  }
  return total;
}

at::Tensor FullyShardedDataParallel::full_parameter(const std::string& name) {
  at::NoGradGuard no_grad;
  for (auto& unit : units_) {
    for (auto& p : unit->params) {
      if (p.name != name) continue;
      const auto options = at::TensorOptions().dtype(at::kFloat).device(device_);
      at::Tensor in = at::zeros({p.chunk}, options);
      in.narrow(0, 0, p.local_numel).copy_(p.shard.detach().reshape({-1}));
      at::Tensor out = at::empty({p.chunk * shard_->size()}, options);
      shard_->all_gather_into_tensor(out, in);
      at::Tensor full = at::empty(p.unsharded.sizes(), options);
      copy_rows_to_flat(full.view({-1}), out.view({shard_->size(), p.chunk}), p.numel);
      return full;
    }
  }
  LOOM_THROW(InternalError, "FSDP: no parameter ", name);
}

int64_t FullyShardedDataParallel::local_numel() const {
  int64_t total = 0;
  for (const auto& s : shards_) total += s.numel();
  return total;
}

int64_t FullyShardedDataParallel::total_numel() const {
  int64_t total = 0;
  for (const auto& unit : units_) {
    for (const auto& p : unit->params) total += p.numel;
  }
  return total;
}

int64_t FullyShardedDataParallel::gathered_bytes() const {
  int64_t total = 0;
  for (const auto& unit : units_) total += unit->chunk * shard_->size();
  return total * static_cast<int64_t>(c10::elementSize(options_.param_dtype));
}

ShardPlacement FullyShardedDataParallel::shard_placement(const std::string& name) const {
  for (const auto& unit : units_) {
    for (const auto& p : unit->params) {
      if (p.name == name) return {p.unsharded.sizes().vec(), p.first_row};
    }
  }
  LOOM_THROW(InternalError, "FSDP has no parameter ", name);
}

}  // namespace loom::parallel
