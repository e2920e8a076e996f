#!/usr/bin/env python3
"""Side-by-side training throughput: loom vs the same model and loop in eager PyTorch.

Runs `loom train` and tools/reference/llama_reference.py bench alternately (A B A B ...) with
the same model shape, batch, sequence length, optimizer and thread count, and reports tokens/s,
the loom/PyTorch ratio (median over rounds) and the time from process start to the first
finished step. Timings on a shared 2-core machine are noisy: trust the ratio, not the absolutes.

  .venv/bin/python tools/bench_train.py [--flavor debugmodel] [--rounds 3] [--json OUT]
      [--loom-before OLD_BINARY]   # a third arm: an older loom build, for before/after ratios
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# loom's llama3 flavors the reference knows (tools/reference/llama_reference.py, LOOM_FLAVORS).
FLAVORS = ("debugmodel", "100M", "8B_4layers")


def fresh_dump(workdir, name="loom_run"):
    """An empty dump folder: metrics.jsonl is appended across runs of one folder (resumed jobs
    keep their history), so a previous arm's rows must not count in this one."""
    dump = os.path.join(workdir, name)
    if os.path.exists(dump):
        shutil.rmtree(dump)
    return dump


def loom_train_args(flavor, batch, seq, steps, dump):
    """The `loom train` arguments every benchmark shares: synthetic data on CPU, seed 0, no
    activation checkpointing, a one-step warm-up of the learning rate."""
    return ["train", "--model.flavor", flavor, "--training.dataset", "synthetic",
            "--training.device", "cpu", "--training.local_batch_size", str(batch),
            "--training.seq_len", str(seq), "--training.steps", str(steps),
            "--metrics.peak_tflops", "1", "--debug.seed", "0",
            "--activation_checkpoint.mode", "none", "--lr_scheduler.warmup_steps", "1",
            "--metrics.disable_color_printing", "--job.dump_folder", dump]


def run_loom(loom, flavor, batch, seq, warmup, steps, threads, workdir):
    dump = fresh_dump(workdir)
    cmd = [loom] + loom_train_args(flavor, batch, seq, warmup + steps, dump) + \
        ["--metrics.log_freq", "1"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f if "loss" in line]
    if len(lines) != warmup + steps:
        raise SystemExit(f"bench_train: {len(lines)} step rows in {dump}/metrics.jsonl, "
                         f"expected {warmup + steps}")
    timed = [line for line in lines if line["step"] > warmup]
    step_time = sum(line["step_time_s"] for line in timed) / len(timed)
    return {"tokens_per_s": batch * seq / step_time, "step_time_s": step_time,
            "process_start_to_first_step_s": lines[0]["since_start_s"]}


def run_torch(python, flavor, batch, seq, warmup, steps, threads, workdir):
    cmd = [python, os.path.join(ROOT, "tools/reference/llama_reference.py"), "bench",
           "--flavor", flavor, "--batch-size", str(batch), "--seq-len", str(seq),
           "--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="debugmodel", choices=FLAVORS)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--loom", default=os.path.join(ROOT, "build/bin/loom"))
    p.add_argument("--loom-before", help="an older loom binary run as a third arm of each round")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json", help="also write the results here")
    ns = p.parse_args()

    arms = [("loom", run_loom, ns.loom), ("torch", run_torch, ns.python)]
    if ns.loom_before:
        arms.insert(1, ("before", run_loom, ns.loom_before))
    results = {name: [] for name, _, _ in arms}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(ns.rounds):
            for name, fn, exe in arms:
                res = fn(exe, ns.flavor, ns.batch_size, ns.seq_len, ns.warmup, ns.steps, ns.threads, workdir)
                results[name].append(res)
                print(f"round {r + 1} {name:5s}: {res['tokens_per_s']:9.0f} tokens/s, "
                      f"first step done {res['process_start_to_first_step_s']:.2f} s after start",
                      flush=True)
    ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(results["loom"], results["torch"])]
    summary = {
        "flavor": ns.flavor, "batch_size": ns.batch_size, "seq_len": ns.seq_len, "threads": ns.threads,
        "steps": ns.steps, "warmup": ns.warmup, "rounds": ns.rounds,
        "loom_tokens_per_s": statistics.median(x["tokens_per_s"] for x in results["loom"]),
        "torch_tokens_per_s": statistics.median(x["tokens_per_s"] for x in results["torch"]),
        "ratio_median": statistics.median(ratios), "ratios": ratios,
        "loom_first_step_s": statistics.median(x["process_start_to_first_step_s"] for x in results["loom"]),
        "torch_first_step_s": statistics.median(x["process_start_to_first_step_s"] for x in results["torch"]),
    }
    if ns.loom_before:
        after_before = [a["tokens_per_s"] / b["tokens_per_s"]
                        for a, b in zip(results["loom"], results["before"])]
        before_torch = [a["tokens_per_s"] / b["tokens_per_s"]
                        for a, b in zip(results["before"], results["torch"])]
        summary.update({"before_tokens_per_s": statistics.median(x["tokens_per_s"] for x in results["before"]),
                        "before_ratio_median": statistics.median(before_torch),
                        "before_ratios": before_torch,
                        "after_over_before_median": statistics.median(after_before),
                        "after_over_before": after_before})
    print(json.dumps(summary, indent=2))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
