#!/usr/bin/env python3
"""torchtitan itself on loom's benchmark: the same Llama 3 (or Qwen3-MoE) shape, batch and
synthetic tokens as `llama_reference.py bench`, trained by torchtitan's own Trainer on one device, with its tokens/s
and peak memory in the same JSON (tools/gpu_check.sh's "(torchtitan)" runs).

torchtitan is not installed here: `--site DIR` names a folder holding torchtitan and the packages
it imports that the machine lacks (tools/prepare_gpu_carry.sh fetches the wheels; gpu_check.sh
unpacks them for the machine's Python). Only extension points torchtitan offers are used: loom's
flavors join its llama3 (or qwen3) model args, and a train spec "loom_model" is torchtitan's llama3
(or qwen3) spec with a synthetic data loader and no tokenizer. Everything else -- model, parallelize (torch.compile per
block with --compile), AMP on one device, fused AdamW, clipping, the training loop -- is
torchtitan's. Timing: the wall clock from the end of the warm-up steps to the end of the last
step, with a device synchronization at both ends only.

Usage: torchtitan_bench.py --site DIR [--model llama3|qwen3_moe] --flavor F --batch-size B --seq-len S --steps N
                           [--warmup W] [--device cuda|cpu] [--compile] [--json FILE]
"""
import argparse
import dataclasses
import json
import os
import shutil
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--site", required=True, help="folder holding torchtitan and its extra deps")
    p.add_argument("--model", choices=("llama3", "qwen3_moe"), default="llama3",
                   help="the family of --flavor (loom's model.name)")
    p.add_argument("--flavor", required=True)
    for flag in ("--batch-size", "--seq-len", "--steps"):
        p.add_argument(flag, type=int, required=True)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=8e-4)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--compile", action="store_true", help="torchtitan's compile.enable")
    p.add_argument("--json")
    ns = p.parse_args(argv)
    for name in ("batch_size", "seq_len", "steps"):
        if getattr(ns, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if ns.warmup < 1:
        p.error("--warmup must be at least 1 (the first step compiles and allocates)")
    if not os.path.isdir(os.path.join(ns.site, "torchtitan")):
        p.error(f"--site {ns.site}: no torchtitan package in it (tools/prepare_gpu_carry.sh)")
    return ns


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def synthetic_batches(vocab_size, batches, batch_size, seq_len):
    """llama_reference.py bench's tokens: the same generator, seed and shape."""
    import torch
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, vocab_size, (batches, batch_size, seq_len + 1), generator=g)


# loom's qwen3_moe flavors (src/models/qwen3/args.cpp) in torchtitan's Qwen3 model args: dim,
# layers, heads, kv heads, head dim, vocabulary, experts, experts per token, expert width.
LOOM_QWEN3_MOE_FLAVORS = {
    "debugmodel_moe": (256, 4, 8, 4, 32, 2048, 8, 2, 256),
    "30B-A3B_2layers": (2048, 2, 32, 4, 128, 151936, 128, 8, 768),
}


def llama3_model_args(flavor, seq_len):
    from llama_reference import flavor_args  # loom's llama3 flavors, one table
    from torchtitan.models import llama3
    a = flavor_args(flavor, seq_len)
    return llama3, llama3.TransformerModelArgs(
        dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads,
        vocab_size=a.vocab_size, multiple_of=a.multiple_of,
        ffn_dim_multiplier=a.ffn_dim_multiplier, norm_eps=a.norm_eps, rope_theta=a.rope_theta)


def qwen3_moe_model_args(flavor, seq_len, device):
    """Qwen3-MoE as torchtitan defines it (its qwen3 model with MoE layers: softmax routing,
    normalized top-k weights, no shared expert, the experts through torch._grouped_mm on CUDA)."""
    from torchtitan.models import qwen3
    from torchtitan.models.moe import MoEArgs
    if flavor not in LOOM_QWEN3_MOE_FLAVORS:
        raise SystemExit(f"torchtitan_bench.py: unknown qwen3_moe flavor '{flavor}' "
                         f"(known: {', '.join(LOOM_QWEN3_MOE_FLAVORS)})")
    dim, layers, heads, kv_heads, head_dim, vocab, experts, top_k, width = \
        LOOM_QWEN3_MOE_FLAVORS[flavor]
    moe = MoEArgs(num_experts=experts, num_shared_experts=0, top_k=top_k, score_func="softmax",
                  route_norm=True, route_scale=1.0, score_before_experts=False,
                  use_grouped_mm=device == "cuda")  # torch._grouped_mm has no CPU kernel
    return qwen3, qwen3.Qwen3ModelArgs(
        dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
        vocab_size=vocab, max_seq_len=seq_len, qk_norm=True, norm_eps=1e-6, rope_theta=1e6,
        moe_enabled=True, moe_inter_dim=width, moe_args=moe)


def register_loom_spec(family, args):
    """loom's flavor as torchtitan model args, and torchtitan's spec of `family` (its module) on
    synthetic data, as train spec "loom_model"."""
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.protocols.train_spec import register_train_spec

    spec = family.get_train_spec()

    class SyntheticLoader(BaseDataLoader):
        def __init__(self, data):
            self.data, self.next = data, 0

        def __iter__(self):
            while self.next < len(self.data):
                batch = self.data[self.next]
                self.next += 1
                yield {"input": batch[:, :-1]}, batch[:, 1:]

        def state_dict(self):
            return {"next": self.next}

        def load_state_dict(self, state):
            self.next = state["next"]

    def build_loader(dp_world_size, dp_rank, tokenizer, job_config, **_):
        if dp_world_size != 1:
            raise SystemExit("torchtitan_bench.py: one device only")
        t = job_config.training
        return SyntheticLoader(synthetic_batches(args.vocab_size, t.steps, t.local_batch_size,
                                                 t.seq_len))

    register_train_spec("loom_model", dataclasses.replace(
        spec, model_args={"loom": args}, build_dataloader_fn=build_loader,
        build_tokenizer_fn=None, build_validator_fn=None))
    return args


