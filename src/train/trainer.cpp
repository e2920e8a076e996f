#include "loom/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>

#include <unistd.h>

#include <chrono>
#include <random>

#include "loom/checkpoint/manager.h"
#include "loom/config/dataset_mixture.h"
#include "loom/core/check.h"
#include "loom/core/files.h"
#include "loom/core/logging.h"
#include "loom/core/signals.h"
#include "loom/data/mixture.h"
#include "loom/data/packed_loader.h"
#include "loom/data/prefetch.h"
#include "loom/data/synthetic.h"
#include "loom/data/tokenizer.h"
#include "loom/train/loss.h"
#include "loom/train/lr_scheduler.h"
#include "loom/train/memory_check.h"
#include "loom/train/mixed_precision.h"
#include "loom/train/optimizer.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One GPU per process: the local rank's.
at::Device choose_device(const std::string& setting, int local_rank) {
  const bool cuda = at::hasCUDA();
  if (setting == "cuda") {
    LOOM_CHECK_AS(InputError, cuda, "training.device = 'cuda' but no CUDA device is available");
  }
  if (setting == "cuda" || (setting == "auto" && cuda)) {
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  }
  return at::Device(at::kCPU);
}

bool wants_cuda(const std::string& setting) {
  return setting == "cuda" || (setting == "auto" && at::hasCUDA());
}

// The layouts this build trains; the others are refused before any rank starts work.
void check_supported_layout(const distributed::ParallelDims& dims) {
  LOOM_CHECK_AS(InputError, dims.tp == 1 && dims.pp == 1 && dims.cp == 1,
                "parallelism: tensor, pipeline and context parallel degrees other than 1 are not "
                "implemented yet (",
                dims.describe(), ")");
}

// A number summed over a group (the step's valid tokens, its loss).
double sum_over(distributed::Comm& group, double value) {
  if (group.size() == 1) return value;
  at::Tensor t = at::full({1}, value, at::kDouble);
  group.all_reduce(t);
  return t.item<double>();
}

// Only the synthetic stream works without a tokenizer.
bool is_synthetic(const std::string& name, const std::optional<std::string>& path,
                  const config::StringList& mixture) {
  return name == "synthetic" && !path && mixture.empty();
}

// "synthetic" (structured random tokens over the model's vocabulary), a weighted mixture
// (`mixture`, the section's dataset_mixture) or one real dataset.
std::unique_ptr<data::BatchSource> dataset_source(const std::string& name,
                                                  const std::optional<std::string>& path,
                                                  const config::StringList& mixture,
                                                  const data::Tokenizer* tokenizer, int64_t vocab,
                                                  data::PackedLoaderOptions options,
                                                  const std::string& section) {
  if (is_synthetic(name, path, mixture)) {
    return std::make_unique<data::SyntheticSource>(vocab, options.seed, options.dp_rank,
                                                   options.dp_world);
  }
  LOOM_CHECK(tokenizer != nullptr, "a real dataset needs the tokenizer");
  if (!mixture.empty()) {
    const std::string key = section + ".dataset_mixture";
    std::vector<data::MixtureComponent> components;
    for (const auto& entry : config::parse_dataset_mixture(mixture, key)) {
      components.push_back({entry.source, entry.weight});
    }
    return data::open_mixture(components, *tokenizer, options, key);
  }
  return data::open_dataset(name, path, *tokenizer, options, section + ".dataset");
}

}  // namespace

Trainer::Trainer(config::JobConfig config, std::unique_ptr<data::BatchSource> source,
                 std::unique_ptr<data::BatchSource> validation_source)
    : config_(std::move(config)) {
  setup_runtime();
  // Decided before the model is built: its vocabulary is the tokenizer's whenever any dataset
  // (training or validation) is real text.
  const auto& t = config_.training;
  const auto& v = config_.validation;
  if (!is_synthetic(t.dataset, t.dataset_path, t.dataset_mixture) ||
      (v.enable && !is_synthetic(v.dataset, v.dataset_path, v.dataset_mixture))) {
    tokenizer_ = data::load_tokenizer(
        data::tokenizer_location(config_.model.tokenizer_path, config_.model.hf_assets_path));
  }
  check_memory_fits(config_, tokenizer_ ? tokenizer_->vocab_size() : 0,
                    uses_fsdp() ? runtime_->dims().dp_shard : 1, device_);
  build_model();
  build_data(std::move(source), std::move(validation_source));
  build_checkpointer();
}

