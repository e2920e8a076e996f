#include "loom/parallel/fsdp.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/accumulate.h>

#include <cmath>
#include <map>

#include "fsdp_internal.h"
#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/parallel/grad_hooks.h"
#include "loom/parallel/parallelize.h"

namespace loom::parallel {

using namespace fsdp_detail;  // NOLINT(google-build-using-namespace): this file's own helpers

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
  options.defer_gradient_sync = config.parallelism.fsdp_defer_gradient_sync;
  if (config.parallelism.pipeline_parallel_degree > 1) {
    // torchtitan's meaning of "default" under PP; the pipeline runner arms the gradient sync
    // on each stage's last backward of the step, so one reduce-scatter per unit and step.
    if (options.reshard == ReshardPolicy::kDefault) options.reshard = ReshardPolicy::kNever;
    options.defer_gradient_sync = true;
    options.keep_unsharded_until_sync = options.reshard == ReshardPolicy::kNever;
  }
  return options;
}

FullyShardedDataParallel::FullyShardedDataParallel(
    models::CausalLM& model, std::vector<FsdpUnit> units,
    const std::map<std::string, Placement>& placements, std::shared_ptr<distributed::Comm> shard,
    std::shared_ptr<distributed::Comm> replicate, const at::Device& device, uint64_t seed,
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
  for (size_t u = 0; u < units.size(); ++u) {
    auto unit = std::make_unique<Unit>();
    unit->name = units[u].name;
    unit->shard = units[u].shard_group ? units[u].shard_group : shard_;
    // The unit that ends the forward (its backward follows at once): the last one, or one that
    // spans the model (a tied embedding table's, which runs first and last).
    const bool last = units[u].modules.back() == units.back().modules.back() ||
                      units[u].modules.back() == model_.hookable_modules().back();
    unit->reshard_after_forward = options_.reshard == ReshardPolicy::kAlways ||
                                  (options_.reshard == ReshardPolicy::kDefault && !last);
    for (const std::string& name : units[u].parameters) {
      auto it = existing.find(name);
      LOOM_CHECK(it != existing.end(), "FSDP unit ", unit->name, " names unknown parameter ", name);
      auto given = placements.find(name);
      const Placement before =
          given != placements.end() ? given->second : Placement::whole(it->second.sizes());
      LOOM_CHECK(before.lengths == it->second.sizes().vec(), "FSDP: parameter ", name,
                 " has shape ", it->second.sizes(), " but its placement is ", before.describe());
      unit->params.push_back(shard_parameter(name, before, u, unit->shard, unit->chunk, seed));
      unit->chunk += unit->params.back().chunk;
      names_.push_back(name);
      existing.erase(it);
    }
    pack_shards(*unit);
    plan_encoded_gather(*unit);
    for (const auto& p : unit->params) shards_.push_back(p.shard);
    units_.push_back(std::move(unit));
  }
  LOOM_CHECK(existing.empty(), "FSDP units leave ", existing.size(), " parameters unsharded, e.g. ",
             existing.empty() ? "" : existing.begin()->first);
  model_.init_buffers(device_);
  install_hooks(units);
  const double local_mb = static_cast<double>(local_numel()) * 4 / (1 << 20);
  log::get("fsdp")->info("{}; {:.1f} MiB of float32 shards here", describe(), local_mb);
}

// Hooks on the first module (gather) and the last module (maybe free, pre-backward) of a unit.
void FullyShardedDataParallel::install_hooks(const std::vector<FsdpUnit>& units) {
  std::map<std::string, models::ForwardHooks> hooks;
  for (size_t u = 0; u < units.size(); ++u) {
    LOOM_CHECK(!units[u].modules.empty(), "FSDP unit ", units[u].name, " wraps no module");
    hooks[units[u].modules.front()].before = [this, u] { before_forward(u); };
    hooks[units[u].modules.back()].after = [this, u](const at::Tensor& out) {
      return after_forward(u, out);
    };
  }
  for (auto& [module, h] : hooks) {
    hooked_modules_.push_back(module);
    model_.set_forward_hooks(module, "fsdp", std::move(h));
  }
}

