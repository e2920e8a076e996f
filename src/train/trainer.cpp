// The training loop (trainer.h); the run it steps is built by build_run (run_builder.cpp).
#include "loom/train/trainer.h"
#include "loom/core/clock.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>

#include "loom/checkpoint/manager.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/metrics/grad_norms.h"
#include "loom/models/loss.h"
#include "loom/protocols/converter_hooks.h"
#include "loom/train/grad_clip.h"
#include "loom/train/lr_scheduler.h"
#include "loom/train/step_graph.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

// A number summed over a group (the step's valid tokens).
double sum_over(distributed::Comm& group, double value) {
  if (group.size() == 1) return value;
  at::Tensor t = at::full({1}, value, at::kDouble);
  group.all_reduce(t);
  return t.item<double>();
}

// Tensors summed elementwise over a group (a no-op for one rank).
at::Tensor sum_over(distributed::Comm& group, at::Tensor values) {
  if (group.size() > 1) group.all_reduce(values);
  return values;
}

// metrics.jsonl's start record: which run, resumed from where, with which config and layout.
metrics::RunStart run_start(const config::JobConfig& config, const distributed::ParallelDims& dims,
                            const checkpoint::ResumePoint& resume, const metrics::PeakFlops& peak) {
  metrics::RunStart start;
  start.first_step = resume.step + 1;
  start.total_steps = config.training.steps;
  start.resumed_from_step = resume.step;
  start.resumed_from = resume.loaded_from;
  start.config_hash = metrics::config_hash(config);
  start.world_size = dims.world_size;
  start.layout = dims.layout();
  start.elapsed_s = resume.elapsed_s;
  start.peak_source = peak.source;
  return start;
}

}  // namespace

// "finished: 2 steps (steps 61-62, resumed from step 60) of 62", or
// "(steps 11-30, healed to step 10 from a replica group)" when a quorum moved it forward.
std::string describe_steps_run(const TrainResult& result, int64_t resumed_from, int64_t total) {
  const int64_t ran = result.steps_completed >= result.first_step
                          ? result.steps_completed - result.first_step + 1
                          : 0;
  std::string which = "none run";
  if (ran > 0 && result.first_step - 1 > resumed_from) {
    which = fmt::format("steps {}-{}, healed to step {} from a replica group", result.first_step,
                        result.steps_completed, result.first_step - 1);
  } else if (ran > 0 && resumed_from > 0) {
    which = fmt::format("steps {}-{}, resumed from step {}", resumed_from + 1,
                        result.steps_completed, resumed_from);
  } else if (ran > 0) {
    which = fmt::format("steps 1-{}", result.steps_completed);
  }
  return fmt::format("{} {} step{} ({}) of {}",
                     result.stopped_by_signal ? "stopped after" : "finished:", ran,
                     ran == 1 ? "" : "s", which, total);
}

double Trainer::elapsed_s() const {
  return elapsed_before_ + seconds_since(train_start_);
}

Trainer::Trainer(config::JobConfig config, std::unique_ptr<data::BatchSource> source,
                 std::unique_ptr<data::BatchSource> validation_source)
    : run_(build_run(std::move(config), std::move(source), std::move(validation_source),
                     [this] { return elapsed_s(); })),
      config_(run_->config) {}

Trainer::~Trainer() = default;