Trainer::~Trainer() = default;

void Trainer::setup_runtime() {
  auto log = log::get("trainer");
  runtime_ =
      std::make_unique<distributed::ParallelRuntime>(config_, wants_cuda(config_.training.device));
  check_supported_layout(runtime_->dims());
  device_ = choose_device(config_.training.device, runtime_->world().local_rank);
  seed_ = config_.debug.seed ? static_cast<uint64_t>(*config_.debug.seed) : std::random_device{}();
  at::manual_seed(seed_);
  if (config_.debug.deterministic) {
    at::globalContext().setDeterministicAlgorithms(true, config_.debug.deterministic_warn_only);
  }
  const auto& t = config_.training;
  const int64_t dp = runtime_->dp_size();
  const int64_t global = t.global_batch_size > 0 ? t.global_batch_size : t.local_batch_size * dp;
  LOOM_CHECK_AS(InputError, global % (t.local_batch_size * dp) == 0, "training.global_batch_size (",
                global, ") must be a multiple of local_batch_size x dp (", t.local_batch_size * dp,
                ")");
  accumulation_steps_ = global / (t.local_batch_size * dp);
  LOOM_CHECK_AS(InputError, !config_.validation.enable || config_.validation.seq_len <= t.seq_len,
                "validation.seq_len (", config_.validation.seq_len, ") exceeds training.seq_len (",
                t.seq_len, "), the longest sequence the model is built for");
  const auto compute = autocast_dtype(t, device_);
  log->info(
      "device {}, parameters {}, compute {}, seed {}{}, gradient accumulation {} x local batch {}",
      device_.str(), t.dtype, compute ? std::string(c10::toString(*compute)) : t.dtype, seed_,
      config_.debug.seed ? "" : " (random: set debug.seed to reproduce)", accumulation_steps_,
      t.local_batch_size);
}

void Trainer::build_model() {
  // The embedding table matches the tokenizer (synthetic data keeps the flavor's vocabulary).
  // Under FSDP the model is built on meta: FSDP creates only this rank's shards.
  const bool sharded = uses_fsdp();
  model_ = models::build_model(config_, tokenizer_ ? tokenizer_->vocab_size() : 0,
                               at::TensorOptions()
                                   .device(sharded ? at::Device(at::kMeta) : device_)
                                   .dtype(parameter_dtype(config_.training)));
  if (!sharded) model_->init_weights(seed_);
  model_->apply_activation_checkpointing(config_.activation_checkpoint);
  apply_parallelism();
  optimizer_ = build_optimizer(config_.optimizer, parameters_);
  schedule_.emplace(config_.lr_scheduler,
                    config_.lr_scheduler.total_steps.value_or(config_.training.steps));
  summary_ = model_->summary(config_.training.seq_len);
  log::get("trainer")->info("model {}", models::format_summary(summary_, false));
}

// FSDP (dp_shard > 1; HSDP when dp_replicate > 1 too) or DDP (dp_replicate > 1 alone). The
// optimizer gets FSDP's local shards.
void Trainer::apply_parallelism() {
  if (uses_fsdp()) {
    const at::ScalarType compute =
        autocast_dtype(config_.training, device_).value_or(parameter_dtype(config_.training));
    fsdp_ = std::make_unique<parallel::FullyShardedDataParallel>(
        *model_, runtime_->group_ptr(distributed::MeshGroup::fsdp),
        runtime_->group_ptr(distributed::MeshGroup::dp_replicate), device_, seed_,
        parallel::fsdp_options(config_, compute));
    parameters_ = fsdp_->sharded_parameters();
    return;
  }
  for (const auto& p : model_->module().parameters()) parameters_.push_back(p);
  if (runtime_->dims().dp_replicate == 1) return;
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : model_->module().named_parameters()) {
    named.emplace_back(item.key(), item.value());
  }
  data_parallel_ = std::make_unique<parallel::DataParallel>(
      std::move(named), runtime_->group_ptr(distributed::MeshGroup::dp_replicate));
}

