// Config keys of [training], [validation] and their [*.dataloader] tables.
#include "schema_sections.h"

namespace loom::config::detail {

namespace {

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

}  // namespace

void add_training_section(Schema& s) {
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
  tr.field("skip_nonfinite_steps", &TrainingSection::skip_nonfinite_steps,
           "loom: a step whose gradient norm is NaN or infinite leaves the weights and the "
           "optimizer state as they were (decided on the device, no host sync) and is logged; "
           "this many such steps in a row are allowed before the run stops. 0: the run stops "
           "at the first, before a checkpoint could keep its weights.")
      .min(0);
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
           "loom: where to train: auto (CUDA when available, else CPU), cpu, cuda (local rank i "
           "on cuda:i) or cuda:N (every local rank on GPU N; several ranks on one GPU reduce "
           "through host memory: for checking layouts, not speed).");
  tr.field("mixed_precision_on_cpu", &TrainingSection::mixed_precision_on_cpu,
           "loom: compute in mixed_precision_param on CPU too (autocast; under FSDP, the "
           "all-gather dtype); CPU runs train in float32 otherwise (on CUDA, "
           "mixed_precision_param always applies).");
  tr.field("cuda_kernels", &TrainingSection::cuda_kernels,
           "loom: on CUDA, run loom's own kernels (RMSNorm with the residual add, SwiGLU, RoPE, "
           "cross-entropy on bfloat16 logits, the gradient norm and clip) instead of ATen's "
           "compositions; opt-in until their cuda tests pass on a GPU (docs/performance.md). "
           "No effect on CPU, where loom's fused CPU kernels always run.");
  tr.field("cuda_graph", &TrainingSection::cuda_graph,
           "loom: on CUDA, record the whole training step (forward, backward, clipping, the "
           "optimizer) as one CUDA graph after 2 eager steps and replay it every step after, "
           "with the batch, lr and step counts in fixed device buffers; the data-parallel "
           "wrappers (DDP, FSDP, HSDP over NCCL) are recorded with it. Jobs it cannot record "
           "(tensor, pipeline, context or expert parallelism, ranks sharing a GPU, MoE, "
           "multi-token prediction, document masks, converters, fault tolerance, optimizers "
           "other than AdamW/Adam) train eagerly, and the log names why. Opt-in until its GPU "
           "check passes (docs/performance.md).");
  tr.field("sdpa_backend", &TrainingSection::sdpa_backend,
           "loom: which of LibTorch's fused kernels runs causal attention on CUDA: fastest "
           "(each shape's first call times flash, cudnn and efficient, forward and backward, "
           "keeps those that agree with LibTorch's own pick, and logs the times and the "
           "winner), libtorch (LibTorch's fixed order: flash, efficient, cudnn last), or one "
           "kernel by name. debug.deterministic turns fastest into libtorch. No effect on CPU "
           "or on masked attention (documents and windows take the variable-length kernels).")
      .choices({"fastest", "libtorch", "flash", "cudnn", "efficient"});
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
}

void add_validation_section(Schema& s) {
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

}  // namespace loom::config::detail