// The window's step metrics (the steps since the last logged one) into metrics.jsonl and the
// console; the window starts again.
void Trainer::log_window(int64_t step, int64_t tokens_seen, metrics::StepMetrics& m) {
  const auto& t = config_.training;
  // Tokens this rank's data-parallel slice trains on per step; a model replica spans the
  // world's non-data-parallel ranks, so tps, tflops and MFU count each replica once per device
  // by dividing by them (torchtitan's convention).
  const auto& dims = run_->runtime->dims();
  const double replica_ranks =
      static_cast<double>(dims.world_size) / static_cast<double>(run_->runtime->dp_size());
  const double device_tokens_per_step =
      static_cast<double>(run_->accumulation_steps * t.local_batch_size * t.seq_len) /
      replica_ranks;
  const double flops_per_token = run_->summary.flops_per_token;
  m.step = step;
  m.step_time_s = window_.time / static_cast<double>(window_.steps);
  m.tps = device_tokens_per_step / m.step_time_s;
  m.tflops = m.tps * flops_per_token / 1e12;
  m.mfu_pct = peak_.flops > 0 ? 100.0 * m.tps * flops_per_token / peak_.flops : 0.0;
  m.mfu_estimate = peak_.estimate;
  m.mem_peak_gib = metrics::peak_memory_gib(run_->device);
  m.data_time_pct = 100.0 * window_.data / window_.time;
  m.comm_wait_pct = 100.0 * window_.wait / window_.time;
  if (breakdown_) m.breakdown = breakdown_->take_window(step);
  m.tokens_seen = tokens_seen;
  m.elapsed_s = elapsed_s();
  m.since_start_s = metrics::seconds_since_process_start();
  m.data_skipped = run_->source->records_skipped();
  const uint64_t comm_now = run_->runtime->total_wire_bytes();
  const double per_step_mb = 1e6 * static_cast<double>(window_.steps);
  m.comm_mb = static_cast<double>(comm_now - window_.comm_start) / per_step_mb;
  const auto by_collective = run_->runtime->wire_bytes_by_collective();
  for (size_t c = 0; c < by_collective.size(); ++c) {
    const uint64_t sent = by_collective[c] - window_.comm_start_by_collective[c];
    if (sent > 0) {
      m.comm_mb_by_collective.emplace_back(
          distributed::to_string(static_cast<distributed::Collective>(c)),
          static_cast<double>(sent) / per_step_mb);
    }
  }
  metrics_->log_step(m);
  window_ = Window{};
  window_.comm_start = comm_now;
  window_.comm_start_by_collective = by_collective;
}

bool Trainer::is_log_step(int64_t step) const {
  return step % config_.metrics.log_freq == 0 || step == 1 || step == config_.training.steps;
}

// One optimizer step over the step's microbatches, each loss divided by the valid tokens of the
// whole step so that accumulation equals one big batch. Nothing here waits for the device: the
// loss and the gradient norm stay tensors until a logging step reads them.
std::vector<data::Batch> Trainer::step_batches() {
  if (!retry_.empty()) return std::exchange(retry_, {});
  std::vector<data::Batch> micro;
  for (int64_t i = 0; i < run_->accumulation_steps; ++i) {
    RECORD_USER_SCOPE("loom::data");  // scopes name tools/step_breakdown.py's categories
    micro.push_back(
        run_->source->next(config_.training.local_batch_size, config_.training.seq_len));
  }
  return micro;
}

