#include "loom/train/validator.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "loom/core/check.h"
#include "loom/models/loss.h"

namespace loom::train {

Validator::Validator(std::unique_ptr<data::BatchSource> source, ValidationOptions options)
    : source_(std::move(source)), options_(options) {
  LOOM_CHECK(source_ != nullptr, "the validator needs a source");
  LOOM_CHECK(options_.local_batch_size >= 1 && options_.dp_size >= 1, "bad validation options");
  start_state_ = source_->state();
  if (options_.steps > 0) {
    batches_ = options_.steps;
    return;
  }
  const auto samples = source_->samples_per_epoch();
  LOOM_CHECK_AS(InputError, samples.has_value(),
                "validation.steps = -1 (the whole set) needs a finite validation dataset; set a "
                "step count");
  const int64_t global_batch = options_.local_batch_size * options_.dp_size;
  batches_ = (*samples + global_batch - 1) / global_batch;
}

int64_t Validator::masked_rows(int64_t batch, const ValidationOptions& options,
                               int64_t set_samples) {
  const int64_t first = (batch * options.dp_size + options.dp_rank) * options.local_batch_size;
  const int64_t inside = std::clamp<int64_t>(set_samples - first, 0, options.local_batch_size);
  return options.local_batch_size - inside;
}

double Validator::run(const LossSum& loss_sum, distributed::Comm& loss_group,
                      int64_t token_copies) {
  at::NoGradGuard no_grad;
  // Every evaluation reads the same samples: the first batches of the set, not the next ones.
  source_->load_state(start_state_);
  const auto samples = source_->samples_per_epoch();
  at::Tensor total;
  int64_t tokens = 0;
  for (int64_t i = 0; i < batches_; ++i) {
    data::Batch batch = source_->next(options_.local_batch_size, options_.seq_len);
    if (options_.steps <= 0) {
      // The remainder past the end of the set wrapped around to its start: read, not counted.
      const int64_t masked = masked_rows(i, options_, *samples);
      if (masked > 0)
        batch.labels.slice(0, options_.local_batch_size - masked).fill_(models::kIgnoreIndex);
    }
    at::Tensor loss = loss_sum(batch).to(at::kDouble).reshape({1});
    total = total.defined() ? total + loss : loss;
    tokens += models::count_valid_tokens(batch.labels);
  }
  at::Tensor totals =
      at::cat({total.to(at::kCPU), at::full({1}, static_cast<double>(tokens), at::kDouble)});
  if (loss_group.size() > 1) loss_group.all_reduce(totals);
  const double all_tokens = totals[1].item<double>() / static_cast<double>(token_copies);
  return totals[0].item<double>() / std::max(all_tokens, 1.0);
}

}  // namespace loom::train