void Trainer::build_data(std::unique_ptr<data::BatchSource> source,
                         std::unique_ptr<data::BatchSource> validation_source) {
  const auto& t = config_.training;
  const auto& v = config_.validation;
  const bool skip_bad = t.dataset_on_error == "skip";
  auto train_source = source ? std::move(source)
                             : dataset_source(t.dataset, t.dataset_path, t.dataset_mixture,
                                              tokenizer_.get(), model_->vocab_size(),
                                              {t.seq_len, seed_, true, runtime_->dp_rank(),
                                               runtime_->dp_size(), skip_bad},
                                              "training");
  // A background thread keeps the next two microbatches ready.
  source_ = std::make_unique<data::PrefetchingSource>(std::move(train_source), t.local_batch_size,
                                                      t.seq_len, 2);
  if (v.enable) {
    validation_source_ = validation_source
                             ? std::move(validation_source)
                             : dataset_source(v.dataset, v.dataset_path, v.dataset_mixture,
                                              tokenizer_.get(), model_->vocab_size(),
                                              {v.seq_len, seed_ + 1, false, runtime_->dp_rank(),
                                               runtime_->dp_size(), skip_bad},
                                              "validation");
    LOOM_CHECK_AS(InputError, v.steps > 0 || validation_source_->samples_per_epoch(),
                  "validation.steps = -1 (the whole set) needs a finite validation dataset; set a "
                  "step count for '",
                  v.dataset, "'");
  }
}

// What a checkpoint holds of this rank: whole parameters, or FSDP's shards as chunks of the
// full ones (so any layout loads them). Replicas (DDP, HSDP's replicate dimension) hold
// identical tensors and split the writing.
void Trainer::build_checkpointer() {
  checkpoint::CheckpointTargets targets;
  if (fsdp_) {
    const auto& names = fsdp_->parameter_names();
    for (size_t i = 0; i < names.size(); ++i) {
      targets.parameters.emplace_back(names[i], fsdp_->sharded_parameters()[i]);
    }
    targets.layout = [fsdp = fsdp_.get()](const std::string& name, const at::Tensor& local) {
      const auto placement = fsdp->shard_placement(name);
      std::vector<int64_t> offsets(local.dim(), 0);
      offsets[0] = placement.first_row;
      return checkpoint::ChunkPlacement{placement.global_shape, offsets};
    };
  } else {
    for (const auto& item : model_->module().named_parameters()) {
      targets.parameters.emplace_back(item.key(), item.value());
    }
  }
  targets.optimizer = optimizer_.get();
  targets.data = source_.get();
  auto& replicas = runtime_->group(distributed::MeshGroup::dp_replicate);
  targets.replica_rank = replicas.rank();
  targets.replica_count = replicas.size();
  checkpoint_ =
      std::make_unique<checkpoint::CheckpointManager>(config_, *runtime_, std::move(targets));
}

