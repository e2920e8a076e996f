// Config keys of [job], [profiling], [metrics], [model], [optimizer] and [lr_scheduler].
#include "schema_sections.h"

namespace loom::config::detail {

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

void add_model_section(Schema& s) {
  SectionBuilder<ModelSection> model(s, "model", "Which model to train.",
                                     [](JobConfig& c) -> ModelSection& { return c.model; });
  model.field(
      "name", &ModelSection::name,
      "Model family in the model registry: llama3, qwen3, qwen3_moe, deepseek_v3 or gpt_oss "
      "(`loom plan model` names the registered ones).");
  model.field(
      "flavor", &ModelSection::flavor,
      "Size of the model family (llama3: debugmodel, 100M, 8B, 8B_4layers, 70B, 405B; "
      "qwen3: debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B, and as torchtitan the mixture-of-experts "
      "debugmodel_moe, 30B-A3B, 235B-A22B, also named qwen3_moe, and 30B-A3B_2layers; deepseek_v3: "
      "debugmodel, "
      "16B, 236B, 671B; gpt_oss: debugmodel, 20B, 120B).");
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
  model
      .field("num_mtp_layers", &ModelSection::num_mtp_layers,
             "Multi-token prediction depths (DeepSeek-V3's MTP modules; 0: off): depth k "
             "predicts the token k + 1 places ahead, from depth k - 1's representation and the "
             "embedding of the token k ahead, through one more transformer block and the shared "
             "head (docs/models.md). deepseek_v3 only.")
      .range(0, 64);
  model
      .field("mtp_scale", &ModelSection::mtp_scale,
             "Weight of the depths' mean loss added to the next-token loss (DeepSeek-V3: 0.3).")
      .min(0);
  model
      .field("mtp_scale_switch_step", &ModelSection::mtp_scale_switch_step,
             "loom: from this step on, mtp_scale_after_switch replaces mtp_scale (DeepSeek-V3 "
             "went from 0.3 to 0.1 after 10T of 14.8T tokens); 0: mtp_scale throughout.")
      .min(0);
  model
      .field("mtp_scale_after_switch", &ModelSection::mtp_scale_after_switch,
             "loom: the weight of the depths' loss from mtp_scale_switch_step on.")
      .min(0);
}

// The optimizer and its learning-rate schedule.
void add_optimizer_sections(Schema& s) {
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
  opt.field("qk_clip_threshold", &OptimizerSection::qk_clip_threshold,
            "QK-clip (MuonClip; any optimizer): after each step, every attention head whose "
            "largest logit of the step passed this has its query and key projections scaled so "
            "it would be this (Kimi K2: 100); 0: off. The step's largest logit is logged as "
            "max_attention_logit (docs/optimizers.md).")
      .min(0);
  opt.field("qk_clip_alpha", &OptimizerSection::qk_clip_alpha,
            "QK-clip: the query's share of a head's scale gamma (queries x gamma^alpha, keys x "
            "gamma^(1 - alpha); latent attention's rotary queries x gamma).")
      .range(0, 1);
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

}  // namespace loom::config::detail
