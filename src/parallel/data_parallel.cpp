#include "loom/parallel/data_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "loom/core/check.h"
#include "loom/core/logging.h"
#include "loom/parallel/grad_hooks.h"

namespace loom::parallel {

struct DataParallel::Bucket {
  std::vector<size_t> parameters;  // indices into parameters_
  std::vector<int64_t> offsets;    // element offset of each in `flat`
  at::Tensor flat;
  size_t pending = 0;  // gradients not yet accumulated this step
  bool launched = false;
  distributed::Work work;
};

DataParallel::DataParallel(std::vector<std::pair<std::string, at::Tensor>> named_parameters,
                           std::shared_ptr<distributed::Comm> comm, DataParallelOptions options)
    : parameters_(std::move(named_parameters)), comm_(std::move(comm)), options_(options) {
  LOOM_CHECK(comm_ != nullptr, "DataParallel needs a communicator");
  for (const auto& [name, p] : parameters_) {
    LOOM_CHECK(p.requires_grad() && p.is_leaf(), "parameter ", name,
               " must be a leaf that requires grad");
  }
  if (options_.broadcast_parameters && comm_->size() > 1) {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : parameters_) {
      at::Tensor data = p.detach();
      comm_->broadcast(data, 0);
    }
  }
  build_buckets(options_.bucket_cap_mb * 1024 * 1024);
  ready_.assign(parameters_.size(), false);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    add_gradient_ready_hook(parameters_[i].second, this, [this, i] { on_gradient_ready(i); });
  }
  log::get("ddp")->info("{} parameters in {} buckets of up to {:.0f} MB over group '{}' ({} ranks)",
                        parameters_.size(), buckets_.size(), options_.bucket_cap_mb, comm_->name(),
                        comm_->size());
}

DataParallel::~DataParallel() {
  for (auto& [name, p] : parameters_) {
    remove_gradient_ready_hooks(p, this);
  }
  for (auto& bucket : buckets_) {
    try {
      bucket->work.wait();
    } catch (const std::exception&) {
      // Already failed the step that launched it; nothing left to report here.
    }
  }
}

std::string DataParallel::describe() const {
  return "DDP: " + std::to_string(parameters_.size()) + " parameters in " +
         std::to_string(buckets_.size()) + " buckets all-reduced over '" + comm_->name() + "' (" +
         std::to_string(comm_->size()) + " ranks)";
}

void DataParallel::build_buckets(double cap_bytes) {
  bucket_of_.assign(parameters_.size(), 0);
  std::unique_ptr<Bucket> current;
  double bytes = 0;
  auto close = [&] {
    if (!current) return;
    int64_t total =
        current->offsets.back() + parameters_[current->parameters.back()].second.numel();
    current->flat = at::zeros({total}, parameters_[current->parameters.front()].second.options());
    buckets_.push_back(std::move(current));
    bytes = 0;
  };
  // Reverse order: the output layer's gradients arrive first in backward.
  for (size_t k = parameters_.size(); k-- > 0;) {
    const at::Tensor& p = parameters_[k].second;
    const at::Tensor* first = current ? &parameters_[current->parameters.front()].second : nullptr;
    const bool new_dtype =
        first && (first->scalar_type() != p.scalar_type() || first->device() != p.device());
    if (current && (bytes >= cap_bytes || new_dtype)) close();
    if (!current) current = std::make_unique<Bucket>();
    const int64_t offset =
        current->parameters.empty()
            ? 0
            : current->offsets.back() + parameters_[current->parameters.back()].second.numel();
    current->parameters.push_back(k);
    current->offsets.push_back(offset);
    bucket_of_[k] = buckets_.size();
    bytes += static_cast<double>(p.numel()) * p.element_size();
  }
  close();
  for (auto& b : buckets_) b->pending = b->parameters.size();
}

void DataParallel::on_gradient_ready(size_t index) {
  if (!sync_) return;
  LOOM_CHECK(!ready_[index], "parameter ", parameters_[index].first,
             " produced a gradient twice in one synchronized backward; turn gradient sync off "
             "for all but the last microbatch");
  ready_[index] = true;
  Bucket& bucket = *buckets_[bucket_of_[index]];
  if (--bucket.pending == 0) {
    launch(bucket);
    ++stats_.buckets_launched_in_backward;
  }
}

void DataParallel::launch(Bucket& bucket) {
  at::NoGradGuard no_grad;
  for (size_t j = 0; j < bucket.parameters.size(); ++j) {
    at::Tensor& p = parameters_[bucket.parameters[j]].second;
    at::Tensor slot = bucket.flat.narrow(0, bucket.offsets[j], p.numel());
    if (p.grad().defined()) {
      slot.copy_(p.grad().reshape({-1}));
    } else {
      slot.zero_();
    }
  }
  bucket.work = comm_->all_reduce(bucket.flat, options_.reduce_op, /*async_op=*/true);
  bucket.launched = true;
}

void DataParallel::finish_gradient_sync() {
  LOOM_CHECK(sync_, "finish_gradient_sync with gradient sync turned off");
  at::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    if (!bucket->launched) {
      launch(*bucket);
      ++stats_.buckets_launched_at_finish;
    }
  }
  for (auto& bucket : buckets_) {
    bucket->work.wait();
    for (size_t j = 0; j < bucket->parameters.size(); ++j) {
      at::Tensor& p = parameters_[bucket->parameters[j]].second;
      at::Tensor reduced = bucket->flat.narrow(0, bucket->offsets[j], p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(reduced);
      } else {
        p.mutable_grad() = reduced.clone();
      }
    }
    bucket->launched = false;
    bucket->pending = bucket->parameters.size();
  }
  ready_.assign(parameters_.size(), false);
  ++stats_.steps_synced;
}

}  // namespace loom::parallel