Trainer::StepOutcome Trainer::train_step(int64_t step, PendingStep& pending,
                                         metrics::StepMetrics& m) {
  const auto& t = config_.training;
  Run& run = *run_;
  auto data_start = Clock::now();
  std::vector<data::Batch> micro = step_batches();
  int64_t valid_tokens = 0;
  for (const auto& batch : micro) valid_tokens += models::count_valid_tokens(batch.labels);
  const double data_time = seconds_since(data_start);
  // The loss is normalized by the tokens of the global batch, summed over the ranks sharing it
  // (counted on the host from the host batch: no device sync).
  auto& loss_group = run.runtime->group(distributed::MeshGroup::loss);
  // Context-parallel ranks read the same rows (each trains a share of their tokens).
  valid_tokens = static_cast<int64_t>(sum_over(loss_group, static_cast<double>(valid_tokens))) /
                 run.runtime->dims().cp;
  LOOM_CHECK_AS(InputError, valid_tokens > 0, "step ", step, ": the batch has no token to predict");
  if (graphed_) {
    m.lr = lr_of(step);
    const auto out = graphed_->step(micro, static_cast<double>(valid_tokens), m.lr);
    pending.step = step;
    pending.loss = out.loss;
    pending.grad_norm = out.grad_norm;
    run.step_hook->after_optimizer_step(step);
    return {data_time, true};
  }

  run.optimizer->zero_grad();
  if (run.model.begin_step) run.model.begin_step(step);
  at::Tensor loss_sum;
  for (size_t i = 0; i < micro.size(); ++i) {
    at::Tensor loss = run.steps->train_microbatch(micro[i], static_cast<double>(valid_tokens),
                                                  i + 1 == micro.size());
    loss_sum = loss_sum.defined() ? loss_sum + loss : loss;
  }
  run.model.gradient_sync->finish();
  run.step_hook->reduce_gradients(loss_sum, static_cast<double>(valid_tokens));
  if (config_.metrics.log_layer_grad_norms && is_log_step(step)) {
    // Over every rank: FSDP shards, TP pieces and pipeline stages each hold some of a block.
    std::vector<std::string> names;
    for (const auto& p : run.summary.parameters) names.push_back(p.name);
    std::vector<metrics::GradientBox> local;
    for (const auto& p : run.model.parameters) {
      local.push_back({p.name, p.tensor, p.placement.replica_rank() == 0});
    }
    m.block_grad_norms = metrics::block_grad_norms(names, local, &run.runtime->world_group());
  }
  RECORD_USER_SCOPE("loom::optimizer");
  pending.step = step;
  pending.loss = loss_sum.to(at::kDouble);
  poison_gradient_for_test(step);
  pending.grad_norm =
      clip_grad_norm(run.local_tensors, run.placements, t.max_norm, &run.runtime->world_group());
  if (!run.step_hook->commit(step)) {
    retry_ = std::move(micro);
    return {data_time, false};
  }
  m.lr = lr_of(step);
  run.optimizer->set_lr(m.lr);
  const at::Tensor skipped = nonfinite_skip_flag(pending.grad_norm, t.skip_nonfinite_steps);
  run.optimizer->step(skipped);
  if (run.spec->after_optimizer_step) {
    m.model_metrics = run.spec->after_optimizer_step(run.model, {is_log_step(step), skipped});
  }
  run.step_hook->after_optimizer_step(step);
  // After every change to the parameters (e.g. float8's precomputed all-gather scales).
  models::after_weights_change(run.converters.hooks);
  return {data_time, true};
}

int64_t Trainer::begin_step(int64_t committed, int64_t& tokens_seen) {
  Run& run = *run_;
  TrainPosition position{tokens_seen, lr_step_offset_, static_cast<int64_t>(elapsed_s() * 1000)};
  const int64_t now = run.step_hook->begin_step(committed, position);
  if (now == committed) return committed;
  tokens_seen = position.tokens_seen;
  lr_step_offset_ = position.lr_step_offset;
  run.checkpoint->set_lr_step_offset(lr_step_offset_);
  elapsed_before_ = static_cast<double>(position.elapsed_ms) / 1000 - seconds_since(train_start_);
  // The loader moves to the quorum's step: the batches of the steps this group did not train
  // (its data depends on its replica id and the step alone, so nothing is skipped or repeated).
  // Bounded by the job's own length (a quorum beyond training.steps ends the run, nothing to
  // skip to) and interruptible: SIGTERM stops the skipping within a batch.
  const int64_t target = std::min(now, config_.training.steps);
  int64_t skip = std::max<int64_t>(0, (target - committed) * run.accumulation_steps);
  if (!retry_.empty()) {
    skip -= std::min(skip, static_cast<int64_t>(retry_.size()));
    retry_.clear();
  }
  const int64_t skipped = data::skip_batches(*run.source, skip, config_.training.local_batch_size,
                                             config_.training.seq_len);
  LOOM_CHECK_AS(Error, skipped == skip, "stopped by signal ", signals::shutdown_signal(),
                " while the loader skipped to step ", now, " after healing (", skipped, " of ",
                skip, " batches)");
  log::get("trainer")->info("healed from replica group {}: step {} -> {} ({} batches skipped)",
                            run.step_hook->healed_from().value_or(-1), committed, now, skip);
  return now;
}

