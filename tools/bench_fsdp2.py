#!/usr/bin/env python3
"""Side-by-side FSDP step time: loom FSDP x2 vs PyTorch FSDP2 (`fully_shard`) x2, Gloo on CPU.

Both train the same Llama 3 (tools/reference/llama_reference.py's model for PyTorch, loom's
flavor of the same shape) on 2 ranks of this machine with local batch 4 x 256 tokens each,
float32, AdamW, clipping at 1.0, no activation checkpointing, the same threads per rank. PyTorch
shards every block and the root with `fully_shard` (FSDP2's per-block wrapping, reshard after
forward), as torchtitan does; loom shards per block with reshard `default`. Rounds alternate
loom and PyTorch (A B A B ...); each reports the median step time of rank 0 after warm-up, and
the summary gives the median of the per-round ratios (PyTorch step time / loom step time: > 1
means loom is faster). Timings on a shared 2-core machine are noisy: trust the ratio.

  .venv/bin/python tools/bench_fsdp2.py [--flavor debugmodel] [--rounds 3] [--threads 1]
      [--loom-before OLD_BINARY]   # a third arm: an older loom build, for before/after ratios
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from bench_train import FLAVORS, fresh_dump, loom_train_args  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_loom(ns, workdir, loom):
    dump = fresh_dump(workdir, "loom_fsdp")
    total = ns.warmup + ns.steps
    cmd = [loom, "launch", "--nproc-per-node", "2", "--master-port", str(free_port()), "--"] + \
        loom_train_args(ns.flavor, ns.batch_size, ns.seq_len, total, dump) + \
        ["--parallelism.data_parallel_shard_degree", "2", "--metrics.log_freq", "1"]
    env = dict(os.environ, OMP_NUM_THREADS=str(ns.threads))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f if '"loss"' in line]
    times = [line["step_time_s"] for line in lines if line["step"] > ns.warmup]
    waits = [line.get("comm_wait_pct", 0.0) for line in lines if line["step"] > ns.warmup]
    return {"step_time_s": statistics.median(times), "comm_wait_pct": statistics.median(waits)}


def run_torch(ns, workdir):
    out = os.path.join(workdir, "torch_fsdp2.json")
    env = dict(os.environ, OMP_NUM_THREADS=str(ns.threads), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    procs = []
    for rank in range(2):
        cmd = [ns.python, os.path.abspath(__file__), "--worker", "--flavor", ns.flavor,
               "--batch-size", str(ns.batch_size), "--seq-len", str(ns.seq_len), "--warmup",
               str(ns.warmup), "--steps", str(ns.steps), "--threads", str(ns.threads),
               "--out", out]
        procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(rank)),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"bench_fsdp2: a PyTorch FSDP2 rank failed:\n{err[-3000:]}")
    with open(out) as f:
        return json.load(f)


def worker(ns):
    """One PyTorch FSDP2 rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
    import llama_reference as ref

    torch.set_num_threads(ns.threads)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    a = ref.parse_model_args(dict(FLAVORS[ns.flavor], max_seq_len=ns.seq_len, use_scaled_rope=True))
    torch.manual_seed(0)
    model = ref.Transformer(a)
    ref.init_random(model)
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    g = torch.Generator().manual_seed(1234 + rank)
    total = ns.warmup + ns.steps
    data = torch.randint(0, a.vocab_size, (total, ns.batch_size, ns.seq_len + 1), generator=g)
    times = []
    for i in range(total):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = ref.loss_fn(model(data[i, :, :-1]), data[i, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    dist.barrier()
    if rank == 0:
        with open(ns.out, "w") as f:
            json.dump({"step_time_s": statistics.median(times[ns.warmup:])}, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="debugmodel", choices=sorted(FLAVORS))
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="per rank")
    p.add_argument("--loom", default=os.path.join(ROOT, "build/bin/loom"))
    p.add_argument("--loom-before", help="an older loom binary run as a third arm of each round")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.worker:
        return worker(ns)
    rounds = []
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(ns.rounds):
            lm = run_loom(ns, workdir, ns.loom)
            before = run_loom(ns, workdir, ns.loom_before) if ns.loom_before else None
            pt = run_torch(ns, workdir)
            rounds.append({"loom": lm, "torch": pt, "ratio": pt["step_time_s"] / lm["step_time_s"]})
            line = (f"round {r + 1}: loom FSDP x2 {lm['step_time_s']:.3f} s/step "
                    f"(comm wait {lm['comm_wait_pct']:.1f}%), PyTorch FSDP2 x2 "
                    f"{pt['step_time_s']:.3f} s/step, ratio {rounds[-1]['ratio']:.2f}x")
            if before:
                rounds[-1]["before"] = before
                rounds[-1]["before_ratio"] = pt["step_time_s"] / before["step_time_s"]
                line += (f"; before: {before['step_time_s']:.3f} s/step, "
                         f"ratio {rounds[-1]['before_ratio']:.2f}x")
            print(line, flush=True)
    ratios = [r["ratio"] for r in rounds]
    summary = {"flavor": ns.flavor, "batch_size_per_rank": ns.batch_size, "seq_len": ns.seq_len,
               "threads_per_rank": ns.threads, "steps": ns.steps, "warmup": ns.warmup,
               "loom_step_time_s": statistics.median(r["loom"]["step_time_s"] for r in rounds),
               "torch_step_time_s": statistics.median(r["torch"]["step_time_s"] for r in rounds),
               "ratio_median": statistics.median(ratios), "ratios": ratios}
    if ns.loom_before:
        summary["before_ratios"] = [r["before_ratio"] for r in rounds]
        summary["before_ratio_median"] = statistics.median(summary["before_ratios"])
    print(json.dumps(summary, indent=2))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
