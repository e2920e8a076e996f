// build_run: the phases of a job before its first step (run.h), in DESIGN.md's order.
#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <random>

#include "loom/checkpoint/manager.h"
#include "loom/checkpoint/resume_batch.h"
#include "loom/config/dataset_mixture.h"
#include "loom/core/check.h"
#include "loom/core/cpu_memory_limit.h"
#include "loom/core/device.h"
#include "loom/core/host_allocator.h"
#include "loom/core/logging.h"
#include "loom/core/strings.h"
#include "loom/data/mixture.h"
#include "loom/data/packed_loader.h"
#include "loom/data/prefetch.h"
#include "loom/data/streaming_loader.h"
#include "loom/data/synthetic.h"
#include "loom/launch/world_info.h"
#include "loom/models/kernels/cuda.h"
#include "loom/optim/registry.h"
#include "loom/parallel/parallelize.h"
#include "loom/parallel/pipeline/model_parts.h"
#include "loom/parallel/pipeline/simulate.h"
#include "loom/plan/device_profile.h"
#include "loom/plan/layout.h"
#include "loom/plan/memory_model.h"
#include "loom/plan/model_shape.h"
#include "loom/protocols/sdpa_choice.h"
#include "loom/quantize/convert.h"
#include "loom/train/mixed_precision.h"
#include "loom/train/preflight.h"
#include "loom/train/replica_step_hook.h"
#include "loom/train/run.h"
#include "loom/train/threads.h"

