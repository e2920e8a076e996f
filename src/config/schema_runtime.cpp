// Config keys of [compile], [quantize.*], [comm], [memory_estimation], [fault_tolerance],
// [experimental] and [debug].
#include "schema_sections.h"

namespace loom::config::detail {

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
           "the bytes of bfloat16, and the gathered weights stay float8); tensorwise and "
           "blockwise recipes.");
  f8.field("precompute_float8_dynamic_scale_for_fsdp",
           &Float8LinearSection::precompute_float8_dynamic_scale_for_fsdp,
           "With the tensorwise float8 all-gather: compute every converted weight's scale after "
           "the optimizer step, in one all-reduce, instead of one all-reduce per FSDP unit "
           "gather (blockwise agrees on no scale).");
  f8.field("recipe_name", &Float8LinearSection::recipe_name,
           "Float8 recipe: tensorwise (one scale per tensor, e5m2 gradients), rowwise (scales "
           "per row and column, e4m3, power-of-two scales), rowwise_with_gw_hp (rowwise, "
           "weight gradient in high precision) or blockwise (DeepSeek-V3's: 1 x 128 tiles of "
           "activations and gradients, 128 x 128 weight blocks, e4m3; linears whose dims are "
           "multiples of 128); unset: tensorwise.")
      .choices({"tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise"});
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

void add_comm_sections(Schema& s) {
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
}

// Fault tolerance, experimental hooks and debugging.
void add_fault_tolerance_and_debug_sections(Schema& s) {
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
  dbg.field(
      "seed", &DebugSection::seed,
      "Seed of every random number generator; unset: the resumed checkpoint's, else one drawn by "
      "the first rank for every rank (logged, and recorded in the checkpoints).");
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
  dbg.field("cuda_graph_on_cpu", &DebugSection::cuda_graph_on_cpu,
            "loom: with training.cuda_graph on CPU, run its path (fixed buffers, lr and step "
            "counts on the device, the step recorded once) with the recorded step replayed "
            "eagerly: tests that path where no GPU is.");
  dbg.field("cpu_memory_limit_gib", &DebugSection::cpu_memory_limit_gib,
            "loom: on CPU, fail with an out-of-memory error when this process's tensors would "
            "take more than this many GiB (0: no limit), as a full GPU does: sizes a job on CPU "
            "the way it will run on a device.")
      .min(0.0);
  dbg.field("nonfinite_gradient_steps", &DebugSection::nonfinite_gradient_steps,
            "loom: at these steps the first rank writes a NaN into one of its gradients before "
            "clipping (fault injection: what training.skip_nonfinite_steps guards against).");
}

}  // namespace loom::config::detail
