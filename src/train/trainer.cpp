#include "loom/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <random>

#include "loom/checkpoint/manager.h"
#include "loom/checkpoint/resume_batch.h"
#include "loom/core/host_allocator.h"
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
#include "loom/distributed/world_info.h"
#include "loom/metrics/grad_norms.h"
#include "loom/metrics/memory_estimate.h"
#include "loom/parallel/pipeline/model_parts.h"
#include "loom/parallel/pipeline/simulate.h"
#include "loom/train/grad_clip.h"
#include "loom/models/loss.h"
#include "loom/train/lr_scheduler.h"
#include "loom/train/mixed_precision.h"
#include "loom/train/optimizer.h"
#include "loom/train/preflight.h"
#include "loom/train/threads.h"

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

// Training on the user's files while validating on the embedded corpus is allowed (a quick
// check) but rarely meant: the val_loss then measures another distribution.
void warn_builtin_validation(const config::JobConfig& c) {
  const auto& t = c.training;
  const auto& v = c.validation;
  const bool own_training = t.dataset_path.has_value() || !t.dataset_mixture.empty();
  const bool builtin_validation = !v.dataset_path && v.dataset_mixture.empty() &&
                                  (v.dataset == "brown" || v.dataset == "brown_validation");
  if (v.enable && own_training && builtin_validation) {
    log::get("data")->warn(
        "training reads your files but validation still reads the built-in corpus '{}': set "
        "validation.dataset_path to your held-out files (or validation.enable = false)",
        v.dataset);
  }
}

// What this run trained: "finished: 2 steps (steps 61-62, resumed from step 60) of 62".
std::string describe_steps_run(const TrainResult& result, int64_t resumed_from, int64_t total) {
  const int64_t ran = std::max<int64_t>(result.steps_completed - resumed_from, 0);
  std::string which = "none run";
  if (ran > 0 && resumed_from > 0) {
    which = fmt::format("steps {}-{}, resumed from step {}", resumed_from + 1,
                        result.steps_completed, resumed_from);
  } else if (ran > 0) {
    which = fmt::format("steps 1-{}", result.steps_completed);
  }
  return fmt::format("{} {} step{} ({}) of {}",
                     result.stopped_by_signal ? "stopped after" : "finished:", ran,
                     ran == 1 ? "" : "s", which, total);
}

