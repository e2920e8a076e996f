// The typed job config. Section and key names and defaults follow torchtitan's JobConfig (v0.2),
// so torchtitan TOML files load unchanged; docs/config.md lists every key with its meaning.
// Code reads these structs, never strings: config.training.steps, not lookup("training.steps").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::config {

using StringList = std::vector<std::string>;

struct JobSection {
  std::optional<std::string> config_file;
  std::string dump_folder = "./outputs";
  std::string description = "default job";
  bool print_config = false;
  std::optional<std::string> save_config_file;
  std::string custom_config_module;
};

struct ProfilingSection {
  bool enable_profiling = false;
  std::string save_traces_folder = "profile_traces";
  int64_t profile_freq = 10;
  int64_t profiler_active = 1;
  int64_t profiler_warmup = 3;
  bool enable_memory_snapshot = false;
  std::string save_memory_snapshot_folder = "memory_snapshot";
  // loom: the ranks that record profiler traces (torchtitan traces every rank).
  std::vector<int64_t> ranks{0};
};

struct MetricsSection {
  int64_t log_freq = 10;
  bool enable_tensorboard = false;
  bool disable_color_printing = false;
  std::string save_tb_folder = "tb";
  bool save_for_all_ranks = false;
  bool enable_wandb = false;
  // loom: log the gradient norm of each block ("grad_norm/layers.<i>", ...).
  bool log_layer_grad_norms = false;
  // loom: peak TFLOP/s of one device for MFU; unset means the GPU table or a measured CPU GEMM.
  std::optional<double> peak_tflops;
  // loom: time each step's operators by category (metrics/step_breakdown.h), CPU only.
  bool step_breakdown = false;
};

struct ModelSection {
  std::string name = "llama3";
  std::string flavor = "debugmodel";
  std::string hf_assets_path = "./tests/assets/tokenizer";
  std::optional<std::string> tokenizer_path;
  StringList converters;
  bool print_after_conversion = false;
  // Mixture-of-experts flavors: the flavor's balancing coefficients unless set.
  std::optional<double> moe_load_balance_coeff;
  std::optional<double> moe_aux_loss_coeff;
  // "causal", or "block_causal": a token of a packed row attends only within its document.
  std::string attn_mask_type = "causal";
  // Multi-token prediction (DeepSeek-V3): extra depths, the weight of their mean loss, and
  // DeepSeek's switch of that weight (0.3, then 0.1 from a step on; 0: no switch).
  int64_t num_mtp_layers = 0;
  double mtp_scale = 0.3;
  int64_t mtp_scale_switch_step = 0;
  double mtp_scale_after_switch = 0.1;
};

struct OptimizerSection {
  std::string name = "AdamW";
  double lr = 8e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  std::string implementation = "fused";
  bool early_step_in_backward = false;
  // Muon (optim/muon.h): 2-D hidden matrices; the other roles step with AdamW.
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int64_t muon_ns_steps = 5;
  std::string muon_ns_dtype = "bfloat16";
  double muon_eps = 1e-7;
  std::string muon_adjust_lr_fn = "original";
  // QK-clip (MuonClip, models/common/qk_clip.h), with any optimizer: 0 off; > 0 the largest
  // attention logit a head keeps after the step (tau); alpha: the query's share of the scale.
  double qk_clip_threshold = 0.0;
  double qk_clip_alpha = 0.5;
  // Per-role factors of lr and weight_decay (optim/registry.h), every optimizer.
  double embedding_lr_factor = 1.0;
  double head_lr_factor = 1.0;
  double routing_lr_factor = 1.0;
  double scalar_lr_factor = 1.0;
  double embedding_weight_decay_factor = 1.0;
  double head_weight_decay_factor = 1.0;
  double routing_weight_decay_factor = 1.0;
  double scalar_weight_decay_factor = 1.0;
};

struct LRSchedulerSection {
  int64_t warmup_steps = 200;
  std::optional<int64_t> total_steps;
  std::optional<double> decay_ratio;
  std::string decay_type = "linear";
  double min_lr_factor = 0.0;
};

struct DataLoaderSection {
  int64_t num_workers = 0;
  bool persistent_workers = false;
  bool pin_memory = false;
  std::optional<int64_t> prefetch_factor;
};