double Trainer::train_step(int64_t step, metrics::StepMetrics& m) {
  const auto& t = config_.training;
  auto data_start = Clock::now();
  std::vector<data::Batch> micro;
  int64_t valid_tokens = 0;
  for (int64_t i = 0; i < accumulation_steps_; ++i) {
    micro.push_back(source_->next(t.local_batch_size, t.seq_len));
    valid_tokens += count_valid_tokens(micro.back().labels);
  }
  const double data_time = seconds_since(data_start);
  // The loss is normalized by the tokens of the global batch, summed over the ranks sharing it.
  auto& loss_group = runtime_->group(distributed::MeshGroup::loss);
  valid_tokens = static_cast<int64_t>(sum_over(loss_group, static_cast<double>(valid_tokens)));
  LOOM_CHECK_AS(InputError, valid_tokens > 0, "step ", step, ": the batch has no token to predict");

  optimizer_->zero_grad();
  double loss_sum = 0;
  const auto compute_dtype = autocast();
  for (size_t i = 0; i < micro.size(); ++i) {
    auto& batch = micro[i];
    // Gradients are all-reduced (reduce-scattered) during the last microbatch's backward only.
    if (data_parallel_) data_parallel_->set_requires_gradient_sync(i + 1 == micro.size());
    if (fsdp_) fsdp_->set_requires_gradient_sync(i + 1 == micro.size());
    at::Tensor loss;
    {
      AutocastGuard autocast(device_.type(), compute_dtype);
      at::Tensor logits = model_->forward(batch.inputs.to(device_));
      // Divided by the valid tokens of the whole step, so accumulation equals one big batch.
      loss =
          cross_entropy_sum(logits, batch.labels.to(device_)) / static_cast<double>(valid_tokens);
    }
    loss.backward();
    loss_sum += loss.item<double>();
  }
  if (data_parallel_) data_parallel_->finish_gradient_sync();
  if (fsdp_) fsdp_->finish_gradient_sync();
  m.grad_norm = fsdp_ ? fsdp_->clip_grad_norm(t.max_norm) : clip_grad_norm(parameters_, t.max_norm);
  m.lr = config_.optimizer.lr * schedule_->factor(step - 1 - lr_step_offset_);
  set_learning_rate(*optimizer_, m.lr);
  optimizer_->step();
  m.loss = sum_over(loss_group, loss_sum);
  return data_time;
}

bool Trainer::uses_fsdp() const {
  return runtime_->dims().dp_shard > 1 || config_.debug.force_fsdp;
}

// FSDP computes in mixed_precision_param by construction (its unsharded parameters have that
// dtype), so autocast applies without it only.
std::optional<at::ScalarType> Trainer::autocast() const {
  return fsdp_ ? std::nullopt : autocast_dtype(config_.training, device_);
}

double Trainer::validate() {
  at::NoGradGuard no_grad;
  double loss_sum = 0;
  int64_t tokens = 0;
  // -1: one pass over the whole (finite) validation set.
  const int64_t steps = config_.validation.steps > 0
                            ? config_.validation.steps
                            : std::max<int64_t>(1, *validation_source_->samples_per_epoch() /
                                                       config_.validation.local_batch_size);
  for (int64_t i = 0; i < steps; ++i) {
    data::Batch batch =
        validation_source_->next(config_.validation.local_batch_size, config_.validation.seq_len);
    AutocastGuard autocast_guard(device_.type(), autocast());
    loss_sum +=
        cross_entropy_sum(model_->forward(batch.inputs.to(device_)), batch.labels.to(device_))
            .item<double>();
    tokens += count_valid_tokens(batch.labels);
  }
  // Every rank validated its slice of each global batch.
  auto& loss_group = runtime_->group(distributed::MeshGroup::loss);
  loss_sum = sum_over(loss_group, loss_sum);
  const double all_tokens = sum_over(loss_group, static_cast<double>(tokens));
  return loss_sum / std::max(all_tokens, 1.0);
}

bool Trainer::any_rank_stopping() {
  const bool local = signals::shutdown_requested();
  auto& world = runtime_->world_group();
  if (world.size() == 1) return local;
  at::Tensor flag = at::full({1}, local ? 1 : 0, at::kInt);
  world.all_reduce(flag, distributed::ReduceOp::kMax);
  return flag.item<int>() != 0;
}

