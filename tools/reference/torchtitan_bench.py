#!/usr/bin/env python3
"""torchtitan itself on loom's benchmark: the same Llama 3 shape, batch and synthetic tokens as
`llama_reference.py bench`, trained by torchtitan's own Trainer on one device, with its tokens/s
and peak memory in the same JSON (tools/gpu_check.sh's "(torchtitan)" runs).

torchtitan is not installed here: `--site DIR` names a folder holding torchtitan and the packages
it imports that the machine lacks (tools/prepare_gpu_carry.sh fetches the wheels; gpu_check.sh
unpacks them for the machine's Python). Only extension points torchtitan offers are used: loom's
flavors join its llama3 model args, and a train spec "loom_llama3" is torchtitan's llama3 spec with
a synthetic data loader and no tokenizer. Everything else -- model, parallelize (torch.compile per
block with --compile), AMP on one device, fused AdamW, clipping, the training loop -- is
torchtitan's. Timing: the wall clock from the end of the warm-up steps to the end of the last
step, with a device synchronization at both ends only.

Usage: torchtitan_bench.py --site DIR --flavor F --batch-size B --seq-len S --steps N
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


def register_loom_llama3(flavor_args):
    """loom's flavor as torchtitan model args, and torchtitan's llama3 spec on synthetic data."""
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.models import llama3
    from torchtitan.protocols.train_spec import register_train_spec

    spec = llama3.get_train_spec()
    args = llama3.TransformerModelArgs(
        dim=flavor_args.dim, n_layers=flavor_args.n_layers, n_heads=flavor_args.n_heads,
        n_kv_heads=flavor_args.n_kv_heads, vocab_size=flavor_args.vocab_size,
        multiple_of=flavor_args.multiple_of, ffn_dim_multiplier=flavor_args.ffn_dim_multiplier,
        norm_eps=flavor_args.norm_eps, rope_theta=flavor_args.rope_theta)

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

    register_train_spec("loom_llama3", dataclasses.replace(
        spec, model_args={"loom": args}, build_dataloader_fn=build_loader,
        build_tokenizer_fn=None, build_validator_fn=None))
    return args


def on_the_cpu():
    """torchtitan assumes an accelerator (CUDA when it finds none): the dry run tells each of
    its modules that read the device type that it is the CPU, and its memory monitor reads
    nothing, nor does it shorten the process group's timeouts after step 1 (a barrier naming a
    CUDA device)."""
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


def main(argv=None):
    ns = parse(argv)
    sys.path.insert(0, os.path.abspath(ns.site))
    sys.path.insert(0, HERE)
    from llama_reference import flavor_args  # loom's flavors, one table

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    import torch
    if ns.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torchtitan_bench.py: --device cuda, but this PyTorch sees no CUDA device")
    import torchtitan
    from torchtitan.config import ConfigManager
    from torchtitan.train import Trainer
    if ns.device == "cpu":
        on_the_cpu()

    model_args = register_loom_llama3(flavor_args(ns.flavor, ns.seq_len))
    total = ns.warmup + ns.steps
    dump = tempfile.mkdtemp(prefix="torchtitan_bench_")
    cli = ["--model.name", "loom_llama3", "--model.flavor", "loom",
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