void Trainer::poison_gradient_for_test(int64_t step) {
  const auto& steps = config_.debug.nonfinite_gradient_steps;
  if (run_->runtime->rank() != 0 || std::find(steps.begin(), steps.end(), step) == steps.end()) {
    return;
  }
  for (const auto& tensor : run_->local_tensors) {
    if (!tensor.grad().defined()) continue;
    tensor.grad().view(-1).narrow(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
    log::get("trainer")->warn("debug.nonfinite_gradient_steps: a NaN in a gradient of step {}",
                              step);
    return;
  }
}

bool Trainer::check_gradient_norm(int64_t step, double norm) {
  const int64_t limit = config_.training.skip_nonfinite_steps;
  if (std::isfinite(norm)) {
    skipped_in_a_row_ = 0;
    return false;
  }
  LOOM_CHECK_AS(InputError, limit > 0, "step ", step, ": the gradient norm is ", norm,
                ", and the update made the weights non-finite; the run stops before a checkpoint "
                "keeps them (training.skip_nonfinite_steps = N skips up to N such steps in a "
                "row instead; or lower optimizer.lr, check the data)");
  ++skipped_in_a_row_;
  ++skipped_steps_;
  LOOM_CHECK_AS(InputError, skipped_in_a_row_ <= limit, "step ", step, ": ", skipped_in_a_row_,
                " steps in a row had a non-finite gradient norm, more than "
                "training.skip_nonfinite_steps = ",
                limit, " allows; the weights are still those after step ", step - skipped_in_a_row_,
                " (diverged; lower optimizer.lr or check the data)");
  log::get("trainer")->warn(
      "step {}: the gradient norm is {}: the update was skipped ({} in a row, at most {})", step,
      norm, skipped_in_a_row_, limit);
  return true;
}

void Trainer::flush_pending(TrainResult& result, metrics::StepMetrics* window) {
  if (pending_.empty()) return;
  std::vector<at::Tensor> losses, norms;
  for (const auto& p : pending_) {
    losses.push_back(p.loss.reshape({1}));
    norms.push_back(p.grad_norm.reshape({1}));
  }
  auto& loss_group = run_->runtime->group(distributed::MeshGroup::loss);
  at::Tensor loss_values = sum_over(loss_group, at::cat(losses).to(at::kCPU).contiguous());
  loss_values = run_->steps->complete_losses(loss_values, window).contiguous();
  const at::Tensor norm_values = at::cat(norms).to(at::kCPU).contiguous();
  for (size_t i = 0; i < pending_.size(); ++i) {
    const double loss = loss_values[static_cast<int64_t>(i)].item<double>();
    const double norm = norm_values[static_cast<int64_t>(i)].item<double>();
    // A skipped step's loss may be non-finite too: its update changed nothing.
    const bool skipped = check_gradient_norm(pending_[i].step, norm);
    LOOM_CHECK_AS(InputError, skipped || std::isfinite(loss), "step ", pending_[i].step,
                  ": loss is ", loss, " (diverged; lower optimizer.lr or check the data)");
    result.losses.push_back(loss);
    result.grad_norms.push_back(norm);
  }
  pending_.clear();
  if (window == nullptr) return;
  if (config_.training.skip_nonfinite_steps > 0) window->skipped_steps = skipped_steps_;
  window->loss = result.losses.back();
  window->grad_norm = result.grad_norms.back();
}

double Trainer::validate() {
  return run_->validator->run(
      [&](const data::Batch& batch) { return run_->steps->eval_sum(batch); },
      run_->runtime->group(distributed::MeshGroup::loss), run_->runtime->dims().cp);
}

double Trainer::lr_of(int64_t step) const {
  return config_.optimizer.lr * run_->schedule->factor(step - 1 - lr_step_offset_);
}

int Trainer::any_rank_stopping() {
  const int local = signals::shutdown_requested() ? signals::shutdown_signal() : 0;
  auto& world = run_->runtime->world_group();
  if (world.size() == 1) return local;
  at::Tensor flag = at::full({1}, local, at::kInt);
  world.all_reduce(flag, distributed::ReduceOp::kMax);
  return flag.item<int>();
}

TrainResult Trainer::train(const std::function<void()>& on_started) {
  auto log = log::get("trainer");
  const auto& t = config_.training;
  // Colors only for a terminal: log files and pipes get plain text.
  files::create_directories(config_.job.dump_folder);
  const bool color = !config_.metrics.disable_color_printing && ::isatty(STDERR_FILENO) == 1;
  // Every rank prints its console line; rank 0 alone writes metrics.jsonl.
  metrics_ = std::make_unique<metrics::MetricsLogger>(
      metrics::metrics_sinks(config_, run_->runtime->rank(), color));
  peak_ = metrics::peak_flops(run_->device, config_.metrics.peak_tflops);
  profiler_ = std::make_unique<metrics::StepProfiler>(config_, run_->runtime->rank(), run_->device);
  if (config_.metrics.step_breakdown) {
    breakdown_ = std::make_unique<metrics::StepBreakdown>(fmt::format(
        "{}/step_breakdown/rank{}.json", config_.job.dump_folder, run_->runtime->rank()));
  }
  log->info("training {} steps; peak {:.3g} TFLOP/s per device for MFU ({}{})", t.steps,
            peak_.flops / 1e12, peak_.source,
            peak_.estimate ? ": MFU is an estimate; set metrics.peak_tflops for a real one" : "");
  TrainResult result;
  const auto start = Clock::now();
  train_start_ = start;
  const int64_t global_tokens_per_step =
      run_->accumulation_steps * t.local_batch_size * t.seq_len * run_->runtime->dp_size();
  if (config_.checkpoint.create_seed_checkpoint) {
    if (on_started) on_started();
    run_->checkpoint->save_seed();
    log->info("seed checkpoint written to {}/step-0", run_->checkpoint->folder());
    return result;
  }
  const auto resume = run_->checkpoint->load();
  models::after_weights_change(run_->converters.hooks);
  if (on_started) on_started();
  lr_step_offset_ = resume.step - resume.lr_step;
  run_->checkpoint->set_lr_step_offset(lr_step_offset_);
  if (resume.saved_config && run_->runtime->rank() == 0) {
    const auto change =
        describe_schedule_change(*resume.saved_config, config_, resume.lr_step, resume.step);
    if (change) log->warn("{}", *change);
  }
  elapsed_before_ = resume.elapsed_s;
  metrics::RunStart started = run_start(config_, run_->runtime->dims(), resume, peak_);
  started.float8_linears = run_->converters.float8_linears;
  started.float8_grouped = run_->converters.float8_grouped;
  started.float8_emulated = run_->converters.emulated;
  metrics_->start_run(started);
  graphed_ = make_graphed_step(*run_);
  int64_t tokens_seen = resume.tokens_seen;
  window_ = Window{};
  window_.comm_start = run_->runtime->total_wire_bytes();
  window_.comm_start_by_collective = run_->runtime->wire_bytes_by_collective();
  for (int64_t step = resume.step + 1; step <= t.steps; ++step) {
    try {
      step = begin_step(step - 1, tokens_seen) + 1;
    } catch (const StepStopped& stop) {
      // Between steps, on every rank of the group: the last committed step is saved as after a
      // step's stop (not when a discarded step's batches were already taken from the loader).
      log->warn("{}: stopping after step {}", stop.what(), step - 1);
      if (retry_.empty() && step - 1 > resume.step) {
        flush_pending(result, nullptr);  // a diverged step is not saved
        run_->checkpoint->save_stopped(step - 1, tokens_seen);
      }
      result.stopped_by_signal = true;
      result.stop_signal = stop.signal();
      break;
    }
    if (step > t.steps) break;
    metrics::StepMetrics m;
    profiler_->step_begin(step);
    if (breakdown_) breakdown_->step_begin();
    const auto step_start = Clock::now();
    const double wait_start = distributed::comm_wait_seconds();
    pending_.emplace_back();
    StepOutcome outcome;
    try {
      outcome = train_step(step, pending_.back(), m);
    } catch (const c10::OutOfMemoryError& e) {
      profiler_->out_of_memory(step, e.what_without_backtrace());  // throws, naming a snapshot
    }
    window_.data += outcome.data_time;
    window_.time += seconds_since(step_start);
    window_.wait += distributed::comm_wait_seconds() - wait_start;
    if (breakdown_) breakdown_->step_end();
    profiler_->step_end(step);
    if (!outcome.committed) {  // the replica groups discarded it: the same step again
      pending_.pop_back();
      ++discarded_steps_;
      // Retries can go on for as long as a peer group stays broken: a stop request ends them
      // (the last committed step's checkpoint stays the newest).
      if (const int signal = any_rank_stopping(); signal != 0) {
        log->warn("stop requested (signal {}) while step {} was retried: stopping", signal, step);
        result.stopped_by_signal = true;
        result.stop_signal = signal;
        break;
      }
      --step;
      continue;
    }
    ++window_.steps;
    if (step == resume.step + 1) run_->runtime->use_train_timeout();
    if (result.steps_completed == 0) result.first_step = step;  // after any healing
    result.steps_completed = step;
    const bool healed = run_->step_hook->healed_from().has_value();
    m.quorum = run_->step_hook->quorum(discarded_steps_);
    tokens_seen += global_tokens_per_step * run_->step_hook->batch_copies();
    const int stop_signal = any_rank_stopping();
    const bool stopping = stop_signal != 0;
    // Losses are read (one host sync, one all-reduce) only when they are logged, and before a
    // checkpoint: the checks of flush_pending stop a diverged run before it is saved.
    if (is_log_step(step) || step == resume.step + 1 || stopping || healed) {
      flush_pending(result, &m);
      log_window(step, tokens_seen, m);
      discarded_steps_ = 0;
    } else if (run_->checkpoint->saves_at(step, step == t.steps, stopping)) {
      flush_pending(result, nullptr);
    }
    if (run_->validator && step % config_.validation.freq == 0) {
      metrics_->log_validation(step, validate(), tokens_seen, elapsed_s());
    }
    run_->checkpoint->on_step_end(step, tokens_seen, step == t.steps, stopping);
    if (stopping) {
      log->warn("stop requested (signal {} here, or on another rank): stopping after step {}",
                signals::shutdown_signal(), step);
      result.stopped_by_signal = true;
      result.stop_signal = stop_signal;
      break;
    }
  }
  run_->checkpoint->wait();
  if (graphed_ && graphed_->recorded()) {
    result.graph_replays = graphed_->steps_run() - GraphedStep::kEagerSteps;
  }
  metrics_->finish_run(result.stopped_by_signal ? "stopped" : "finished", result.steps_completed);
  result.peak_memory_gib = metrics::peak_memory_gib(run_->device);
  // The replica groups' all-reduces and healing streams are this rank's traffic too.
  result.comm_wire_bytes = run_->runtime->total_wire_bytes() + run_->step_hook->wire_bytes();
  if (result.steps_completed == 0) result.first_step = resume.step + 1;
  result.elapsed_s = seconds_since(start);
  log->info(
      "{} in {:.1f} s ({:.2f} MB sent over the process groups by this rank); metrics in "
      "{}/metrics.jsonl",
      describe_steps_run(result, resume.step, t.steps), result.elapsed_s,
      static_cast<double>(result.comm_wire_bytes) / 1e6, config_.job.dump_folder);
  return result;
}

}  // namespace loom::train