std::string FullyShardedDataParallel::describe() const {
  std::string text = "FSDP: " + std::to_string(names_.size()) + " parameters in " +
                     std::to_string(units_.size()) + " units sharded over group '" +
                     shard_->name() + "' (" + std::to_string(shard_->size()) + " ranks)";
  int64_t others = 0;
  const distributed::Comm* other = nullptr;
  for (const auto& unit : units_) {
    if (unit->shard == shard_) continue;
    ++others;
    other = unit->shard.get();
  }
  if (other != nullptr) {
    text += ", " + std::to_string(others) + " of them over '" + other->name() + "' (" +
            std::to_string(other->size()) + ")";
  }
  if (replicate_ && replicate_->size() > 1) {
    text += ", replicated over '" + replicate_->name() + "' (" +
            std::to_string(replicate_->size()) + ")";
  }
  std::map<std::string, int64_t> encoded;  // encoding -> weights all-gathered in it
  for (const auto& unit : units_) {
    for (const auto& p : unit->params) {
      if (p.codec != nullptr) ++encoded[p.codec->name()];
    }
  }
  for (const auto& [encoding, count] : encoded) {
    text += ", " + std::to_string(count) + " weights all-gathered in " + encoding;
  }
  for (const auto& [encoding, refused] : refused_codecs_) {
    text += ", " + std::to_string(refused.first) + " weights not in " + encoding + " (e.g. " +
            refused.second + ")";
  }
  text += std::string(", all-gather in ") + c10::toString(options_.param_dtype) +
          ", reduce-scatter in " + c10::toString(options_.reduce_dtype) +
          (options_.defer_gradient_sync ? ", gradient sync deferred to the last microbatch" : "");
  return text;
}

// This rank's shard of one parameter, and the unsharded holder that replaces it in the model.
FullyShardedDataParallel::Param FullyShardedDataParallel::shard_parameter(
    const std::string& name, const Placement& before, size_t unit,
    const std::shared_ptr<distributed::Comm>& shard_group, int64_t offset, uint64_t seed) {
  distributed::Comm& group = *shard_group;
  const std::vector<int64_t>& shape = before.lengths;
  LOOM_CHECK(!shape.empty() && shape[0] > 0, "FSDP: parameter ", name, " has no dim 0 to shard");
  const int64_t n = group.size();
  const ShardRange rows = shard_range(shape[0], group.rank(), n);
  Param p;
  p.name = name;
  p.numel = c10::multiply_integers(shape);
  const int64_t row = p.numel / shape[0];
  p.chunk = rows.padded * row;
  p.local_numel = rows.count * row;
  p.offset = offset;
  p.placement = before.shard(0, MeshAxis::of(shard_group));
  if (replicate_) p.placement = p.placement.replicate(MeshAxis::of(replicate_), false);
  p.shard = materialize_local(model_, name, p.placement,
                              at::TensorOptions().dtype(at::kFloat).device(device_), seed);
  p.shard.set_requires_grad(true);
  p.unsharded = empty_unsharded(shape, options_.param_dtype, device_);
  model_.replace_parameter(name, p.unsharded);
  add_gradient_ready_hook(p.unsharded, this, [this, unit] { on_gradient_ready(unit); });
  return p;
}