struct TrainingSection {
  std::string dataset = "c4_test";
  std::optional<std::string> dataset_path;
  // loom: the JSON field holding each record's text in .jsonl files (.txt files are plain text).
  std::string dataset_text_field = "text";
  int64_t local_batch_size = 8;
  int64_t global_batch_size = -1;
  int64_t seq_len = 2048;
  double max_norm = 1.0;
  // loom: how many steps in a row with a non-finite gradient norm may skip their update before
  // the run stops; 0 stops at the first (train/trainer.cpp).
  int64_t skip_nonfinite_steps = 0;
  int64_t steps = 10000;
  bool enable_cpu_offload = false;
  std::string dtype = "float32";
  std::string mixed_precision_param = "bfloat16";
  std::string mixed_precision_reduce = "float32";
  int64_t gc_freq = 50;
  bool gc_debug = false;
  // loom: "auto" (CUDA when available, else CPU), "cpu" or "cuda".
  std::string device = "auto";
  // loom: also autocast to mixed_precision_param on CPU (CPU trains in float32 by default).
  bool mixed_precision_on_cpu = false;
  // loom: loom's CUDA kernels instead of ATen's compositions (models/kernels/cuda.h).
  bool cuda_kernels = false;
  // loom: the whole training step as one CUDA graph, replayed each step (train/step_graph.h).
  bool cuda_graph = false;
  // loom: which fused attention kernel runs causal attention on CUDA (protocols/sdpa_choice.h).
  std::string sdpa_backend = "fastest";
  // loom: "error" stops at a bad dataset record; "skip" skips it and counts it in the metrics.
  std::string dataset_on_error = "error";
  // loom: the longest document (a JSONL line, a text file) a dataset may hold, in MiB.
  int64_t dataset_max_document_mib = 256;
  // loom: "SOURCE:WEIGHT" entries; when set, training reads this mixture instead of dataset.
  StringList dataset_mixture;
  DataLoaderSection dataloader;
};

struct ParallelismSection {
  int64_t data_parallel_replicate_degree = 1;
  int64_t data_parallel_shard_degree = -1;
  std::string fsdp_reshard_after_forward = "default";
  // loom: under gradient accumulation, reduce-scatter only on the last microbatch.
  bool fsdp_defer_gradient_sync = false;
  int64_t tensor_parallel_degree = 1;
  bool disable_loss_parallel = false;
  bool enable_async_tensor_parallel = false;
  int64_t pipeline_parallel_degree = 1;
  std::optional<std::vector<StringList>> module_fqns_per_model_part;
  int64_t pipeline_parallel_first_stage_less_layers = 1;
  int64_t pipeline_parallel_last_stage_less_layers = 1;
  std::optional<int64_t> pipeline_parallel_layers_per_stage;
  std::string pipeline_parallel_schedule = "1F1B";
  std::optional<std::string> pipeline_parallel_schedule_csv = std::string();
  int64_t pipeline_parallel_microbatch_size = 1;
  bool pipeline_parallel_expert_parallel_overlap = true;
  int64_t context_parallel_degree = 1;
  std::optional<std::string> context_parallel_load_balancer = std::string("headtail");
  std::string context_parallel_rotate_method = "allgather";
  int64_t expert_parallel_degree = 1;
  int64_t expert_tensor_parallel_degree = 1;
  std::string expert_parallel_comm_backend = "standard";
};

struct CheckpointSection {
  bool enable = false;
  bool enable_ft_dataloader_checkpoints = true;
  std::string folder = "checkpoint";
  int64_t interval = 500;
  std::optional<std::string> initial_load_path;
  bool initial_load_model_only = true;
  bool initial_load_in_hf = false;
  bool initial_load_in_hf_quantized = false;
  bool last_save_model_only = true;
  bool last_save_in_hf = false;
  std::string export_dtype = "float32";
  std::string async_mode = "disabled";
  int64_t keep_latest_k = 10;
  int64_t load_step = -1;
  StringList exclude_from_loading;
  bool enable_first_step_checkpoint = false;
  bool create_seed_checkpoint = false;
  bool load_only = false;
  // loom: the run stops after this many failed saves in a row (0: never).
  int64_t stop_after_failed_saves = 2;
};

