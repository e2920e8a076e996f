#!/usr/bin/env python3
"""Muon against AdamW on one job: a small learning-rate sweep of each, then how many steps each
Muon setting takes to reach the best AdamW run's final validation loss.

A benchmark, not a test (docs/optimizers.md records its numbers). Every run is the same job
(`--config`, default the Llama-3 debug model on the embedded corpus) with only the optimizer
settings changed; validation every `--val-freq` steps gives the loss curve (the same held-out
batches at every point, so the runs compare without batch noise).

  python3 tools/optimizer_sweep.py --loom build/bin/loom --steps 200 \
      --adamw-lrs 1e-3,3e-3,1e-2 --muon-lrs 1e-3,3e-3,1e-2 --parallel 2
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys


def run(loom, config, folder, steps, val_freq, optimizer, lr, extra):
    """One `loom train`; returns {step: val_loss}."""
    args = [loom, "train", "--config", config, "--job.dump_folder", folder,
            "--training.steps", str(steps), "--validation.enable", "true",
            "--validation.freq", str(val_freq), "--metrics.log_freq", str(val_freq),
            "--optimizer.name", optimizer, "--optimizer.lr", str(lr)] + extra
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    done = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    curve = {}
    with open(os.path.join(folder, "metrics.jsonl")) as rows:
        for line in rows:
            row = json.loads(line)
            if "val_loss" in row:
                curve[int(row["step"])] = float(row["val_loss"])
    if not curve:
        sys.exit(f"{folder}/metrics.jsonl holds no val_loss row")
    return curve


def first_step_at_or_below(curve, target):
    for step in sorted(curve):
        if curve[step] <= target:
            return step
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loom", default="build/bin/loom")
    p.add_argument("--config", default="configs/llama3_debug.toml")
    p.add_argument("--out", default="outputs/optimizer_sweep")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--val-freq", type=int, default=20)
    p.add_argument("--adamw-lrs", default="1e-3,3e-3,1e-2")
    p.add_argument("--muon-lrs", default="1e-3,3e-3,1e-2")
    p.add_argument("--muon-rule", default="match_rms_adamw",
                   help="optimizer.muon_adjust_lr_fn (match_rms_adamw keeps AdamW's lr scale)")
    p.add_argument("--parallel", type=int, default=1, help="runs at once (one thread each)")
    a = p.parse_args()

    plan = [("AdamW", float(lr), []) for lr in a.adamw_lrs.split(",")]
    plan += [("Muon", float(lr), ["--optimizer.muon_adjust_lr_fn", a.muon_rule,
                                  "--optimizer.muon_ns_dtype", "float32"])
             for lr in a.muon_lrs.split(",")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.parallel) as pool:
        futures = {
            (name, lr): pool.submit(run, a.loom, a.config,
                                    os.path.join(a.out, f"{name.lower()}_lr{lr:g}"), a.steps,
                                    a.val_freq, name, lr, extra)
            for name, lr, extra in plan}
        curves = {key: f.result() for key, f in futures.items()}

    steps = sorted(next(iter(curves.values())))
    print("| optimizer | lr | " + " | ".join(f"val {s}" for s in steps) + " |")
    print("|---|---|" + "---|" * len(steps))
    for (name, lr), curve in curves.items():
        print(f"| {name} | {lr:g} | " + " | ".join(f"{curve.get(s, float('nan')):.3f}"
                                                   for s in steps) + " |")
    best_adamw = min((c[max(c)], lr) for (n, lr), c in curves.items() if n == "AdamW")
    print(f"\nbest AdamW: lr {best_adamw[1]:g}, val_loss {best_adamw[0]:.4f} at step {a.steps}")
    for (name, lr), curve in curves.items():
        if name != "Muon":
            continue
        step = first_step_at_or_below(curve, best_adamw[0])
        print(f"Muon lr {lr:g}: " + (f"reaches it at step {step}" if step is not None else
                                      f"does not reach it in {a.steps} steps "
                                      f"(final {curve[max(curve)]:.4f})"))


if __name__ == "__main__":
    main()