// Moves the unit's shards into one buffer laid out as its all-gather input; each shard becomes a
// leaf aliasing its slot (detach(): not an autograd view, so optimizers treat it as any leaf).
void FullyShardedDataParallel::pack_shards(Unit& unit) {
  at::NoGradGuard no_grad;
  unit.shards = at::zeros({unit.chunk}, at::TensorOptions().dtype(at::kFloat).device(device_));
  for (auto& p : unit.params) {
    at::Tensor slot = unit.shards.narrow(0, p.offset, p.local_numel).view(p.shard.sizes());
    slot.copy_(p.shard.detach());
    p.shard = slot.detach();
    p.shard.set_requires_grad(true);
  }
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (const auto& module : hooked_modules_) model_.set_forward_hooks(module, "fsdp", {});
  for (auto& unit : units_) {
    for (auto& p : unit->params) {
      remove_gradient_ready_hooks(p.unsharded, this);
      // The codec outlives FSDP (the linear owns it): it must not reach these shards or groups.
      if (p.codec != nullptr) p.codec->bind_shard(at::Tensor(), nullptr);
    }
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
  // Nothing writes the shards while a gather reads them: the optimizer steps after the
  // gradient sync, which waits for every unit's gather.
  if (unit.gather_bytes > 0) {
    unit.gather_in = pack_encoded_gather(unit);
    unit.gather_out = at::empty({unit.gather_bytes * unit.shard->size()}, unit.gather_in.options());
  } else {
    unit.gather_in = unit.shards.to(options_.param_dtype);  // the buffer itself when float32
    unit.gather_out = at::empty({unit.chunk * unit.shard->size()}, options);
  }
  unit.gather_work = unit.shard->all_gather_into_tensor(unit.gather_out, unit.gather_in, true);
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
  if (unit.gather_bytes > 0) {
    unpack_encoded_gather(unit);
    unit.gather_in = at::Tensor();
    unit.gather_out = at::Tensor();
    unit.state = Unit::State::kUnsharded;
    return;
  }
  const at::Tensor rows = unit.gather_out.view({unit.shard->size(), unit.chunk});
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
  for (auto& p : unit.params) {
    free_storage(p.unsharded);
    if (p.codec != nullptr) p.codec->release();
  }
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
  if (sync_ || !options_.keep_unsharded_until_sync) reshard(unit);
}

void FullyShardedDataParallel::launch_reduce_scatter(Unit& unit) {
  LOOM_CHECK(!unit.reduced_this_backward, "FSDP unit ", unit.name,
             " finished backward twice in one microbatch");
  // The previous microbatch's result joins the float32 sum before new buffers are taken.
  if (unit.reduce_launched) fold_reduce_scatter(unit);
  at::NoGradGuard no_grad;
  const int64_t n = unit.shard->size();
  const auto options = at::TensorOptions().dtype(options_.reduce_dtype).device(device_);
  unit.reduce_in = at::empty({n * unit.chunk}, options);  // every element written below
  const at::Tensor rows = unit.reduce_in.view({n, unit.chunk});
  for (auto& p : unit.params) {
    at::Tensor grad = p.unsharded.grad();
    if (!grad.defined()) {  // unused: zeros, as DDP does
      rows.narrow(1, p.offset, p.chunk).zero_();
      continue;
    }
    copy_flat_to_rows(rows.narrow(1, p.offset, p.chunk), grad.reshape({-1}), p.numel);
    p.unsharded.mutable_grad() = at::Tensor();  // the unsharded gradient is no longer needed
  }
  unit.reduce_out = at::empty({unit.chunk}, options);
  unit.reduce_work = unit.shard->reduce_scatter_tensor(unit.reduce_out, unit.reduce_in,
                                                       distributed::ReduceOp::kSum, true);
  unit.reduce_launched = true;
  unit.reduced_this_backward = true;
  ++stats_.reduce_scatters;
}

void FullyShardedDataParallel::fold_reduce_scatter(Unit& unit) {
  unit.reduce_work.wait();
  unit.reduce_in = at::Tensor();
  at::NoGradGuard no_grad;
  if (!unit.grad_sum.defined()) {
    unit.grad_sum = unit.reduce_out.scalar_type() == at::kFloat ? unit.reduce_out
                                                                : unit.reduce_out.to(at::kFloat);
  } else {
    unit.grad_sum.add_(unit.reduce_out);
  }
  unit.reduce_out = at::Tensor();
  unit.reduce_launched = false;
}

void FullyShardedDataParallel::prepare_microbatch(bool last) {
  sync_ = last || !options_.defer_gradient_sync;
  for (auto& unit : units_) unit->reduced_this_backward = false;
}

void FullyShardedDataParallel::finish_gradient_sync() {
  LOOM_CHECK(sync_, "finish_gradient_sync with gradient sync turned off");
  at::NoGradGuard no_grad;
  // Units whose backward did not complete (a parameter without gradient) reduce what they have.
  for (auto& unit : units_) {
    if (!unit->reduced_this_backward) {
      launch_reduce_scatter(*unit);
      ++stats_.launched_at_finish;
    }
  }
  const bool hsdp = replicate_ && replicate_->size() > 1;
  std::vector<distributed::Work> replica_work(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    fold_reduce_scatter(*units_[u]);
    // HSDP: each replica reduced its own shard group's batch; sum the replicas.
    if (hsdp) {
      replica_work[u] =
          replicate_->all_reduce(units_[u]->grad_sum, distributed::ReduceOp::kSum, true);
    }
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = *units_[u];
    replica_work[u].wait();
    for (auto& p : unit.params) {
      at::Tensor grad = unit.grad_sum.narrow(0, p.offset, p.local_numel).view(p.shard.sizes());
      if (p.shard.grad().defined()) {
        p.shard.mutable_grad().add_(grad);
      } else {
        // An alias of grad_sum, which this step allocated and nothing else holds; detach():
        // not an autograd view, so an in-place detach_() by an optimizer works on it.
        p.shard.mutable_grad() = grad.detach();
      }
    }
    unit.grad_sum = at::Tensor();
    unit.reduced_this_backward = false;
    unit.ready = 0;
    reshard(unit);
  }
}

at::Tensor FullyShardedDataParallel::full_parameter(const std::string& name) {
  at::NoGradGuard no_grad;
  for (auto& unit : units_) {
    for (auto& p : unit->params) {
      if (p.name != name) continue;
      const auto options = at::TensorOptions().dtype(at::kFloat).device(device_);
      at::Tensor in = at::zeros({p.chunk}, options);
      in.narrow(0, 0, p.local_numel).copy_(p.shard.detach().reshape({-1}));
      distributed::Comm& group = *unit->shard;
      at::Tensor out = at::empty({p.chunk * group.size()}, options);
      group.all_gather_into_tensor(out, in);
      at::Tensor full = at::empty(p.unsharded.sizes(), options);
      copy_rows_to_flat(full.view({-1}), out.view({group.size(), p.chunk}), p.numel);
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
  const auto element = static_cast<int64_t>(c10::elementSize(options_.param_dtype));
  int64_t total = 0;
  for (const auto& unit : units_) {
    const int64_t per_rank = unit->gather_bytes > 0 ? unit->gather_bytes : unit->chunk * element;
    total += per_rank * unit->shard->size();
  }
  return total;
}

const Placement& FullyShardedDataParallel::placement(const std::string& name) const {
  for (const auto& unit : units_) {
    for (const auto& p : unit->params) {
      if (p.name == name) return p.placement;
    }
  }
  LOOM_THROW(InternalError, "FSDP has no parameter ", name);
}

int64_t FullyShardedDataParallel::unsharded_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : units_) {
    for (const auto& p : unit->params) {
      bytes += static_cast<int64_t>(p.unsharded.storage().nbytes());
      if (p.codec != nullptr) bytes += p.codec->decoded_bytes();
    }
  }
  return bytes;
}

int64_t FullyShardedDataParallel::unsharded_gradient_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : units_) {
    for (const auto& p : unit->params) {
      if (p.unsharded.grad().defined()) bytes += static_cast<int64_t>(p.unsharded.grad().nbytes());
    }
  }
  return bytes;
}

}  // namespace loom::parallel
