#!/usr/bin/env python3
"""Checks `loom plan`'s predictions against real runs on this machine's CPU ranks.

    python3 tools/plan_check.py [--loom build/bin/loom] [--out /tmp/plan_check] [--steps 8]

1. `loom plan layout --device cpu --calibrate` on the debug model (world 4) fits the CPU
   profile and saves it (<out>/cpu_calibrated.toml).
2. For each layout below: the prediction (`loom plan memory --format json`: peak_bytes of the
   rank that writes metrics.jsonl, step_seconds) and a measurement (`loom launch
   --nproc-per-node N -- train ...`: the fastest step_time_s of steps 3+, mem_peak_gib of rank 0).
3. The planner's first layout on 4 ranks is measured too and compared with the fastest
   measured 4-rank layout.
Prints a Markdown table (docs/planning.md keeps one). Benchmarks on a shared machine are noisy:
run it on a quiet machine, and read the load average it prints.

As a check (ctest's plan_check_held_out, slow label): --layouts picks layouts the calibration
never ran (it runs 1 rank with and without AC, FSDP 2 and 4, TP 2), and --max-peak-error /
--max-step-error make it exit 1 when a prediction misses the measurement by more than that many
percent.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

DEBUG = "configs/llama3_debug.toml"
# (name, config, world, overrides); the 4-rank layouts share global batch 8.
LAYOUTS = [
    ("1 rank", DEBUG, 1, "--training.local_batch_size 4 --training.global_batch_size 4"),
    ("FSDP 2", DEBUG, 2, "--training.local_batch_size 4 --training.global_batch_size 8"),
    ("TP 2", DEBUG, 2, "--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 "
     "--training.local_batch_size 4 --training.global_batch_size 4"),
    ("PP 2 1F1B", DEBUG, 2, "--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 "
     "--parallelism.pipeline_parallel_schedule 1F1B --training.local_batch_size 4 --training.global_batch_size 4"),
    ("FSDP 4", DEBUG, 4, "--training.local_batch_size 2 --training.global_batch_size 8"),
    ("FSDP 4, AC full", DEBUG, 4, "--training.local_batch_size 2 --training.global_batch_size 8 "
     "--activation_checkpoint.mode full"),
    ("HSDP 2x2", DEBUG, 4, "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2 "
     "--training.local_batch_size 2 --training.global_batch_size 8"),
    ("TP 2 x FSDP 2, AC selective 2", DEBUG, 4, "--parallelism.tensor_parallel_degree 2 "
     "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option 2 "
     "--training.local_batch_size 4 --training.global_batch_size 8"),
    ("PP 2 GPipe x FSDP 2", DEBUG, 4, "--parallelism.pipeline_parallel_degree 2 "
     "--parallelism.pipeline_parallel_schedule GPipe --training.local_batch_size 4 --training.global_batch_size 8"),
    ("PP 2 Interleaved1F1B x DP 2", DEBUG, 4, "--parallelism.pipeline_parallel_degree 2 "
     "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1 "
     "--parallelism.pipeline_parallel_schedule Interleaved1F1B --training.local_batch_size 4 --training.global_batch_size 8"),
    ("PP 2 InterleavedZeroBubble x TP 2", DEBUG, 4, "--parallelism.pipeline_parallel_degree 2 "
     "--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 "
     "--parallelism.pipeline_parallel_schedule InterleavedZeroBubble --training.local_batch_size 4 --training.global_batch_size 4"),
    ("3-D: PP 2 x FSDP 2 x TP 2", DEBUG, 8, "--parallelism.pipeline_parallel_degree 2 "
     "--parallelism.tensor_parallel_degree 2 --training.local_batch_size 4 --training.global_batch_size 8"),
]
COMMON = "--validation.enable false --checkpoint.enable false --metrics.enable_tensorboard false " \
         "--profiling.enable_profiling false --metrics.log_freq 1"


def run(cmd, log=None):
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if log:
        with open(log, "w") as f:
            f.write(out.stdout + out.stderr)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {cmd}\n{out.stderr[-2000:]}")
    return out.stdout


def predict(loom, profile, config, world, overrides):
    j = json.loads(run(f"{loom} plan memory --config {config} --world-size {world} --device {profile} "
                       f"--format json {overrides} 2>/dev/null"))
    # metrics.jsonl is rank 0's: the first pipeline rank's memory.
    peaks = j.get("pipeline_rank_peak_bytes") or [j["peak_bytes"]]
    return peaks[0], j["step_seconds"]


def measure(loom, config, world, overrides, folder, steps, reuse=False):
    done = os.path.join(folder, "done")
    if not (reuse and os.path.exists(done)):
        measure_run(loom, config, world, overrides, folder, steps)
        open(done, "w").write("1\n")
    return read_metrics(folder)


def measure_run(loom, config, world, overrides, folder, steps):
    run(f"{loom} launch --nproc-per-node {world} --master-port 0 -- train --config {config} "
        f"{overrides} {COMMON} --training.steps {steps} --job.dump_folder {folder}", log=folder + ".log")


def read_metrics(folder):
    times, peak = [], 0.0
    for line in open(os.path.join(folder, "metrics.jsonl")):
        j = json.loads(line)
        if "loss" not in j or "step_time_s" not in j:
            continue
        peak = j["mem_peak_gib"] * 2**30
        if j["step"] > 2:
            times.append(j["step_time_s"])
    # The fastest step past the second: other processes on a shared machine only add time.
    return peak, min(times)


def layout_overrides(layout):
    keys = {
        "pipeline_parallel_degree": "parallelism", "data_parallel_replicate_degree": "parallelism",
        "data_parallel_shard_degree": "parallelism", "context_parallel_degree": "parallelism",
        "tensor_parallel_degree": "parallelism", "pipeline_parallel_schedule": "parallelism",
        "pipeline_parallel_microbatch_size": "parallelism", "local_batch_size": "training"}
    out = [f"--{section}.{key} {layout[key]}" for key, section in keys.items() if key in layout]
    out.append(f"--training.global_batch_size "
               f"{layout['local_batch_size'] * layout['data_parallel_replicate_degree'] * layout['data_parallel_shard_degree'] * layout['gradient_accumulation_steps']}")
    out.append(f"--activation_checkpoint.mode {layout['activation_checkpoint_mode']}")
    out.append(f"--activation_checkpoint.selective_ac_option {layout['selective_ac_option']}")
    return " ".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default="build/bin/loom")
    ap.add_argument("--out", default="/tmp/plan_check")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--reuse", action="store_true",
                    help="read finished runs in --out again (refit and re-predict without rerunning)")
    ap.add_argument("--layouts", default="",
                    help="comma-separated names of LAYOUTS to measure (default: all, and the planner's first)")
    ap.add_argument("--max-peak-error", type=float, default=None, help="percent; exit 1 beyond it")
    ap.add_argument("--max-step-error", type=float, default=None, help="percent; exit 1 beyond it")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    print("load before:", os.getloadavg())
    profile = os.path.join(a.out, "cpu_calibrated.toml")
    print(run(f"{a.loom} plan layout --config {DEBUG} --world-size 4 --device cpu --calibrate "
              f"--calibration-steps {a.steps} --save-profile {profile} --top 5 "
              f"--calibration-dir {os.path.join(a.out, 'calibration')} "
              f"--training.global_batch_size 8 --training.local_batch_size 4 2>/dev/null"))
    if a.layouts:
        wanted = [n.strip() for n in a.layouts.split(",")]
        unknown = [n for n in wanted if n not in [l[0] for l in LAYOUTS]]
        if unknown:
            sys.exit(f"--layouts: unknown {unknown}; known: {[l[0] for l in LAYOUTS]}")
        layouts = [l for l in LAYOUTS if l[0] in wanted]
    else:
        best = json.loads(run(f"{a.loom} plan layout --config {DEBUG} --world-size 4 --device {profile} "
                              f"--format json --training.global_batch_size 8 2>/dev/null"))["layouts"][0]
        layouts = LAYOUTS + [("planner's first on 4 ranks", DEBUG, 4, layout_overrides(best))]
    # Every layout --repeats times, round-robin, keeping the fastest (and the first run's peak).
    measured = {}
    for rep in range(a.repeats):
        for i, (name, config, world, overrides) in enumerate(layouts):
            tag = (f"run{LAYOUTS.index(layouts[i])}" if layouts[i] in LAYOUTS
                   else "first-" + hashlib.md5(overrides.encode()).hexdigest()[:8])
            peak, step = measure(a.loom, config, world, overrides, os.path.join(a.out, f"{tag}-{rep}"), a.steps,
                                  a.reuse)
            old = measured.get(i)
            measured[i] = (old[0] if old else peak, min(step, old[1]) if old else step)
            print(f"pass {rep + 1}: {name}: {peak / 2**30:.3f} GiB, {step:.3f} s", flush=True)
    rows = []
    for i, (name, config, world, overrides) in enumerate(layouts):
        p_peak, p_step = predict(a.loom, profile, config, world, overrides)
        m_peak, m_step = measured[i]
        rows.append((name, world, overrides, p_peak, m_peak, p_step, m_step))
    print("\nload after:", os.getloadavg())
    print("\n| layout | ranks | predicted peak GiB | measured | error | predicted step s | measured | error |")
    print("|---|---|---|---|---|---|---|---|")
    for name, world, _, pp, mp, ps, ms in rows:
        print(f"| {name} | {world} | {pp / 2**30:.3f} | {mp / 2**30:.3f} | {100 * (pp - mp) / mp:+.1f}% "
              f"| {ps:.3f} | {ms:.3f} | {100 * (ps - ms) / ms:+.1f}% |")
    if not a.layouts:
        four = [r for r in rows if r[1] == 4 and "global_batch_size 8" in r[2]]
        fastest = min(four, key=lambda r: r[6])
        first = rows[-1]
        print(f"\nplanner's first on 4 ranks: {first[2]}\n  measured {first[6]:.3f} s; fastest measured 4-rank "
              f"layout: {fastest[0]} {fastest[6]:.3f} s ({100 * (first[6] - fastest[6]) / fastest[6]:+.1f}%)")
    misses = []
    for name, _, _, pp, mp, ps, ms in rows:
        if a.max_peak_error is not None and abs(100 * (pp - mp) / mp) > a.max_peak_error:
            misses.append(f"{name}: peak {100 * (pp - mp) / mp:+.1f}% (bound {a.max_peak_error}%)")
        if a.max_step_error is not None and abs(100 * (ps - ms) / ms) > a.max_step_error:
            misses.append(f"{name}: step {100 * (ps - ms) / ms:+.1f}% (bound {a.max_step_error}%)")
    if misses:
        sys.exit("predictions off the measurements:\n  " + "\n  ".join(misses))


if __name__ == "__main__":
    main()