TrainResult Trainer::train() {
  auto log = log::get("trainer");
  const auto& t = config_.training;
  // Colors only for a terminal: log files and pipes get plain text.
  files::create_directories(config_.job.dump_folder);
  const bool color = !config_.metrics.disable_color_printing && ::isatty(STDERR_FILENO) == 1;
  // Every rank prints its console line; rank 0 alone writes metrics.jsonl.
  metrics_ = std::make_unique<metrics::MetricsLogger>(
      runtime_->is_main_rank() ? config_.job.dump_folder + "/metrics.jsonl" : std::string(), color);
  peak_flops_ = metrics::peak_flops(device_, config_.metrics.peak_tflops);
  log->info("training {} steps; peak {:.3g} TFLOP/s per device for MFU", t.steps,
            peak_flops_ / 1e12);
  TrainResult result;
  const auto start = Clock::now();
  // Per rank (tps is per device); tokens_seen counts the global batch.
  const int64_t tokens_per_step = accumulation_steps_ * t.local_batch_size * t.seq_len;
  const int64_t global_tokens_per_step = tokens_per_step * runtime_->dp_size();
  double window_time = 0, window_data = 0;
  int64_t window_steps = 0;
  if (config_.checkpoint.create_seed_checkpoint) {
    checkpoint_->save_seed();
    log->info("seed checkpoint written to {}/step-0", checkpoint_->folder());
    return result;
  }
  const auto resume = checkpoint_->load();
  lr_step_offset_ = resume.step - resume.lr_step;
  int64_t tokens_seen = resume.tokens_seen;
  uint64_t window_comm_start = runtime_->total_wire_bytes();
  for (int64_t step = resume.step + 1; step <= t.steps; ++step) {
    metrics::StepMetrics m;
    const auto step_start = Clock::now();
    window_data += train_step(step, m);
    window_time += seconds_since(step_start);
    ++window_steps;
    if (step == resume.step + 1) runtime_->use_train_timeout();
    result.losses.push_back(m.loss);
    result.grad_norms.push_back(m.grad_norm);
    result.steps_completed = step;
    tokens_seen += global_tokens_per_step;
    LOOM_CHECK_AS(InputError, std::isfinite(m.loss), "step ", step, ": loss is ", m.loss,
                  " (diverged; lower optimizer.lr or check the data)");
    if (step % config_.metrics.log_freq == 0 || step == 1 || step == t.steps) {
      m.step = step;
      m.step_time_s = window_time / window_steps;
      m.tps = static_cast<double>(tokens_per_step) / m.step_time_s;
      m.tflops = m.tps * summary_.flops_per_token / 1e12;
      m.mfu_pct = peak_flops_ > 0 ? 100.0 * m.tps * summary_.flops_per_token / peak_flops_ : 0.0;
      m.mem_peak_gib = metrics::peak_memory_gib(device_);
      m.data_time_pct = 100.0 * window_data / window_time;
      m.tokens_seen = tokens_seen;
      m.elapsed_s = seconds_since(start);
      m.since_start_s = metrics::seconds_since_process_start();
      m.data_skipped = source_->records_skipped();
      const uint64_t comm_now = runtime_->total_wire_bytes();
      m.comm_mb = static_cast<double>(comm_now - window_comm_start) / 1e6 / window_steps;
      metrics_->log_step(m);
      window_time = window_data = 0;
      window_steps = 0;
      window_comm_start = comm_now;
    }
    if (validation_source_ && step % config_.validation.freq == 0) {
      metrics_->log_validation(step, validate(), tokens_seen, seconds_since(start));
    }
    const bool stopping = any_rank_stopping();
    checkpoint_->on_step_end(step, tokens_seen, step == t.steps, stopping);
    if (stopping) {
      log->warn("stop requested (signal {} here, or on another rank): stopping after step {}",
                signals::shutdown_signal(), step);
      result.stopped_by_signal = true;
      break;
    }
  }
  checkpoint_->wait();
  result.peak_memory_gib = metrics::peak_memory_gib(device_);
  result.comm_wire_bytes = runtime_->total_wire_bytes();
  log->info(
      "finished {} steps in {:.1f} s ({:.2f} MB sent over the process groups by this rank); "
      "metrics in {}/metrics.jsonl",
      result.steps_completed, seconds_since(start),
      static_cast<double>(result.comm_wire_bytes) / 1e6, config_.job.dump_folder);
  return result;
}

}  // namespace loom::train