struct ActivationCheckpointSection {
  std::string mode = "selective";
  std::string selective_ac_option = "2";
  StringList per_op_sac_force_recompute_mm_shapes_by_fqns = {"moe.router.gate"};
  bool early_stop = false;
  double memory_budget = 0.5;
  bool visualize_memory_budget_pareto = false;
  bool preserve_rng_state = false;
  std::string determinism_check = "default";
  bool debug = false;
};

struct CompileSection {
  bool enable = false;
  StringList components = {"model", "loss"};
  std::string backend = "inductor";
};

struct Float8LinearSection {
  bool enable_fsdp_float8_all_gather = false;
  bool precompute_float8_dynamic_scale_for_fsdp = false;
  std::optional<std::string> recipe_name;
  StringList filter_fqns;
  bool emulate = false;
  std::optional<bool> round_scales_to_power_of_2;  // unset: the recipe's default
};

struct MXLinearSection {
  std::string mxfp8_dim1_cast_kernel_choice = "triton";
  std::string recipe_name = "mxfp8_cublas";
  StringList filter_fqns = {"output"};
};

struct Float8GroupedMMSection {
  StringList fqns;
};

struct MXGroupedMMSection {
  std::string recipe_name = "mxfp8";
  StringList fqns;
};

struct QuantizeSection {
  struct {
    Float8LinearSection float8;
    MXLinearSection mx;
  } linear;
  struct {
    Float8GroupedMMSection float8;
    MXGroupedMMSection mx;
  } grouped_mm;
};

struct CommSection {
  int64_t init_timeout_seconds = 300;
  int64_t train_timeout_seconds = 100;
  int64_t trace_buf_size = 20000;
  std::string save_traces_folder = "comm_traces";
  std::string save_traces_file_prefix = "rank_";
  std::string mode = "default";
};

struct MemoryEstimationSection {
  bool enable = false;
  bool disable_fake_mode = false;
};

struct FaultToleranceSection {
  bool enable = false;
  std::string process_group = "gloo";
  int64_t process_group_timeout_ms = 10000;
  int64_t replica_id = 0;
  int64_t group_size = 0;
  int64_t min_replica_size = 1;
  std::optional<std::string> semi_sync_method;  // local_sgd | diloco
  int64_t sync_steps = 5;
  double outer_lr = 0.7;        // loom: DiLoCo's outer Nesterov SGD (the paper's values)
  double outer_momentum = 0.9;  // loom
};

struct ExperimentalSection {
  std::string custom_import;
  std::string custom_args_module;
};

struct ValidationSection {
  bool enable = false;
  std::string dataset = "c4_validation";
  std::optional<std::string> dataset_path;
  std::string dataset_text_field = "text";  // loom: as training.dataset_text_field
  int64_t local_batch_size = 8;
  int64_t seq_len = 2048;
  int64_t freq = 10;
  int64_t steps = -1;
  // loom: "SOURCE:WEIGHT" entries; when set, validation reads this mixture instead of dataset.
  StringList dataset_mixture;
  DataLoaderSection dataloader;
};

struct DebugSection {
  std::optional<int64_t> seed;
  bool deterministic = false;
  bool deterministic_warn_only = false;
  bool moe_force_load_balance = false;
  // loom: FSDP even when data_parallel_shard_degree is 1 (one-rank shard groups).
  bool force_fsdp = false;
  // loom: training.cuda_graph's path on CPU, the recorded step replayed eagerly (for tests).
  bool cuda_graph_on_cpu = false;
  // loom: a capacity for CPU tensors per process in GiB (0: none), the CPU's stand-in for a
  // device's memory (core/cpu_memory_limit.h).
  double cpu_memory_limit_gib = 0;
  // loom: at these steps rank 0 writes a NaN into its first gradient (tests of
  // training.skip_nonfinite_steps).
  std::vector<int64_t> nonfinite_gradient_steps;
};

struct JobConfig {
  JobSection job;
  ProfilingSection profiling;
  MetricsSection metrics;
  ModelSection model;
  OptimizerSection optimizer;
  LRSchedulerSection lr_scheduler;
  TrainingSection training;
  ParallelismSection parallelism;
  CheckpointSection checkpoint;
  ActivationCheckpointSection activation_checkpoint;
  CompileSection compile;
  QuantizeSection quantize;
  CommSection comm;
  MemoryEstimationSection memory_estimation;
  FaultToleranceSection fault_tolerance;
  ExperimentalSection experimental;
  ValidationSection validation;
  DebugSection debug;
};

}  // namespace loom::config