// metrics.jsonl's start record: which run, resumed from where, with which config and layout.
metrics::RunStart run_start(const config::JobConfig& config, const distributed::ParallelDims& dims,
                            const checkpoint::ResumePoint& resume,
                            const metrics::PeakFlops& peak) {
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

double Trainer::elapsed_s() const {
  return elapsed_before_ + seconds_since(train_start_);
}

std::unique_ptr<data::Tokenizer> load_job_tokenizer(const config::JobConfig& config) {
  // The model's vocabulary is the tokenizer's whenever any dataset (training or validation) is
  // real text.
  const auto& t = config.training;
  const auto& v = config.validation;
  if (!is_synthetic(t.dataset, t.dataset_path, t.dataset_mixture) ||
      (v.enable && !is_synthetic(v.dataset, v.dataset_path, v.dataset_mixture))) {
    return data::load_tokenizer(
        data::tokenizer_location(config.model.tokenizer_path, config.model.hf_assets_path));
  }
  return nullptr;
}

Trainer::Trainer(config::JobConfig config, std::unique_ptr<data::BatchSource> source,
                 std::unique_ptr<data::BatchSource> validation_source)
    : config_(std::move(config)) {
  // Everything this job asks that loom cannot do, all at once and before any rendezvous: every
  // rank refuses alike (the same checks `loom config validate` runs).
  const auto world = distributed::read_world_info();
  device_ = choose_device(config_.training.device, world.local_rank);
  Preflight checked = preflight(config_, {world.world_size, device_, source == nullptr});
  throw_if_refused(checked.problems, "loom train cannot start this job");
  tokenizer_ = std::move(checked.tokenizer);
  setup_runtime();
  build_model();
  build_pipeline();
  build_data(std::move(source), std::move(validation_source));
  build_checkpointer();
}

Trainer::~Trainer() = default;

void Trainer::setup_runtime() {
  auto log = log::get("trainer");
  if (config_.parallelism.pipeline_parallel_degree > 1) {
    pipeline_plan_ = models::plan_pipeline(config_);
  }
  runtime_ =
      std::make_unique<distributed::ParallelRuntime>(config_, wants_cuda(config_.training.device));
  if (device_.is_cpu()) {
    check_thread_plan(runtime_->world().local_world_size);
  }
  log->info("host memory: {}", describe_host_allocator());
  seed_ = config_.debug.seed ? static_cast<uint64_t>(*config_.debug.seed) : std::random_device{}();
  at::manual_seed(seed_);
  if (config_.debug.deterministic) {
    at::globalContext().setDeterministicAlgorithms(true, config_.debug.deterministic_warn_only);
  }
  const auto& t = config_.training;
  const int64_t dp = runtime_->dp_size();
  // Elastic resume: an unset global batch keeps the checkpoint's on a new world size.
  const int64_t global = checkpoint::resolve_global_batch(config_, dp);
  if (global != t.global_batch_size && global != t.local_batch_size * dp) {
    config_.training.global_batch_size = global;  // what this run's checkpoints record
  }
  accumulation_steps_ = global / (t.local_batch_size * dp);
  const auto compute = autocast_dtype(t, device_);
  log->info(
      "device {}, parameters {}, compute {}, seed {}{}, gradient accumulation {} x local batch {}",
      device_.str(), t.dtype, compute ? std::string(c10::toString(*compute)) : t.dtype, seed_,
      config_.debug.seed ? "" : " (random: set debug.seed to reproduce)", accumulation_steps_,
      t.local_batch_size);
}

// Built on the meta device, then parallelized and materialized by the model family's
// parallelize function (TP -> activation checkpointing -> FSDP/HSDP or DDP).
void Trainer::build_model() {
  // The embedding table matches the tokenizer (synthetic data keeps the flavor's vocabulary).
  const int64_t vocab = tokenizer_ ? tokenizer_->vocab_size() : 0;
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(parameter_dtype(config_.training));
  summary_ = models::build_model(config_, vocab, meta)->summary(config_.training.seq_len);
  const models::ModelSpec& spec = models::find_model_spec(config_.model.name);
  parallel::ParallelContext context{config_,
                                    *runtime_,
                                    device_,
                                    seed_,
                                    parameter_dtype(config_.training),
                                    autocast_dtype(config_.training, device_)};
  // Without pipeline parallelism the whole model; with it, this rank's stages (global names).
  std::vector<std::unique_ptr<models::CausalLM>> parts;
  if (pipeline_plan_) {
    const auto pp_rank = runtime_->mesh().group_rank(distributed::MeshGroup::pp, runtime_->rank());
    for (const auto& part : pipeline_plan_->split.parts_of_rank(static_cast<int>(pp_rank))) {
      parts.push_back(models::build_model(config_, vocab, meta,
                                          parallel::pipeline::to_model_part(part)));
    }
  } else {
    parts.push_back(models::build_model(config_, vocab, meta));
  }
  const auto memory = estimate_rank_memory(parts);
  parallel_ = spec.parallelize(std::move(parts), context);
  local_tensors_ = parallel_.tensors();
  placements_ = parallel_.placements();
  optimizer_ = build_optimizer(config_.optimizer, local_tensors_);
  schedule_ = LRSchedule::of_job(config_);
  auto log = log::get("trainer");
  log->info("model {}", models::format_summary(summary_, false));
  log->info("parallelism: {}; gradient sync: {}", runtime_->dims().layout(), parallel_.description);
  log->info("estimated peak memory per rank: {}", memory.describe());
}

// This rank's share: its pipeline stages, split over FSDP's shards and the tp ranks, with the
// activations of as many microbatches as its schedule keeps alive.
metrics::MemoryEstimate Trainer::estimate_rank_memory(
    const std::vector<std::unique_ptr<models::CausalLM>>& parts) {
  std::vector<models::ModelSummary> summaries;
  for (const auto& part : parts) summaries.push_back(part->summary(config_.training.seq_len));
  // FSDP keeps float32 masters and computes in mixed_precision_param.
  distributed::Comm* shards = shard_group();
  const auto param_dtype = shards ? at::kFloat : parameter_dtype(config_.training);
  const auto compute_dtype = autocast_dtype(config_.training, device_).value_or(param_dtype);
  metrics::MemoryInputs in{shards ? shards->size() : 1,
                           static_cast<int>(c10::elementSize(param_dtype)),
                           static_cast<int>(c10::elementSize(compute_dtype))};
  in.tp_degree = runtime_->dims().tp;
  if (pipeline_plan_) {
    const auto& schedule = pipeline_plan_->schedule;
    const auto pp_rank = runtime_->mesh().group_rank(distributed::MeshGroup::pp, runtime_->rank());
    in.microbatch_rows = config_.parallelism.pipeline_parallel_microbatch_size;
    in.live_microbatches = static_cast<double>(parallel::pipeline::peak_live_activations(
                               schedule, static_cast<int>(pp_rank))) /
                           schedule.stages_per_rank;
  }
  return metrics::estimate_memory(metrics::combine_summaries(summaries), config_, in);
}

bool Trainer::is_log_step(int64_t step) const {
  return step % config_.metrics.log_freq == 0 || step == 1 || step == config_.training.steps;
}

distributed::Comm* Trainer::shard_group() {
  const auto& dims = runtime_->dims();
  const bool sharded = dims.dp_shard * dims.cp > 1 || config_.debug.force_fsdp;
  return sharded ? &runtime_->group(distributed::MeshGroup::fsdp) : nullptr;
}

void Trainer::build_data(std::unique_ptr<data::BatchSource> source,
                         std::unique_ptr<data::BatchSource> validation_source) {
  const auto& t = config_.training;
  const auto& v = config_.validation;
  const bool skip_bad = t.dataset_on_error == "skip";
  auto train_source = source ? std::move(source)
                             : dataset_source(t.dataset, t.dataset_path, t.dataset_mixture,
                                              tokenizer_.get(), model().vocab_size(),
                                              {t.seq_len, seed_, true, runtime_->dp_rank(),
                                               runtime_->dp_size(), skip_bad,
                                               t.dataset_text_field},
                                              "training");
  // A background thread keeps the next two microbatches ready.
  source_ = std::make_unique<data::PrefetchingSource>(std::move(train_source), t.local_batch_size,
                                                      t.seq_len, 2);
  if (v.enable) {
    if (!validation_source) warn_builtin_validation(config_);
    auto validation = validation_source
                          ? std::move(validation_source)
                          : dataset_source(v.dataset, v.dataset_path, v.dataset_mixture,
                                           tokenizer_.get(), model().vocab_size(),
                                           {v.seq_len, seed_ + 1, false, runtime_->dp_rank(),
                                            runtime_->dp_size(), skip_bad,
                                            v.dataset_text_field},
                                           "validation");
    LOOM_CHECK_AS(InputError, v.steps > 0 || validation->samples_per_epoch(),
                  "validation.steps = -1 (the whole set) needs a finite validation dataset; set a "
                  "step count for '",
                  v.dataset, "'");
    validator_ = std::make_unique<Validator>(
        std::move(validation), ValidationOptions{v.steps, v.local_batch_size, v.seq_len,
                                                 runtime_->dp_rank(), runtime_->dp_size()});
  }
}

// What a checkpoint holds of this rank: its local parameters with their placements (any layout
// loads them; replicas split the writing) and the optimizer's and data loader's state.
void Trainer::build_checkpointer() {
  checkpoint::CheckpointTargets targets;
  targets.parameters = parallel_.parameters;
  targets.optimizer = optimizer_.get();
  targets.data = source_.get();
  targets.elapsed_s = [this] { return elapsed_s(); };
  checkpoint_ =
      std::make_unique<checkpoint::CheckpointManager>(config_, *runtime_, std::move(targets));
}

void Trainer::build_pipeline() {
  if (!pipeline_plan_) return;
  parallel::pipeline::PipelineRunnerOptions options;
  options.boundary_shape = parallel_.boundary_shape;
  options.boundary_dtype = parallel_.boundary_dtype;
  options.device = device_;
  options.forward = [this](models::CausalLM& part, const at::Tensor& input) {
    AutocastGuard autocast(device_.type(), parallel_.autocast);
    return part.forward(input.device() == device_ ? input : input.to(device_));
  };
  options.loss_sum = [this](const at::Tensor& output, const at::Tensor& labels) {
    AutocastGuard autocast(device_.type(), parallel_.autocast);
    return parallel_.loss(output, labels.to(device_));
  };
  std::vector<models::CausalLM*> parts;
  for (auto& part : parallel_.parts) parts.push_back(part.get());
  const auto pp_rank = runtime_->mesh().group_rank(distributed::MeshGroup::pp, runtime_->rank());
  pipeline_ = std::make_unique<parallel::pipeline::PipelineRunner>(
      *pipeline_plan_, static_cast<int>(pp_rank), std::move(parts), parallel_.part_syncs,
      runtime_->group_ptr(distributed::MeshGroup::pp), std::move(options));
  const auto& plan = *pipeline_plan_;
  log::get("trainer")->info(
      "pipeline: {} over {} ranks, {} stages ({} per rank), {} microbatches of {} per pass; this "
      "rank runs stages {}",
      plan.schedule.name, plan.split.pp, plan.schedule.stages(), plan.split.stages_per_rank,
      plan.microbatches, config_.parallelism.pipeline_parallel_microbatch_size,
      fmt::join(plan.schedule.stages_of_rank(static_cast<int>(pp_rank)), ", "));
}

// Gradients of every microbatch, each loss divided by the valid tokens of the whole step so that
// accumulation equals one big batch. Returns this rank's part of the step's loss (detached).
at::Tensor Trainer::forward_backward(const std::vector<data::Batch>& micro, int64_t valid_tokens) {
  at::Tensor loss_sum;
  for (size_t i = 0; i < micro.size(); ++i) {
    const bool last = i + 1 == micro.size();
    at::Tensor loss;
    if (pipeline_) {  // the schedule runs backward and arms the stages' gradient sync itself
      loss = pipeline_->train_pass(micro[i].inputs.to(device_), micro[i].labels.to(device_),
                                   static_cast<double>(valid_tokens), last);
    } else {
      parallel_.gradient_sync->prepare_microbatch(last);
      {
        AutocastGuard autocast(device_.type(), parallel_.autocast);
        at::Tensor output = parallel_.parts.front()->forward(micro[i].inputs.to(device_));
        loss = parallel_.loss(output, micro[i].labels.to(device_)) /
               static_cast<double>(valid_tokens);
      }
      loss.backward();
      loss = loss.detach();
    }
    loss_sum = loss_sum.defined() ? loss_sum + loss : loss;
  }
  return loss_sum;
}

// One optimizer step over the step's microbatches. Nothing here waits for the device: the loss
// and the gradient norm stay tensors until a logging step reads them.
double Trainer::train_step(int64_t step, PendingStep& pending, metrics::StepMetrics& m) {
  const auto& t = config_.training;
  auto data_start = Clock::now();
  std::vector<data::Batch> micro;
  int64_t valid_tokens = 0;
  for (int64_t i = 0; i < accumulation_steps_; ++i) {
    RECORD_USER_SCOPE("loom::data");  // scopes name tools/step_breakdown.py's categories
    micro.push_back(source_->next(t.local_batch_size, t.seq_len));
    valid_tokens += models::count_valid_tokens(micro.back().labels);
  }
  const double data_time = seconds_since(data_start);
  // The loss is normalized by the tokens of the global batch, summed over the ranks sharing it
  // (counted on the host from the host batch: no device sync).
  auto& loss_group = runtime_->group(distributed::MeshGroup::loss);
  valid_tokens = static_cast<int64_t>(sum_over(loss_group, static_cast<double>(valid_tokens)));
  LOOM_CHECK_AS(InputError, valid_tokens > 0, "step ", step, ": the batch has no token to predict");

  optimizer_->zero_grad();
  const at::Tensor loss_sum = forward_backward(micro, valid_tokens);
  parallel_.gradient_sync->finish();
  if (config_.metrics.log_layer_grad_norms && is_log_step(step)) {
    // Over every rank: FSDP shards, TP pieces and pipeline stages each hold some of a block.
    std::vector<std::string> names;
    for (const auto& p : summary_.parameters) names.push_back(p.name);
    std::vector<metrics::GradientBox> local;
    for (const auto& p : parallel_.parameters) {
      local.push_back({p.name, p.tensor, p.placement.replica_rank() == 0});
    }
    m.block_grad_norms =
        metrics::block_grad_norms(names, local, &runtime_->world_group());
  }
  RECORD_USER_SCOPE("loom::optimizer");
  pending.step = step;
  pending.loss = loss_sum.to(at::kDouble);
  pending.grad_norm = clip_grad_norm(local_tensors_, placements_, t.max_norm,
                                     &runtime_->world_group());
  m.lr = config_.optimizer.lr * schedule_->factor(step - 1 - lr_step_offset_);
  set_learning_rate(*optimizer_, m.lr);
  optimizer_->step();
  const auto& after_step = models::find_model_spec(config_.model.name).after_optimizer_step;
  if (after_step) after_step(parallel_);
  return data_time;
}

void Trainer::flush_pending(TrainResult& result, metrics::StepMetrics& last) {
  if (pending_.empty()) return;
  std::vector<at::Tensor> losses, norms;
  for (const auto& p : pending_) {
    losses.push_back(p.loss.reshape({1}));
    norms.push_back(p.grad_norm.reshape({1}));
  }
  auto& loss_group = runtime_->group(distributed::MeshGroup::loss);
  at::Tensor loss_values = sum_over(loss_group, at::cat(losses).to(at::kCPU).contiguous());
  if (pipeline_) {
    // The losses live on the last stage (zeros elsewhere); with them, each pp rank's busy and
    // pipeline time over the window in its own slot, for the bubble as `loom plan schedule`
    // defines it (parallel::pipeline::bubble_fraction).
    const auto stats = pipeline_->take_stats();
    auto& pp = pipeline_->group();
    const int64_t ranks = pp.size(), losses = loss_values.size(0);
    at::Tensor times = at::zeros({2 * ranks}, at::kDouble);
    times[pp.rank()] = stats.compute_seconds;
    times[ranks + pp.rank()] = stats.pass_seconds;
    at::Tensor values = sum_over(pp, at::cat({loss_values.to(at::kDouble), times}));
    const auto all = values.accessor<double, 1>();
    std::vector<double> busy;
    double step = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      busy.push_back(all[losses + r]);
      step = std::max(step, all[losses + ranks + r]);
    }
    last.pp_bubble_pct = 100.0 * parallel::pipeline::bubble_fraction(busy, step);
    loss_values = values.narrow(0, 0, losses);
  }
  loss_values = loss_values.contiguous();
  const at::Tensor norm_values = at::cat(norms).to(at::kCPU).contiguous();
  for (size_t i = 0; i < pending_.size(); ++i) {
    const double loss = loss_values[static_cast<int64_t>(i)].item<double>();
    LOOM_CHECK_AS(InputError, std::isfinite(loss), "step ", pending_[i].step, ": loss is ", loss,
                  " (diverged; lower optimizer.lr or check the data)");
    result.losses.push_back(loss);
    result.grad_norms.push_back(norm_values[static_cast<int64_t>(i)].item<double>());
  }
  last.loss = result.losses.back();
  last.grad_norm = result.grad_norms.back();
  pending_.clear();
}

