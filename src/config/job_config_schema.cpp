// Every job config key: name, type (from the struct member), doc, bounds and choices.
// Keys marked unimplemented() exist for torchtitan compatibility; setting one logs a warning.
#include "loom/config/schema.h"
#include "schema_builder.h"

namespace loom::config {
namespace {

using detail::SectionBuilder;

void add_job_sections(Schema& s) {
  SectionBuilder<JobSection> job(s, "job", "The run itself: where its outputs go.",
                                 [](JobConfig& c) -> JobSection& { return c.job; });
  job.field("config_file", &JobSection::config_file,
            "TOML or JSON file the config was read from (same as --config).");
  job.field(
      "dump_folder", &JobSection::dump_folder,
      "Folder for everything the run writes: config.toml, metrics.jsonl, checkpoints, traces.");
  job.field("description", &JobSection::description, "Free text describing the run.");
  job.field("print_config", &JobSection::print_config,
            "Log the effective config when training starts.");
  job.field("save_config_file", &JobSection::save_config_file,
            "Also write the effective config as JSON to <dump_folder>/<this name>.");
  job.field("custom_config_module", &JobSection::custom_config_module,
            "Python module extending torchtitan's config.")
      .unimplemented();

  SectionBuilder<ProfilingSection> prof(
      s, "profiling", "Profiler traces and memory snapshots.",
      [](JobConfig& c) -> ProfilingSection& { return c.profiling; });
  prof.field("enable_profiling", &ProfilingSection::enable_profiling,
             "Record Kineto profiler traces (Chrome/Perfetto JSON, CPU and CUDA activity).");
  prof.field("save_traces_folder", &ProfilingSection::save_traces_folder,
             "Trace folder, `iteration_<step>/rank<r>_trace.json` in it. Relative: under "
             "dump_folder (no \"..\"); absolute: as given.");
  prof.field("profile_freq", &ProfilingSection::profile_freq,
             "Record one profiling cycle every this many steps (ends at multiples of it).")
      .min(1);
  prof.field("profiler_active", &ProfilingSection::profiler_active,
             "Steps recorded per profiling cycle.")
      .min(1);
  prof.field("profiler_warmup", &ProfilingSection::profiler_warmup,
             "Warm-up steps before the recorded ones in each cycle.")
      .min(0);
  prof.field("ranks", &ProfilingSection::ranks, "loom: the ranks that record profiler traces.")
      .min(0);
  prof.field("enable_memory_snapshot", &ProfilingSection::enable_memory_snapshot,
             "CUDA: record allocator history and dump snapshots (PyTorch memory_viz pickle) at "
             "the end of each profiling cycle and on out-of-memory; a note on CPU.");
  prof.field("save_memory_snapshot_folder", &ProfilingSection::save_memory_snapshot_folder,
             "Memory snapshot folder under dump_folder.");

  SectionBuilder<MetricsSection> met(s, "metrics", "Console and metrics.jsonl logging.",
                                     [](JobConfig& c) -> MetricsSection& { return c.metrics; });
  met.field("log_freq", &MetricsSection::log_freq, "Log metrics every this many steps.").min(1);
  met.field("enable_tensorboard", &MetricsSection::enable_tensorboard,
            "Also write every metrics.jsonl scalar to TensorBoard event files.");
  met.field("disable_color_printing", &MetricsSection::disable_color_printing,
            "Plain console lines without ANSI colors.");
  met.field("save_tb_folder", &MetricsSection::save_tb_folder,
            "TensorBoard folder. Relative: under dump_folder (no \"..\"); absolute: as given.");
  met.field("save_for_all_ranks", &MetricsSection::save_for_all_ranks,
            "TensorBoard files from every rank (`<save_tb_folder>/rank_<r>`), not only rank 0.");
  met.field("peak_tflops", &MetricsSection::peak_tflops,
            "loom: peak TFLOP/s of one device for MFU; unset: a table of GPUs (bf16 dense), or on "
            "CPU a float32 GEMM measured at start.")
      .min(0);
  met.field(
      "log_layer_grad_norms", &MetricsSection::log_layer_grad_norms,
      "loom: also log each block's gradient norm (`grad_norm/layers.<i>`, `grad_norm/output`, ...) "
      "before clipping, to find the layer behind a loss spike.");
  met.field("step_breakdown", &MetricsSection::step_breakdown,
            "loom: split each logged step's time into gemm, attention, elementwise, optimizer, "
            "comm_wait, data and other (`breakdown/<category>_ms`, `breakdown/overhead_pct`), "
            "timed per operator on the training thread; CPU only (on CUDA use "
            "profiling.enable_profiling).");
  met.field("enable_wandb", &MetricsSection::enable_wandb, "Send metrics to Weights & Biases.")
      .unimplemented();
}

void add_model_sections(Schema& s) {
  SectionBuilder<ModelSection> model(s, "model", "Which model to train.",
                                     [](JobConfig& c) -> ModelSection& { return c.model; });
  model.field("name", &ModelSection::name,
              "Model family in the model registry: llama3, qwen3, qwen3_moe or deepseek_v3 (`loom "
              "plan model` "
              "names the registered ones).");
  model.field("flavor", &ModelSection::flavor,
              "Size of the model family (llama3: debugmodel, 100M, 8B, 8B_4layers, 70B, 405B; "
              "qwen3: debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B, and as torchtitan the mixture-of-experts "
              "debugmodel_moe, 30B-A3B, 235B-A22B, also named qwen3_moe; deepseek_v3: debugmodel, "
              "16B, 236B, 671B).");
  model.field("hf_assets_path", &ModelSection::hf_assets_path,
              "Folder with Hugging Face assets: tokenizer files, config.json, safetensors.");
  model.field(
      "tokenizer_path", &ModelSection::tokenizer_path,
      "Tokenizer file; when unset: hf_assets_path/tokenizer.json (an error when hf_assets_path was "
      "set and has none; the byte tokenizer when the default folder does not exist).");
  model.field("converters", &ModelSection::converters,
              "Model converters applied after building: float8 (also spelled "
              "quantize.linear.float8) makes the linear layers float8 as "
              "[quantize.linear.float8] says; quantize.grouped_mm.float8 the MoE experts' "
              "grouped GEMMs (docs/float8.md).");
  model
      .field("print_after_conversion", &ModelSection::print_after_conversion,
             "Print the model after converters ran.")
      .unimplemented();
  model
      .field("moe_load_balance_coeff", &ModelSection::moe_load_balance_coeff,
             "Mixture-of-experts flavors: the step of DeepSeek-V3's auxiliary-loss-free "
             "balancing bias after each optimizer step (0: off); unset: the flavor's (qwen3_moe, "
             "deepseek_v3: "
             "1e-3).")
      .min(0);
  model
      .field("attn_mask_type", &ModelSection::attn_mask_type,
             "Attention mask of packed rows: causal (a token sees every earlier token of its row) "
             "or block_causal (only the earlier tokens of its own document, RoPE positions "
             "restarting at each document's BOS; torchtitan's key).")
      .choices({"causal", "block_causal"});
  model
      .field("moe_aux_loss_coeff", &ModelSection::moe_aux_loss_coeff,
             "Mixture-of-experts flavors: the weight of the load-balancing auxiliary loss "
             "(Megatron's moe_aux_loss_coeff; 0: off); unset: the flavor's (qwen3_moe: 0).")
      .min(0);

  SectionBuilder<OptimizerSection> opt(
      s, "optimizer", "The optimizer.",
      [](JobConfig& c) -> OptimizerSection& { return c.optimizer; });
  opt.field("name", &OptimizerSection::name,
            "Optimizer: AdamW, Adam or Muon (Muon on 2-D hidden matrices, AdamW on the rest; "
            "docs/optimizers.md).")
      .choices({"AdamW", "Adam", "Muon"});
  opt.field("lr", &OptimizerSection::lr, "Peak learning rate.").min(0);
  opt.field("beta1", &OptimizerSection::beta1, "First-moment decay.").range(0, 1);
  opt.field("beta2", &OptimizerSection::beta2, "Second-moment decay.").range(0, 1);
  opt.field("eps", &OptimizerSection::eps, "Term added to the denominator for stability.").min(0);
  opt.field("weight_decay", &OptimizerSection::weight_decay, "Decoupled weight decay.").min(0);
  opt.field("implementation", &OptimizerSection::implementation,
            "PyTorch optimizer kernel style; loom has one fused-per-tensor implementation.")
      .choices({"for-loop", "foreach", "fused"})
      .unimplemented();
  opt.field("early_step_in_backward", &OptimizerSection::early_step_in_backward,
            "Step each parameter during backward to save memory.")
      .unimplemented();
  opt.field("muon_momentum", &OptimizerSection::muon_momentum,
            "Muon: momentum of the gradient average (torch.optim.Muon's momentum).")
      .range(0, 1);
  opt.field("muon_nesterov", &OptimizerSection::muon_nesterov, "Muon: Nesterov momentum.");
  opt.field("muon_ns_steps", &OptimizerSection::muon_ns_steps,
            "Muon: Newton-Schulz iterations (quintic coefficients 3.4445, -4.7750, 2.0315).")
      .range(1, 99);
  opt.field("muon_ns_dtype", &OptimizerSection::muon_ns_dtype,
            "Muon: dtype of the Newton-Schulz iteration (torch.optim.Muon: bfloat16).")
      .choices({"bfloat16", "float32"});
  opt.field("muon_eps", &OptimizerSection::muon_eps,
            "Muon: floor of the Frobenius norm the update is divided by.")
      .min(0);
  opt.field("muon_adjust_lr_fn", &OptimizerSection::muon_adjust_lr_fn,
            "Muon: lr per matrix of m x n: original = lr sqrt(max(1, m/n)); match_rms_adamw = "
            "lr 0.2 sqrt(max(m, n)) (Moonlight: reuses AdamW's lr and weight decay).")
      .choices({"original", "match_rms_adamw"});
  opt.field("embedding_lr_factor", &OptimizerSection::embedding_lr_factor,
            "lr multiplier of the token embedding's group.")
      .min(0);
  opt.field("head_lr_factor", &OptimizerSection::head_lr_factor,
            "lr multiplier of the output projection's group.")
      .min(0);
  opt.field("routing_lr_factor", &OptimizerSection::routing_lr_factor,
            "lr multiplier of the mixture-of-experts routers' group.")
      .min(0);
  opt.field("scalar_lr_factor", &OptimizerSection::scalar_lr_factor,
            "lr multiplier of the group of norms, biases and other parameters under 2-D.")
      .min(0);
  opt.field("embedding_weight_decay_factor", &OptimizerSection::embedding_weight_decay_factor,
            "weight_decay multiplier of the token embedding's group.")
      .min(0);
  opt.field("head_weight_decay_factor", &OptimizerSection::head_weight_decay_factor,
            "weight_decay multiplier of the output projection's group.")
      .min(0);
  opt.field("routing_weight_decay_factor", &OptimizerSection::routing_weight_decay_factor,
            "weight_decay multiplier of the routers' group.")
      .min(0);
  opt.field("scalar_weight_decay_factor", &OptimizerSection::scalar_weight_decay_factor,
            "weight_decay multiplier of the group of norms, biases and scalars.")
      .min(0);

  SectionBuilder<LRSchedulerSection> lr(
      s, "lr_scheduler", "Learning-rate schedule: linear warmup, then warmup-stable-decay.",
      [](JobConfig& c) -> LRSchedulerSection& { return c.lr_scheduler; });
  lr.field("warmup_steps", &LRSchedulerSection::warmup_steps,
           "Steps of linear warmup from near 0 to optimizer.lr.")
      .min(0);
  lr.field("total_steps", &LRSchedulerSection::total_steps,
           "Length of the schedule; unset means training.steps.")
      .min(1);
  lr.field("decay_ratio", &LRSchedulerSection::decay_ratio,
           "Fraction of the steps spent decaying at the end; unset means decay right after warmup.")
      .range(0, 1);
  lr.field("decay_type", &LRSchedulerSection::decay_type, "Shape of the decay.")
      .choices({"linear", "sqrt", "cosine"});
  lr.field("min_lr_factor", &LRSchedulerSection::min_lr_factor,
           "Lowest learning rate as a fraction of optimizer.lr.")
      .range(0, 1);
}

void add_dataloader_fields(SectionBuilder<DataLoaderSection>& dl) {
  dl.field("num_workers", &DataLoaderSection::num_workers,
           "PyTorch DataLoader workers; loom prefetches on its own thread.")
      .min(0)
      .unimplemented();
  dl.field("persistent_workers", &DataLoaderSection::persistent_workers,
           "Keep DataLoader workers alive.")
      .unimplemented();
  dl.field("pin_memory", &DataLoaderSection::pin_memory, "Pin batches in host memory.")
      .unimplemented();
  dl.field("prefetch_factor", &DataLoaderSection::prefetch_factor, "Batches prefetched per worker.")
      .min(1)
      .unimplemented();
}

void add_training_sections(Schema& s) {
  SectionBuilder<TrainingSection> tr(s, "training", "Data, batch, steps, precision.",
                                     [](JobConfig& c) -> TrainingSection& { return c.training; });
  tr.field("dataset", &TrainingSection::dataset,
           "Dataset name (a registered dataset, or a label when dataset_path is set).");
  tr.field("dataset_text_field", &TrainingSection::dataset_text_field,
           "loom: the JSON field (.jsonl) or Parquet/Arrow column holding each record's text.");
  tr.field("dataset_path", &TrainingSection::dataset_path,
           "Path of the dataset files: .jsonl/.txt (plain, .gz, .zst), .parquet, .arrow, a "
           "datasets save_to_disk folder, a folder or glob of them, or prepare-data shards.");
  tr.field("local_batch_size", &TrainingSection::local_batch_size,
           "Samples per data-parallel rank in one microbatch.")
      .min(1);
  tr.field("global_batch_size", &TrainingSection::global_batch_size,
           "Samples per optimizer step over all ranks; -1 means local_batch_size x data-parallel "
           "degree; a larger multiple accumulates gradients.")
      .min(1)
      .sentinel(-1);
  tr.field("seq_len", &TrainingSection::seq_len, "Tokens per sample.").min(1);
  tr.field("max_norm", &TrainingSection::max_norm, "Clip gradients to this global L2 norm.").min(0);
  tr.field("steps", &TrainingSection::steps, "Optimizer steps to train.").min(1);
  tr.field("enable_cpu_offload", &TrainingSection::enable_cpu_offload,
           "Keep FSDP parameters, gradients and optimizer state in CPU memory.")
      .unimplemented();
  tr.field("dtype", &TrainingSection::dtype,
           "Storage dtype of parameters, gradients and optimizer state.")
      .choices({"bfloat16", "float32"});
  tr.field("mixed_precision_param", &TrainingSection::mixed_precision_param,
           "Compute (and FSDP all-gather) dtype under mixed precision.")
      .choices({"bfloat16", "float32"});
  tr.field("mixed_precision_reduce", &TrainingSection::mixed_precision_reduce,
           "Dtype of gradient reductions.")
      .choices({"float32"});
  tr.field("gc_freq", &TrainingSection::gc_freq,
           "Python garbage collection interval; nothing to collect in C++.")
      .min(1)
      .unimplemented();
  tr.field("gc_debug", &TrainingSection::gc_debug, "Python garbage collection debugging.")
      .unimplemented();
  tr.field("device", &TrainingSection::device,
           "loom: where to train: auto (CUDA when available, else CPU), cpu or cuda.")
      .choices({"auto", "cpu", "cuda"});
  tr.field("mixed_precision_on_cpu", &TrainingSection::mixed_precision_on_cpu,
           "loom: compute in mixed_precision_param on CPU too (autocast; under FSDP, the "
           "all-gather dtype); CPU runs train in float32 otherwise (on CUDA, "
           "mixed_precision_param always applies).");
  tr.field("dataset_on_error", &TrainingSection::dataset_on_error,
           "loom: a bad dataset record (invalid JSON, no text field, invalid UTF-8) stops the job "
           "with its file and line (error) or is skipped and counted in metrics.jsonl as "
           "data_skipped (skip).")
      .choices({"error", "skip"});
  tr.field("dataset_max_document_mib", &TrainingSection::dataset_max_document_mib,
           "loom: the longest document (a JSONL line, a text file) training and validation "
           "datasets may hold, in MiB; a longer one (a compressed file expanding to one huge "
           "line) stops the job naming the file.")
      .min(1)
      .max(int64_t{1} << 20);
  tr.field("dataset_mixture", &TrainingSection::dataset_mixture,
           "loom: a weighted mixture of datasets, read instead of dataset: \"SOURCE:WEIGHT\" "
           "entries, SOURCE a built-in dataset (brown) or a path (text files, folder, glob, or "
           "a folder written by loom prepare-data), WEIGHT a positive relative weight.");
  SectionBuilder<DataLoaderSection> dl(
      s, "training.dataloader", "PyTorch DataLoader settings (Python only).",
      [](JobConfig& c) -> DataLoaderSection& { return c.training.dataloader; });
  add_dataloader_fields(dl);

  SectionBuilder<ValidationSection> val(
      s, "validation", "Periodic validation loss.",
      [](JobConfig& c) -> ValidationSection& { return c.validation; });
  val.field("enable", &ValidationSection::enable, "Compute the validation loss during training.");
  val.field("dataset", &ValidationSection::dataset, "Validation dataset name.");
  val.field("dataset_text_field", &ValidationSection::dataset_text_field,
            "loom: the JSON field (.jsonl) or Parquet/Arrow column holding each record's text.");
  val.field("dataset_path", &ValidationSection::dataset_path,
            "Path of the validation dataset files.");
  val.field("local_batch_size", &ValidationSection::local_batch_size,
            "Validation samples per data-parallel rank in one evaluation batch; they run forward "
            "in pieces of training.local_batch_size rows (the pipeline's microbatch under PP), so "
            "validation needs no more activation memory than a training microbatch.")
      .min(1);
  val.field("seq_len", &ValidationSection::seq_len, "Tokens per validation sample.").min(1);
  val.field("freq", &ValidationSection::freq, "Validate every this many training steps.").min(1);
  val.field("steps", &ValidationSection::steps,
            "Validation batches per evaluation; -1 means the whole set.")
      .min(1)
      .sentinel(-1);
  val.field("dataset_mixture", &ValidationSection::dataset_mixture,
            "loom: a weighted mixture of validation datasets (\"SOURCE:WEIGHT\" entries, as "
            "training.dataset_mixture), read in order within each source; needs a step count.");
  SectionBuilder<DataLoaderSection> vdl(
      s, "validation.dataloader", "PyTorch DataLoader settings (Python only).",
      [](JobConfig& c) -> DataLoaderSection& { return c.validation.dataloader; });
  add_dataloader_fields(vdl);
}

void add_parallelism_section(Schema& s) {
  SectionBuilder<ParallelismSection> p(
      s, "parallelism", "How the model and data are split over ranks.",
      [](JobConfig& c) -> ParallelismSection& { return c.parallelism; });
  p.field("data_parallel_replicate_degree", &ParallelismSection::data_parallel_replicate_degree,
          "Replicas that all-reduce gradients (DDP; HSDP together with sharding).")
      .min(1);
  p.field("data_parallel_shard_degree", &ParallelismSection::data_parallel_shard_degree,
          "Ranks that shard parameters (FSDP); -1 means the ranks left over by the other degrees.")
      .min(1)
      .sentinel(-1);
  p.field("fsdp_reshard_after_forward", &ParallelismSection::fsdp_reshard_after_forward,
          "Free gathered parameters after forward: always (re-gathered in backward), never "
          "(kept until backward: less traffic, more memory), default (always, except the last "
          "unit [norm + output], whose backward comes next; never under pipeline parallelism).")
      .choices({"default", "always", "never"});
  p.field("fsdp_defer_gradient_sync", &ParallelismSection::fsdp_defer_gradient_sync,
          "loom: with gradient accumulation, keep the whole model's unsharded gradients across "
          "microbatches (accumulated in mixed_precision_param) and reduce-scatter once, on the "
          "last microbatch: 1/M-th the reduce-scatter traffic for M microbatches, at the memory "
          "of a full unsharded gradient copy. Off (FSDP2's default): every microbatch "
          "reduce-scatters into float32 sharded gradients.");
  p.field("tensor_parallel_degree", &ParallelismSection::tensor_parallel_degree,
          "Tensor-parallel ranks (Megatron-style).")
      .min(1);
  p.field("disable_loss_parallel", &ParallelismSection::disable_loss_parallel,
          "Gather logits instead of a vocab-parallel loss under tensor parallelism.");
  p.field("enable_async_tensor_parallel", &ParallelismSection::enable_async_tensor_parallel,
          "Overlap tensor-parallel communication with matmuls (needs torch.compile); not "
          "implemented yet: only false is accepted.");
  p.field("pipeline_parallel_degree", &ParallelismSection::pipeline_parallel_degree,
          "Pipeline stages over ranks.")
      .min(1);
  p.field(
      "module_fqns_per_model_part", &ParallelismSection::module_fqns_per_model_part,
      "Explicit module names of each pipeline model part (CLI: ';' between parts, ',' within).");
  p.field("pipeline_parallel_first_stage_less_layers",
          &ParallelismSection::pipeline_parallel_first_stage_less_layers,
          "Layers fewer on the first stage (it also holds the embedding).")
      .min(0);
  p.field("pipeline_parallel_last_stage_less_layers",
          &ParallelismSection::pipeline_parallel_last_stage_less_layers,
          "Layers fewer on the last stage (it also holds the output projection).")
      .min(0);
  p.field("pipeline_parallel_layers_per_stage",
          &ParallelismSection::pipeline_parallel_layers_per_stage,
          "Layers per pipeline stage, to derive the split automatically.")
      .min(1);
  p.field("pipeline_parallel_schedule", &ParallelismSection::pipeline_parallel_schedule,
          "Pipeline schedule: GPipe, 1F1B, Interleaved1F1B or InterleavedZeroBubble "
          "(case-insensitive; `loom plan schedule` shows each).");
  p.field("pipeline_parallel_schedule_csv", &ParallelismSection::pipeline_parallel_schedule_csv,
          "CSV file with a custom pipeline schedule (a row of actions per rank, e.g. 0F1,0I1,0W1; "
          "torch.distributed.pipelining's format); replaces pipeline_parallel_schedule.");
  p.field("pipeline_parallel_microbatch_size",
          &ParallelismSection::pipeline_parallel_microbatch_size,
          "Samples per pipeline microbatch.")
      .min(1);
  p.field("pipeline_parallel_expert_parallel_overlap",
          &ParallelismSection::pipeline_parallel_expert_parallel_overlap,
          "Overlap expert- and pipeline-parallel communication.")
      .unimplemented();
  p.field("context_parallel_degree", &ParallelismSection::context_parallel_degree,
          "Ranks splitting the sequence dimension.")
      .min(1);
  p.field("context_parallel_load_balancer", &ParallelismSection::context_parallel_load_balancer,
          "How a sequence is split over the cp ranks: headtail (2 cp chunks, rank r holds "
          "chunks r and 2cp-1-r, so causal work is even) or none (contiguous shares).")
      .choices({"headtail", "none"});
  p.field("context_parallel_rotate_method", &ParallelismSection::context_parallel_rotate_method,
          "How attention reaches the other cp ranks' keys and values: allgather (all-gathered, "
          "their gradients reduce-scattered) or alltoall (the ring: key/value blocks passed rank "
          "to rank while the current block computes, merged by log-sum-exp).")
      .choices({"allgather", "alltoall"});
  p.field("expert_parallel_degree", &ParallelismSection::expert_parallel_degree,
          "Ranks splitting MoE experts.")
      .min(1);
  p.field("expert_tensor_parallel_degree", &ParallelismSection::expert_tensor_parallel_degree,
          "Tensor-parallel degree inside experts.")
      .min(1);
  p.field("expert_parallel_comm_backend", &ParallelismSection::expert_parallel_comm_backend,
          "MoE all-to-all implementation.")
      .choices({"standard", "deepep"})
      .unimplemented();
}

void add_checkpoint_sections(Schema& s) {
  SectionBuilder<CheckpointSection> ck(
      s, "checkpoint", "Saving and resuming.",
      [](JobConfig& c) -> CheckpointSection& { return c.checkpoint; });
  ck.field("enable", &CheckpointSection::enable,
           "Save checkpoints and resume from the latest complete one (docs/checkpoint.md).");
  ck.field("enable_ft_dataloader_checkpoints", &CheckpointSection::enable_ft_dataloader_checkpoints,
           "Data-loader checkpoints for torchft replicas.")
      .unimplemented();
  ck.field("folder", &CheckpointSection::folder,
           "Checkpoint folder. Relative: under dump_folder (no \"..\"); absolute: as given.");
  ck.field("interval", &CheckpointSection::interval, "Save every this many steps.").min(1);
  ck.field("initial_load_path", &CheckpointSection::initial_load_path,
           "Checkpoint to start from when the run has none of its own.");
  ck.field("initial_load_model_only", &CheckpointSection::initial_load_model_only,
           "Take only the model weights from initial_load_path.");
  ck.field("initial_load_in_hf", &CheckpointSection::initial_load_in_hf,
           "initial_load_path is a Hugging Face Llama folder (imported into <folder>/hf-import).");
  ck.field("initial_load_in_hf_quantized", &CheckpointSection::initial_load_in_hf_quantized,
           "The Hugging Face checkpoint holds quantized weights.")
      .unimplemented();
  ck.field("last_save_model_only", &CheckpointSection::last_save_model_only,
           "The final save holds model weights only.");
  ck.field("last_save_in_hf", &CheckpointSection::last_save_in_hf,
           "Also export the final save as a Hugging Face Llama folder, step-N-hf.");
  ck.field("export_dtype", &CheckpointSection::export_dtype, "Dtype of model-only final saves.")
      .choices({"float16", "bfloat16", "float32"});
  ck.field("async_mode", &CheckpointSection::async_mode,
           "disabled: save on the training thread; async: snapshot, then a writer thread saves; "
           "async_with_pinned_mem: same with pinned host buffers.")
      .choices({"disabled", "async", "async_with_pinned_mem"});
  ck.field("keep_latest_k", &CheckpointSection::keep_latest_k,
           "Keep only the newest k checkpoints; 0 keeps all (1 is not allowed: the newest may "
           "still be writing).")
      .min(0);
  ck.field("load_step", &CheckpointSection::load_step,
           "Step to resume from; -1 means the newest complete one.")
      .min(0)
      .sentinel(-1);
  ck.field("exclude_from_loading", &CheckpointSection::exclude_from_loading,
           "State not to load (model, optimizer, lr_scheduler, dataloader, train_state).");
  ck.field("enable_first_step_checkpoint", &CheckpointSection::enable_first_step_checkpoint,
           "Also save after the first step.");
  ck.field("create_seed_checkpoint", &CheckpointSection::create_seed_checkpoint,
           "Write the initialized model as step-0 (one rank) and exit.");
  ck.field("load_only", &CheckpointSection::load_only, "Load checkpoints but never save.");

  SectionBuilder<ActivationCheckpointSection> ac(
      s, "activation_checkpoint", "Recomputing activations in backward to save memory.",
      [](JobConfig& c) -> ActivationCheckpointSection& { return c.activation_checkpoint; });
  ac.field("mode", &ActivationCheckpointSection::mode,
           "none, full (every block), selective (see selective_ac_option) or memory_budget.")
      .choices({"none", "full", "selective", "memory_budget"});
  ac.field("selective_ac_option", &ActivationCheckpointSection::selective_ac_option,
           "An integer N: checkpoint every N-th block; or 'op': per-operator policy.");
  ac.field("per_op_sac_force_recompute_mm_shapes_by_fqns",
           &ActivationCheckpointSection::per_op_sac_force_recompute_mm_shapes_by_fqns,
           "Linear layers whose matmuls are always recomputed under the per-op policy.")
      .unimplemented();
  ac.field("early_stop", &ActivationCheckpointSection::early_stop,
           "Stop recomputing once the needed activations exist.")
      .unimplemented();
  ac.field("memory_budget", &ActivationCheckpointSection::memory_budget,
           "torch.compile memory budget (0 to 1).")
      .range(0, 1)
      .unimplemented();
  ac.field("visualize_memory_budget_pareto",
           &ActivationCheckpointSection::visualize_memory_budget_pareto,
           "Plot the memory-budget trade-off.")
      .unimplemented();
  ac.field("preserve_rng_state", &ActivationCheckpointSection::preserve_rng_state,
           "Replay the RNG state when recomputing.")
      .unimplemented();
  ac.field("determinism_check", &ActivationCheckpointSection::determinism_check,
           "torch.utils.checkpoint determinism check.")
      .unimplemented();
  ac.field("debug", &ActivationCheckpointSection::debug, "Activation checkpointing debug records.")
      .unimplemented();
}

void add_unimplemented_sections(Schema& s) {
  SectionBuilder<CompileSection> cmp(
      s, "compile", "torch.compile (Python only).",
      [](JobConfig& c) -> CompileSection& { return c.compile; }, false);
  cmp.field("enable", &CompileSection::enable, "Compile the model and loss.");
  cmp.field("components", &CompileSection::components, "What to compile (model, loss).");
  cmp.field("backend", &CompileSection::backend, "torch.compile backend.");

  s.add_section({"quantize", "Low-precision training (torchao)."});
  s.add_section({"quantize.linear", "Low-precision linear layers."});
  SectionBuilder<Float8LinearSection> f8(
      s, "quantize.linear.float8",
      "Float8 linear layers (model.converters = [\"float8\"]; docs/float8.md).",
      [](JobConfig& c) -> Float8LinearSection& { return c.quantize.linear.float8; });
  f8.field("enable_fsdp_float8_all_gather", &Float8LinearSection::enable_fsdp_float8_all_gather,
           "FSDP all-gathers the converted linears' weights in float8 with their scales (half "
           "the bytes of bfloat16); tensorwise recipe only.");
  f8.field("precompute_float8_dynamic_scale_for_fsdp",
           &Float8LinearSection::precompute_float8_dynamic_scale_for_fsdp,
           "With the float8 all-gather: compute every converted weight's scale after the "
           "optimizer step, in one all-reduce, instead of one all-reduce per FSDP unit gather.");
  f8.field("recipe_name", &Float8LinearSection::recipe_name,
           "Float8 recipe: tensorwise (one scale per tensor, e5m2 gradients), rowwise (scales "
           "per row and column, e4m3, power-of-two scales) or rowwise_with_gw_hp (rowwise, "
           "weight gradient in high precision); unset: tensorwise.")
      .choices({"tensorwise", "rowwise", "rowwise_with_gw_hp"});
  f8.field("filter_fqns", &Float8LinearSection::filter_fqns,
           "Linear layers left in high precision: those whose name contains one of these (the "
           "output layer and layers with dims not multiples of 16 always are).");
  f8.field("emulate", &Float8LinearSection::emulate,
           "Emulate the float8 GEMMs (quantize, dequantize, float32 GEMM) even on a GPU with "
           "float8 support; without such a GPU loom always emulates.");
  f8.field("round_scales_to_power_of_2", &Float8LinearSection::round_scales_to_power_of_2,
           "Round scales down to powers of two (loom's key); unset: the recipe's default "
           "(tensorwise: false, rowwise recipes: true).");
  SectionBuilder<MXLinearSection> mx(
      s, "quantize.linear.mx", "MX (microscaling) linear layers.",
      [](JobConfig& c) -> MXLinearSection& { return c.quantize.linear.mx; }, false);
  mx.field("mxfp8_dim1_cast_kernel_choice", &MXLinearSection::mxfp8_dim1_cast_kernel_choice,
           "Kernel of the MXFP8 dim-1 cast.")
      .choices({"triton", "cuda", "torch"})
      .unimplemented();
  mx.field("recipe_name", &MXLinearSection::recipe_name, "MX recipe.").unimplemented();
  mx.field("filter_fqns", &MXLinearSection::filter_fqns, "Linear layers left in high precision.")
      .unimplemented();
  s.add_section({"quantize.grouped_mm", "Low-precision grouped matmuls of MoE experts."});
  SectionBuilder<Float8GroupedMMSection> gf8(
      s, "quantize.grouped_mm.float8",
      "Float8 grouped matmuls of MoE routed experts (model.converters = "
      "[\"quantize.grouped_mm.float8\"]; row-wise, emulated; docs/float8.md).",
      [](JobConfig& c) -> Float8GroupedMMSection& { return c.quantize.grouped_mm.float8; });
  gf8.field("fqns", &Float8GroupedMMSection::fqns,
            "Routed-expert modules converted: those whose name contains one of these (a name or "
            "a list, e.g. experts); empty: every one.")
      .scalar_as_list();
  SectionBuilder<MXGroupedMMSection> gmx(
      s, "quantize.grouped_mm.mx", "MXFP8 grouped matmuls.",
      [](JobConfig& c) -> MXGroupedMMSection& { return c.quantize.grouped_mm.mx; }, false);
  gmx.field("recipe_name", &MXGroupedMMSection::recipe_name, "MX recipe.")
      .choices({"mxfp8"})
      .unimplemented();
  gmx.field("fqns", &MXGroupedMMSection::fqns, "MoE modules converted (a name or a list).")
      .scalar_as_list()
      .unimplemented();
}

void add_runtime_sections(Schema& s) {
  SectionBuilder<CommSection> comm(s, "comm", "Collective communication.",
                                   [](JobConfig& c) -> CommSection& { return c.comm; });
  comm.field("init_timeout_seconds", &CommSection::init_timeout_seconds,
             "Timeout of collectives until the first step finished.")
      .min(1);
  comm.field("train_timeout_seconds", &CommSection::train_timeout_seconds,
             "Timeout of collectives after the first step.")
      .min(1);
  comm.field("trace_buf_size", &CommSection::trace_buf_size,
             "Flight recorder: the last collectives each rank remembers (0 disables); dumped on "
             "a collective timeout or SIGUSR1, read with `loom debug hang`.")
      .min(0);
  comm.field(
      "save_traces_folder", &CommSection::save_traces_folder,
      "Flight-recorder dump folder. Relative: under dump_folder (no \"..\"); absolute: as given.");
  comm.field("save_traces_file_prefix", &CommSection::save_traces_file_prefix,
             "Flight-recorder file prefix: `<prefix><rank>.json`.");
  comm.field("mode", &CommSection::mode, "default, or simulated communication for dry runs.")
      .choices({"default", "fake_backend", "local_tensor"})
      .unimplemented();

  SectionBuilder<MemoryEstimationSection> mem(
      s, "memory_estimation", "FSDP memory estimation (Python only).",
      [](JobConfig& c) -> MemoryEstimationSection& { return c.memory_estimation; }, false);
  mem.field("enable", &MemoryEstimationSection::enable, "Estimate memory before training.");
  mem.field("disable_fake_mode", &MemoryEstimationSection::disable_fake_mode,
            "Estimate with real tensors.")
      .unimplemented();

  SectionBuilder<FaultToleranceSection> ft(
      s, "fault_tolerance",
      "Fault-tolerant replica groups (torchft's semantics; docs/fault_tolerance.md).",
      [](JobConfig& c) -> FaultToleranceSection& { return c.fault_tolerance; });
  ft.field("enable", &FaultToleranceSection::enable,
           "Fault-tolerant replica groups: each `loom launch` is one group, a lighthouse "
           "(TORCHFT_LIGHTHOUSE) forms a quorum per step; a failed group heals from a live one.");
  ft.field("process_group", &FaultToleranceSection::process_group,
           "Backend of the process groups across replica groups.")
      .choices({"gloo", "nccl"});
  ft.field("process_group_timeout_ms", &FaultToleranceSection::process_group_timeout_ms,
           "Timeout of collectives across replica groups (a failure discards the step); 1 ms "
           "to 1 day.")
      .min(1)
      .max(86400000);
  ft.field("replica_id", &FaultToleranceSection::replica_id,
           "This replica group's id (0 .. group_size - 1); it picks the group's data.")
      .min(0);
  ft.field("group_size", &FaultToleranceSection::group_size,
           "Number of replica groups the data is split into.")
      .min(0);
  ft.field("min_replica_size", &FaultToleranceSection::min_replica_size,
           "Replica groups a step needs to commit.")
      .min(1);
  ft.field("semi_sync_method", &FaultToleranceSection::semi_sync_method,
           "Semi-synchronous training across replica groups: local_sgd (parameters averaged "
           "every sync_steps) or diloco (pseudo-gradients averaged, an outer Nesterov step); "
           "unset: gradients averaged every step.")
      .choices({"local_sgd", "diloco"});
  ft.field("sync_steps", &FaultToleranceSection::sync_steps,
           "Local steps between synchronizations (semi_sync_method).")
      .min(1);
  ft.field("outer_lr", &FaultToleranceSection::outer_lr,
           "loom: DiLoCo's outer learning rate (Nesterov SGD on the averaged pseudo-gradients).")
      .min(0);
  ft.field("outer_momentum", &FaultToleranceSection::outer_momentum,
           "loom: DiLoCo's outer Nesterov momentum.")
      .min(0)
      .max(1);

  SectionBuilder<ExperimentalSection> exp(
      s, "experimental", "Python extension hooks.",
      [](JobConfig& c) -> ExperimentalSection& { return c.experimental; }, false);
  exp.field("custom_import", &ExperimentalSection::custom_import, "Python module to import.")
      .unimplemented();
  exp.field("custom_args_module", &ExperimentalSection::custom_args_module,
            "Old name of job.custom_config_module.")
      .unimplemented();

  SectionBuilder<DebugSection> dbg(s, "debug", "Reproducibility and debugging.",
                                   [](JobConfig& c) -> DebugSection& { return c.debug; });
  dbg.field("seed", &DebugSection::seed,
            "Seed of every random number generator; unset means a random seed (logged).");
  dbg.field("deterministic", &DebugSection::deterministic,
            "Use deterministic kernels only (slower).");
  dbg.field("deterministic_warn_only", &DebugSection::deterministic_warn_only,
            "Warn instead of failing on ops without a deterministic kernel.");
  dbg.field("moe_force_load_balance", &DebugSection::moe_force_load_balance,
            "Route the copies of the tokens to the experts round-robin (each expert gets "
            "tokens x top_k / experts), ignoring the router's choice; for load and throughput "
            "experiments.");
  dbg.field("force_fsdp", &DebugSection::force_fsdp,
            "loom: apply FSDP even when data_parallel_shard_degree is 1 (each shard group is one "
            "rank holding whole parameters; with replicas, HSDP): runs FSDP's code paths on a "
            "single device, e.g. one GPU.");
  dbg.field("cpu_memory_limit_gib", &DebugSection::cpu_memory_limit_gib,
            "loom: on CPU, fail with an out-of-memory error when this process's tensors would "
            "take more than this many GiB (0: no limit), as a full GPU does: sizes a job on CPU "
            "the way it will run on a device.")
      .min(0.0);
}

Schema build_schema() {
  Schema schema;
  add_job_sections(schema);
  add_model_sections(schema);
  add_training_sections(schema);
  add_parallelism_section(schema);
  add_checkpoint_sections(schema);
  add_unimplemented_sections(schema);
  add_runtime_sections(schema);
  return schema;
}

}  // namespace

const Schema& job_config_schema() {
  static const Schema schema = build_schema();
  return schema;
}

}  // namespace loom::config
