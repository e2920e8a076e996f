// Config keys of [parallelism], [checkpoint] and [activation_checkpoint].
#include "schema_sections.h"

namespace loom::config::detail {

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
  ck.field("stop_after_failed_saves", &CheckpointSection::stop_after_failed_saves,
           "loom: the run stops (exit 1) at the save after this many saves in a row failed "
           "(disk full, storage gone), rather than training on with nothing to resume from; "
           "0 trains on whatever fails.")
      .min(0);

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

}  // namespace loom::config::detail