double Trainer::validate() {
  auto& model = *parallel_.parts.front();
  return validator_->run(
      [&](const at::Tensor& inputs, const at::Tensor& labels) {
        if (pipeline_) return pipeline_->eval_sum(inputs.to(device_), labels.to(device_));
        AutocastGuard autocast_guard(device_.type(), parallel_.autocast);
        return parallel_.loss(model.forward(inputs.to(device_)), labels.to(device_));
      },
      runtime_->group(distributed::MeshGroup::loss));
}

int Trainer::any_rank_stopping() {
  const int local = signals::shutdown_requested() ? signals::shutdown_signal() : 0;
  auto& world = runtime_->world_group();
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
      metrics::metrics_sinks(config_, runtime_->rank(), color));
  peak_ = metrics::peak_flops(device_, config_.metrics.peak_tflops);
  profiler_ = std::make_unique<metrics::StepProfiler>(config_, runtime_->rank(), device_);
  if (config_.metrics.step_breakdown) {
    breakdown_ = std::make_unique<metrics::StepBreakdown>(fmt::format(
        "{}/step_breakdown/rank{}.json", config_.job.dump_folder, runtime_->rank()));
  }
  log->info("training {} steps; peak {:.3g} TFLOP/s per device for MFU ({}{})", t.steps,
            peak_.flops / 1e12, peak_.source,
            peak_.estimate ? ": MFU is an estimate; set metrics.peak_tflops for a real one" : "");
  TrainResult result;
  const auto start = Clock::now();
  train_start_ = start;
  // Tokens this rank's data-parallel slice trains on per step; a model replica spans the
  // non-data-parallel ranks (tp x pp x cp), so tps, tflops and MFU count each replica once per
  // device by dividing by them (torchtitan's convention). tokens_seen counts the global batch.
  const int64_t tokens_per_step = accumulation_steps_ * t.local_batch_size * t.seq_len;
  const auto& dims = runtime_->dims();
  const int64_t non_data_parallel = dims.tp * dims.pp * dims.cp;
  const double device_tokens_per_step =
      static_cast<double>(tokens_per_step) / static_cast<double>(non_data_parallel);
  const int64_t global_tokens_per_step = tokens_per_step * runtime_->dp_size();
  double window_time = 0, window_data = 0, window_wait = 0;
  int64_t window_steps = 0;
  if (config_.checkpoint.create_seed_checkpoint) {
    if (on_started) on_started();
    checkpoint_->save_seed();
    log->info("seed checkpoint written to {}/step-0", checkpoint_->folder());
    return result;
  }
  const auto resume = checkpoint_->load();
  if (on_started) on_started();
  lr_step_offset_ = resume.step - resume.lr_step;
  if (resume.saved_config && runtime_->rank() == 0) {
    const auto change =
        describe_schedule_change(*resume.saved_config, config_, resume.lr_step, resume.step);
    if (change) log->warn("{}", *change);
  }
  elapsed_before_ = resume.elapsed_s;
  metrics_->start_run(run_start(config_, runtime_->dims(), resume, peak_));
  int64_t tokens_seen = resume.tokens_seen;
  uint64_t window_comm_start = runtime_->total_wire_bytes();
  for (int64_t step = resume.step + 1; step <= t.steps; ++step) {
    metrics::StepMetrics m;
    profiler_->step_begin(step);
    if (breakdown_) breakdown_->step_begin();
    const auto step_start = Clock::now();
    const double wait_start = distributed::comm_wait_seconds();
    pending_.emplace_back();
    try {
      window_data += train_step(step, pending_.back(), m);
    } catch (const c10::OutOfMemoryError& e) {
      profiler_->out_of_memory(step, e.what_without_backtrace());  // throws, naming a snapshot
    }
    window_time += seconds_since(step_start);
    window_wait += distributed::comm_wait_seconds() - wait_start;
    if (breakdown_) breakdown_->step_end();
    profiler_->step_end(step);
    ++window_steps;
    if (step == resume.step + 1) runtime_->use_train_timeout();
    result.steps_completed = step;
    tokens_seen += global_tokens_per_step;
    const int stop_signal = any_rank_stopping();
    const bool stopping = stop_signal != 0;
    // Losses are read (one host sync, one all-reduce) only when they are logged.
    if (is_log_step(step) || step == resume.step + 1 || stopping) {
      flush_pending(result, m);
      m.step = step;
      m.step_time_s = window_time / window_steps;
      m.tps = device_tokens_per_step / m.step_time_s;
      m.tflops = m.tps * summary_.flops_per_token / 1e12;
      m.mfu_pct = peak_.flops > 0 ? 100.0 * m.tps * summary_.flops_per_token / peak_.flops : 0.0;
      m.mfu_estimate = peak_.estimate;
      m.mem_peak_gib = metrics::peak_memory_gib(device_);
      m.data_time_pct = 100.0 * window_data / window_time;
      m.comm_wait_pct = 100.0 * window_wait / window_time;
      if (breakdown_) m.breakdown = breakdown_->take_window(step);
      m.tokens_seen = tokens_seen;
      m.elapsed_s = elapsed_s();
      m.since_start_s = metrics::seconds_since_process_start();
      m.data_skipped = source_->records_skipped();
      const uint64_t comm_now = runtime_->total_wire_bytes();
      m.comm_mb = static_cast<double>(comm_now - window_comm_start) / 1e6 / window_steps;
      metrics_->log_step(m);
      window_time = window_data = window_wait = 0;
      window_steps = 0;
      window_comm_start = comm_now;
    }
    if (validator_ && step % config_.validation.freq == 0) {
      metrics_->log_validation(step, validate(), tokens_seen, elapsed_s());
    }
    checkpoint_->on_step_end(step, tokens_seen, step == t.steps, stopping);
    if (stopping) {
      log->warn("stop requested (signal {} here, or on another rank): stopping after step {}",
                signals::shutdown_signal(), step);
      result.stopped_by_signal = true;
      result.stop_signal = stop_signal;
      break;
    }
  }
  checkpoint_->wait();
  metrics_->finish_run(result.stopped_by_signal ? "stopped" : "finished", result.steps_completed);
  result.peak_memory_gib = metrics::peak_memory_gib(device_);
  result.comm_wire_bytes = runtime_->total_wire_bytes();
  result.first_step = resume.step + 1;
  result.elapsed_s = seconds_since(start);
  log->info("{} in {:.1f} s ({:.2f} MB sent over the process groups by this rank); metrics in "
            "{}/metrics.jsonl",
            describe_steps_run(result, resume.step, t.steps), result.elapsed_s,
            static_cast<double>(result.comm_wire_bytes) / 1e6, config_.job.dump_folder);
  return result;
}

}  // namespace loom::train