namespace loom::train {
namespace {

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
  options.bos_id = tokenizer->bos_id();  // batches carry their documents (block_causal)
  if (!mixture.empty()) {
    const std::string key = section + ".dataset_mixture";
    std::vector<data::MixtureComponent> components;
    for (const auto& entry : config::parse_dataset_mixture(mixture, key)) {
      components.push_back({entry.source, entry.weight});
    }
    return data::open_mixture(components, *tokenizer, options, key);
  }
  return data::open_dataset_source(name, path, *tokenizer, options, section + ".dataset");
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

// debug.seed when set; else the checkpoint's (the seed of the run it resumes, so its data order
// goes on); else a draw of the first rank's, the same on every rank. It becomes the run's
// debug.seed, which its checkpoints record. Returns what the log says of its origin.
const char* resolve_seed(config::JobConfig& c, distributed::Comm& world) {
  if (c.debug.seed) return "";
  const char* origin = " (the checkpoint's: debug.seed is unset)";
  auto seed = checkpoint::resumable_seed(c);
  if (!seed) {
    origin = " (drawn: debug.seed is unset; the checkpoints record it)";
    seed = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
  }
  at::Tensor agreed = at::full({1}, *seed, at::kLong);
  if (world.size() > 1) world.broadcast(agreed, 0);
  c.debug.seed = agreed.item<int64_t>();
  return origin;
}

// Ranks, mesh and groups; the seed; the gradient accumulation that keeps the global batch.
void setup_runtime(Run& run) {
  auto log = log::get("trainer");
  const bool cuda = run.device.is_cuda();
  run.runtime = std::make_unique<distributed::ParallelRuntime>(
      run.config, distributed::read_world_info(), cuda);
  if (run.device.is_cpu()) check_thread_plan(run.runtime->world().local_world_size);
  log->info("host memory: {}{}", describe_host_allocator(),
            in_own_heap_arena() ? "; the training thread allocates from an arena of its own" : "");
  auto& c = run.config;
  const char* seed_origin = resolve_seed(c, run.runtime->world_group());
  run.seed = static_cast<uint64_t>(*c.debug.seed);
  at::manual_seed(run.seed);
  if (c.debug.deterministic) {
    at::globalContext().setDeterministicAlgorithms(true, c.debug.deterministic_warn_only);
  }
  const auto& t = c.training;
  // Fault-tolerant replica groups share the global batch: each trains 1 / group_size of it.
  const auto& ft = c.fault_tolerance;
  const int64_t dp = run.runtime->dp_size() * (ft.enable ? ft.group_size : 1);
  // Elastic resume: an unset global batch keeps the checkpoint's on a new world size.
  const int64_t global = checkpoint::resolve_global_batch(c, dp);
  if (global != t.global_batch_size && global != t.local_batch_size * dp) {
    c.training.global_batch_size = global;  // what this run's checkpoints record
  }
  run.accumulation_steps = global / (t.local_batch_size * dp);
  const auto compute = autocast_dtype(t, run.device);
  log->info(
      "device {}, parameters {}, compute {}, seed {}{}, gradient accumulation {} x local batch {}",
      run.device.str(), t.dtype, compute ? std::string(c10::toString(*compute)) : t.dtype, run.seed,
      seed_origin, run.accumulation_steps, t.local_batch_size);
  models::kernels::set_cuda_kernels_enabled(t.cuda_kernels);
  // A measured choice may differ from run to run; a deterministic job takes LibTorch's order.
  const bool deterministic_order = t.sdpa_backend == "fastest" && c.debug.deterministic;
  models::set_sdpa_policy(deterministic_order ? "libtorch" : t.sdpa_backend);
  if (cuda) {
    log->info("causal attention on CUDA: training.sdpa_backend = {}{}", models::sdpa_policy(),
              deterministic_order ? " (fastest, but debug.deterministic)" : "");
    const int index = run.device.has_index() ? run.device.index() : 0;
    const bool missing = t.cuda_kernels && !models::kernels::kernels_run_on(index);
    log->log(missing ? spdlog::level::warn : spdlog::level::info, "CUDA kernels: {}",
             models::kernels::cuda_kernels_status(index));
  }
}

// This rank's share: its pipeline stages, split over FSDP's shards and the tp ranks, with the
// activations of as many microbatches as its schedule keeps alive.
// The device profile of the device a run trains on: the cpu profile, or the GPU's model
// (configs/devices), so the start-up estimate is what `loom plan memory --device NAME` prints.
std::string device_profile_name(const at::Device& device) {
  if (!device.is_cuda()) return "cpu";
  const auto info = device::query_accelerators();
  const size_t index = device.has_index() ? static_cast<size_t>(device.index()) : 0;
  const std::string gpu = index < info.device_names.size() ? info.device_names[index] : "";
  for (const char* known : {"H200", "H100", "B200", "A100"}) {
    if (gpu.find(known) != std::string::npos) {
      std::string name = known;
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      return name;
    }
  }
  return "h100";
}

// One memory model: the planner's (plan/memory_model.h) for this job's layout on this device,
// so the start-up line and `loom plan memory` cannot disagree.
void log_planned_memory(const Run& run) {
  const auto& config = run.config;
  const std::string profile_name = device_profile_name(run.device);
  const plan::DeviceProfile profile = plan::load_device_profile(profile_name);
  // run.summary (the whole model with the run's vocabulary): no third meta build at start-up.
  const plan::ModelShape shape = plan::model_shape_of(config, run.summary);
  const plan::Layout layout = plan::layout_of(config, run.runtime->dims().world_size);
  const plan::MemoryPlan memory = plan::predict_memory(shape, config, layout, profile);
  std::string parts;
  for (const auto& c : memory.components) {
    if (c.bytes <= 0) continue;
    parts += fmt::format("{}{} {:.3f}", parts.empty() ? "" : " + ", c.name, c.bytes / 1073741824.0);
  }
  log::get("trainer")->info(
      "estimated peak memory per rank: {:.3f} GiB = {} GiB of tensors + runtime {:.3f} GiB "
      "(loom plan memory --device {}; {})",
      memory.peak_bytes / 1073741824.0, parts, memory.runtime_bytes / 1073741824.0, profile_name,
      layout.describe());
}

// Built on the meta device (the whole model, or this rank's pipeline stages under their global
// names), then parallelized and materialized by the family's parallelize function (TP ->
// activation checkpointing -> FSDP/HSDP or DDP); the optimizer over the local parameters.
void build_model(Run& run, const std::optional<parallel::pipeline::PipelinePlan>& plan) {
  const auto& config = run.config;
  // The embedding table matches the tokenizer (synthetic data keeps the flavor's vocabulary).
  const int64_t vocab = run.tokenizer ? run.tokenizer->vocab_size() : 0;
  const auto meta = at::TensorOptions().device(at::kMeta).dtype(parameter_dtype(config.training));
  run.spec = &models::job_model_spec(config);
  run.summary = models::build_model(config, vocab, meta)->summary(config.training.seq_len);
  parallel::ParallelContext context{config,
                                    *run.runtime,
                                    run.device,
                                    run.seed,
                                    parameter_dtype(config.training),
                                    autocast_dtype(config.training, run.device)};
  std::vector<std::unique_ptr<models::CausalLM>> parts;
  if (plan) {
    const auto pp_rank =
        run.runtime->mesh().group_rank(distributed::MeshGroup::pp, run.runtime->rank());
    for (const auto& part : plan->split.parts_of_rank(static_cast<int>(pp_rank))) {
      parts.push_back(
          models::build_model(config, vocab, meta, parallel::pipeline::to_model_part(part)));
    }
  } else {
    parts.push_back(models::build_model(config, vocab, meta));
  }
  // model.converters (float8 linears), before the parallelisms wrap the parts.
  const bool tp = run.runtime->dims().tp > 1;
  run.converters = quantize::apply_converters(
      parts, config, run.device, tp ? &run.runtime->group(distributed::MeshGroup::tp) : nullptr,
      parallel::uses_fsdp(run.runtime->dims(), config));
  run.model = run.spec->parallelize(std::move(parts), context);
  run.local_tensors = run.model.tensors();
  run.placements = run.model.placements();
  run.optimizer = optim::build_optimizer(config.optimizer, run.model.parameters);
  run.schedule = LRSchedule::of_job(config);
  auto log = log::get("trainer");
  log->info("model {}", models::format_summary(run.summary, false));
  log->info("parallelism: {}; gradient sync: {}", run.runtime->dims().layout(),
            run.model.description);
  log_planned_memory(run);
}

void build_data(Run& run, std::unique_ptr<data::BatchSource> source,
                std::unique_ptr<data::BatchSource> validation_source) {
  const auto& config = run.config;
  const auto& t = config.training;
  const auto& v = config.validation;
  const bool skip_bad = t.dataset_on_error == "skip";
  const int64_t vocab = run.model.parts.front()->vocab_size();
  const int64_t dp_rank = run.runtime->dp_rank(), dp_size = run.runtime->dp_size();
  // Fault-tolerant replica groups read disjoint slices: group r is data-parallel ranks
  // r * dp .. (r + 1) * dp - 1 of group_size * dp (what an HSDP job of the same global batch
  // reads). Validation stays per group (every group measures the same data).
  const auto& ft = config.fault_tolerance;
  const int64_t train_dp_rank = ft.enable ? ft.replica_id * dp_size + dp_rank : dp_rank;
  const int64_t train_dp_size = ft.enable ? ft.group_size * dp_size : dp_size;
  // Field by field: in declaration order, the document cap once filled bos_id's place and the cap
  // became -1 (every line past the reader's 64 KiB buffer refused).
  auto loader_options = [&](int64_t seq_len, uint64_t seed, bool shuffle, int64_t rank,
                            int64_t world, const std::string& text_field) {
    data::PackedLoaderOptions o;
    o.seq_len = seq_len;
    o.seed = seed;
    o.shuffle = shuffle;
    o.dp_rank = rank;
    o.dp_world = world;
    o.skip_bad_records = skip_bad;
    o.text_field = text_field;
    o.max_document_bytes = t.dataset_max_document_mib << 20;
    return o;
  };
  auto train_source =
      source
          ? std::move(source)
          : dataset_source(t.dataset, t.dataset_path, t.dataset_mixture, run.tokenizer.get(), vocab,
                           loader_options(t.seq_len, run.seed, true, train_dp_rank, train_dp_size,
                                          t.dataset_text_field),
                           "training");
  // A background thread keeps the next two microbatches ready.
  run.source = std::make_unique<data::PrefetchingSource>(std::move(train_source),
                                                         t.local_batch_size, t.seq_len, 2);
  if (!v.enable) return;
  if (!validation_source) warn_builtin_validation(config);
  auto validation =
      validation_source
          ? std::move(validation_source)
          : dataset_source(v.dataset, v.dataset_path, v.dataset_mixture, run.tokenizer.get(), vocab,
                           loader_options(v.seq_len, run.seed + 1, false, dp_rank, dp_size,
                                          v.dataset_text_field),
                           "validation");
  LOOM_CHECK_AS(InputError, v.steps > 0 || validation->samples_per_epoch(),
                "validation.steps = -1 (the whole set) needs a finite validation dataset; set a "
                "step count for '",
                v.dataset, "'");
  run.validator = std::make_unique<Validator>(
      std::move(validation),
      ValidationOptions{v.steps, v.local_batch_size, v.seq_len, dp_rank, dp_size});
}

// What a checkpoint holds of this rank: its local parameters with their placements (any layout
// loads them; replicas split the writing) and the optimizer's and data loader's state.
void build_checkpointer(Run& run, std::function<double()> elapsed_s) {
  checkpoint::CheckpointTargets targets;
  targets.parameters = run.model.parameters;
  targets.buffers = run.model.buffers;
  targets.optimizer = run.optimizer.get();
  targets.data = run.source.get();
  targets.side_states = run.step_hook->checkpoint_side_states();
  targets.elapsed_s = std::move(elapsed_s);
  run.checkpoint =
      std::make_unique<checkpoint::CheckpointManager>(run.config, *run.runtime, std::move(targets));
}

}  // namespace

Run::Run() = default;
Run::~Run() = default;

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

std::unique_ptr<Run> build_run(config::JobConfig config, std::unique_ptr<data::BatchSource> source,
                               std::unique_ptr<data::BatchSource> validation_source,
                               std::function<double()> elapsed_s) {
  auto run = std::make_unique<Run>();
  run->config = std::move(config);
  // Everything this job asks that loom cannot do, all at once and before any rendezvous: every
  // rank refuses alike (the same checks `loom config validate` runs).
  const auto world = distributed::read_world_info();
  run->device =
      device::resolve_device(run->config.training.device, world.local_rank, "training.device");
  Preflight checked = preflight(run->config, {world.world_size, run->device, source == nullptr});
  throw_if_refused(checked.problems, "loom train cannot start this job");
  if (!checked.warnings.empty()) {
    log::get("config")->warn("set but without effect in this job: {}",
                             strings::join(checked.warnings, "; "));
  }
  if (const double gib = run->config.debug.cpu_memory_limit_gib; gib > 0) {
    LOOM_CHECK_AS(InputError, run->device.is_cpu(), "debug.cpu_memory_limit_gib = ", gib,
                  " applies to CPU jobs; this job trains on ", run->device.str());
    limit_cpu_tensor_memory(static_cast<uint64_t>(gib * (1ull << 30)),
                            "debug.cpu_memory_limit_gib");
  }
  run->tokenizer = std::move(checked.tokenizer);
  std::optional<parallel::pipeline::PipelinePlan> plan;
  if (run->config.parallelism.pipeline_parallel_degree > 1) {
    plan = models::plan_pipeline(run->config);
  }
  setup_runtime(*run);
  if (run->config.fault_tolerance.enable) {
    // Before the model: the group beats (and so counts as alive) while it builds.
    const auto& comm = run->config.comm;
    run->step_hook = replica_step_hook(
        std::make_unique<ReplicaManager>(
            run->config.fault_tolerance, run->runtime->world_group_ptr(),
            lighthouse_address_from_env(), world.restart_count,
            std::chrono::milliseconds(
                std::min(comm.init_timeout_seconds, comm.train_timeout_seconds) * 800)),
        *run);
  } else {
    run->step_hook = std::make_unique<StepHook>();
  }
  build_model(*run, plan);
  run->steps = make_step_runner(run->model, plan, *run->runtime, run->device, run->config);
  build_data(*run, std::move(source), std::move(validation_source));
  build_checkpointer(*run, std::move(elapsed_s));
  return run;
}

}  // namespace loom::train