def on_the_cpu():
    """torchtitan assumes an accelerator (CUDA when it finds none): the dry run tells each of
    its modules that read the device type that it is the CPU, and its memory monitor reads
    nothing, nor does it shorten the process group's timeouts after step 1 (a barrier naming a
    CUDA device), and its MoE's token count gets a CPU kernel."""
    import torch
    from torchtitan.components import metrics
    from torchtitan.distributed import utils as dist_utils
    dist_utils.set_pg_timeouts = lambda *args, **kwargs: None
    for name, module in list(sys.modules.items()):
        if name.startswith("torchtitan") and hasattr(module, "device_type"):
            module.device_type = "cpu"
            if hasattr(module, "device_module"):
                module.device_module = torch.cpu

    class NoDeviceMemory:
        device_name, device_capacity_gib = "cpu", 0.0

        def get_peak_stats(self):
            return metrics.DeviceMemStats(-1, -1, -1, -1, 0, 0)

        def reset_peak_stats(self):
            pass

    metrics.build_device_memory_monitor = NoDeviceMemory
    # Its MoE counts tokens per expert with torch.histc of int64 expert ids, which only the CUDA
    # kernel takes; on the CPU the count runs on float ids (exact: ids are small integers) and
    # comes back in the ids' dtype, as CUDA's does.
    histc = torch.histc
    torch.histc = lambda x, *args, **kwargs: (
        histc(x, *args, **kwargs) if x.is_floating_point()
        else histc(x.float(), *args, **kwargs).to(x.dtype))


def main(argv=None):
    ns = parse(argv)
    sys.path.insert(0, os.path.abspath(ns.site))
    sys.path.insert(0, HERE)

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    import torch
    if ns.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torchtitan_bench.py: --device cuda, but this PyTorch sees no CUDA device")
    import torchtitan
    from torchtitan.config import ConfigManager
    from torchtitan.train import Trainer

    family, model_args = (llama3_model_args(ns.flavor, ns.seq_len) if ns.model == "llama3"
                          else qwen3_moe_model_args(ns.flavor, ns.seq_len, ns.device))
    register_loom_spec(family, model_args)
    if ns.device == "cpu":  # after the model's modules are imported: they read the device too
        on_the_cpu()
    total = ns.warmup + ns.steps
    dump = tempfile.mkdtemp(prefix="torchtitan_bench_")
    cli = ["--model.name", "loom_model", "--model.flavor", "loom",
           "--job.dump_folder", dump,
           "--training.local_batch_size", str(ns.batch_size),
           "--training.seq_len", str(ns.seq_len), "--training.steps", str(total),
           "--training.mixed_precision_param", "bfloat16", "--training.max_norm", "1.0",
           "--optimizer.name", "AdamW", "--optimizer.lr", str(ns.lr),
           "--optimizer.eps", "1e-8", "--optimizer.weight_decay", "0.1",
           "--lr_scheduler.warmup_steps", "1",
           "--activation_checkpoint.mode", "none", "--checkpoint.no-enable", "--debug.seed", "0",
           "--metrics.log_freq", str(total), "--metrics.no-enable-tensorboard"]
    if ns.compile:
        cli += ["--compile.enable", "--compile.components", "model,loss"]
    config = ConfigManager().parse_args(cli)

    sync = torch.cuda.synchronize if ns.device == "cuda" else (lambda: None)
    marks = {}

    class TimedTrainer(Trainer):
        """torchtitan's Trainer; the clock starts after the warm-up and stops after the last."""

        def train_step(self, data_iterator):
            if self.step == ns.warmup + 1:
                sync()
                marks["start"] = time.perf_counter()
            super().train_step(data_iterator)
            if self.step == total:
                sync()
                marks["end"] = time.perf_counter()

    losses = []
    trainer = TimedTrainer(config)
    log = trainer.metrics_processor.log

    def keep_loss(step, global_avg_loss, *args, **kwargs):
        losses.append((step, float(global_avg_loss)))
        return log(step, global_avg_loss, *args, **kwargs)

    trainer.metrics_processor.log = keep_loss
    try:
        trainer.train()
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        shutil.rmtree(dump, ignore_errors=True)
    if "end" not in marks or not losses or losses[-1][0] != total:
        raise SystemExit(f"torchtitan_bench.py: the run stopped early (losses logged: {losses})")
    elapsed = marks["end"] - marks["start"]
    result = {
        "tokens_per_s": ns.batch_size * ns.seq_len * ns.steps / elapsed,
        "step_time_s": elapsed / ns.steps, "batch_size": ns.batch_size, "seq_len": ns.seq_len,
        "steps": ns.steps, "warmup": ns.warmup, "final_loss": losses[-1][1],
        "params": sum(p.numel() for m in trainer.model_parts for p in m.parameters()),
        "model_args": dataclasses.asdict(model_args), "device": ns.device,
        "compile": ns.compile, "torch_version": torch.__version__,
        "torchtitan_version": getattr(torchtitan, "__version__", "unknown"),
        "peak_gib": (torch.cuda.max_memory_allocated() / 2**30) if ns.device == "cuda" else None,
    }
    print(json.dumps(result))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
