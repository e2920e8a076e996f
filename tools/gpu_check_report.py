#!/usr/bin/env python3
"""The training figures of tools/gpu_check.sh.

  gpu_check_report.py collect RUN METRICS_JSONL   print the run's logged steps, each with "run"
  gpu_check_report.py reference RUN RESULT_JSON    a PyTorch or torchtitan run (llama_reference.py
                                                  bench --json, torchtitan_bench.py --json) as
                                                  one record of RUN
  gpu_check_report.py summary ALL_METRICS_JSONL   Markdown: one row per run, bf16 vs fp32 losses
  gpu_check_report.py same-losses RUN BASE ALL_METRICS_JSONL BOUND
                                                  exit 1 unless RUN's losses equal BASE's within
                                                  BOUND (relative) at every logged step

A run's throughput is the median over its logged steps after the first (which includes start-up
and the allocator's warm-up). The bf16/fp32 comparison pairs the runs named "X bf16" and "X fp32"
and compares their losses step by step (same seed, same data); likewise "X" and
"X + cuda kernels" (loom's CUDA kernels, training.cuda_kernels) and "X + cuda graph" (the step as
one CUDA graph, training.cuda_graph) or "X + libtorch attention" (LibTorch's own attention kernel
order instead of the measured one, training.sdpa_backend) or "X + skip nonfinite" (the
replayed graph's skip of non-finite updates, training.skip_nonfinite_steps), with their
tokens/s ratio. A
run "X (PyTorch eager)" or "X (torch.compile)" is PyTorch on the same model, batch and GPU, and
"X (torchtitan)" or "X (torchtitan compile)" torchtitan's Trainer on them: loom's run "X" is
reported as a ratio of each.
"""
import json
import statistics
import sys


def collect(run, path):
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                if "loss" in record and "tps" in record:  # training steps, not validation lines
                    print(json.dumps({"run": run, **record}))
    return 0


def reference(run, path):
    with open(path) as f:
        result = json.load(f)
    print(json.dumps({"run": run, "step": result["warmup"] + result["steps"],
                      "loss": result["final_loss"], "tps": result["tokens_per_s"],
                      "step_time_s": result["step_time_s"], "mem_peak_gib": result["peak_gib"],
                      "reference": True}))
    return 0


def load(path):
    runs = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                runs.setdefault(record["run"], []).append(record)
    return runs


def median_after_first(steps, key):
    values = [s[key] for s in (steps[1:] or steps) if s.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def summary(path):
    runs = load(path)
    print("\n## Trainings\n")
    print("| run | last step | loss first -> last | tokens/s per GPU | TFLOP/s | MFU % | "
          "step s | peak GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run, steps in runs.items():
        first, last = steps[0], steps[-1]
        print(f"| {run} | {last['step']} | {first['loss']:.4f} -> {last['loss']:.4f} | "
              f"{median_after_first(steps, 'tps'):,.0f} | "
              f"{median_after_first(steps, 'tflops'):.1f} | "
              f"{median_after_first(steps, 'mfu_pct'):.1f} | "
              f"{median_after_first(steps, 'step_time_s'):.3f} | "
              f"{max(s.get('mem_peak_gib') or 0 for s in steps):.1f} |")
    for run in runs:
        if run.endswith(" bf16") and run[:-5] + " fp32" in runs:
            compare(run, runs[run], run[:-5] + " fp32", runs[run[:-5] + " fp32"])
    for variant in (" + cuda kernels", " + cuda graph", " + libtorch attention",
                    " + skip nonfinite"):
        for run in runs:
            if run.endswith(variant) and run[:-len(variant)] in runs:
                base = run[:-len(variant)]
                compare(run, runs[run], base, runs[base])
                ratio = median_after_first(runs[run], "tps") / median_after_first(runs[base], "tps")
                print(f"{run}: {ratio:.3f}x the tokens/s of {base}.")
    for run in runs:
        for suffix in (" (PyTorch eager)", " (torch.compile)", " (torchtitan)",
                       " (torchtitan compile)"):
            if run.endswith(suffix) and run[:-len(suffix)] in runs:
                base = run[:-len(suffix)]
                ratio = median_after_first(runs[base], "tps") / median_after_first(runs[run], "tps")
                print(f"loom {base}: {ratio:.3f}x the tokens/s of {suffix.strip(' ()')}.")
    return 0


def compare(name_a, steps_a, name_b, steps_b):
    losses_b = {s["step"]: s["loss"] for s in steps_b}
    pairs = [(s["step"], s["loss"], losses_b[s["step"]]) for s in steps_a if s["step"] in losses_b]
    if not pairs:
        return
    step, a, b = max(pairs, key=lambda p: abs(p[1] - p[2]))
    print(f"\n{name_a} vs {name_b}: {len(pairs)} logged steps compared; largest loss difference "
          f"{abs(a - b):.4f} at step {step} ({a:.4f} vs {b:.4f}, {abs(a - b) / abs(b):.2%}); "
          f"final {pairs[-1][1]:.4f} vs {pairs[-1][2]:.4f}.")


def same_losses(run, base, path, bound):
    """Exit 1 unless RUN logged BASE's steps with losses within BOUND (relative) at each."""
    runs = load(path)
    if run not in runs or base not in runs:
        print(f"same-losses: {run if run not in runs else base} has no logged steps")
        return 1
    want = {s["step"]: s["loss"] for s in runs[base]}
    got = {s["step"]: s["loss"] for s in runs[run]}
    if sorted(got) != sorted(want):
        print(f"same-losses: {run} logged steps {sorted(got)}, {base} {sorted(want)}")
        return 1
    worst = max(want, key=lambda step: abs(got[step] - want[step]) / abs(want[step]))
    relative = abs(got[worst] - want[worst]) / abs(want[worst])
    verdict = "within" if relative <= bound else "BEYOND"
    print(f"{run} vs {base}: {len(want)} steps, largest relative loss difference {relative:.2e} "
          f"at step {worst} ({got[worst]:.8f} vs {want[worst]:.8f}), {verdict} {bound:g}")
    return 0 if relative <= bound else 1


def main(argv):
    if len(argv) == 6 and argv[1] == "same-losses":
        return same_losses(argv[2], argv[3], argv[4], float(argv[5]))
    if len(argv) == 4 and argv[1] == "collect":
        return collect(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "reference":
        return reference(argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "summary":
        return summary(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
