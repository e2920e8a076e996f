#!/usr/bin/env python3
"""Where a training step's time goes: GEMM, attention, elementwise, optimizer, comm wait, data, other.

loom: runs `loom train --metrics.step_breakdown true` for a few steady-state steps and averages
the per-step categories of metrics.jsonl (loom's own operator timers, src/metrics/
step_breakdown.cpp: each operator's self time on the training thread, classified by the nearest
classified enclosing operator, so the work inside a GEMM or an attention kernel counts as that
kernel); `--top N` lists the operators with most self time from step_breakdown/rank0.json.
`--profiler`: the same split from a LibTorch profiler trace instead (profiling.* keys).
The eager PyTorch reference (--reference: tools/reference/llama_reference.py bench --trace) is
always split from a torch.profiler trace, the only per-operator timer PyTorch exposes.

  gemm        aten::mm / addmm / bmm / baddbmm / addmv / mv (MKL)
  attention   the scaled-dot-product attention kernels, forward and backward
  elementwise every other ATen operator that touches data (norms, RoPE, SwiGLU, loss, copies,
              casts, reductions, embedding, the gradient accumulation of autograd) and loom's
              fused kernels (loom::kernel_* scopes)
  optimizer   clipping and the optimizer step (loom::optimizer scope, Optimizer.step in PyTorch)
  comm_wait   time blocked on collectives (loom::comm_wait scopes: FSDP gathers and
              reduce-scatters, DDP buckets, the step's small all-reduces)
  data        loom::data scope: taking the step's microbatches from the loader
  other       the rest of the step: the training loop, autograd's engine, shape-only ATen
              operators (view, reshape, transpose, empty...), dispatch

`overhead` = 1 - (gemm + attention) / step: the share of the step that is not the physical
limit (issue #20's target is < 15%). A profiler trace overstates it: the profiler costs a few
microseconds per operator, and its event records fragment the heap, so later layers' big
activations come from fresh pages and page-fault inside the kernels that first write them
(loom's fused SwiGLU backward measured 2-3x slower in a trace than under the timers). Compare
like with like: timers with timers, traces with traces.

  .venv/bin/python tools/step_breakdown.py [--flavor debugmodel] [--reference] [--top N] [--json OUT]
  .venv/bin/python tools/step_breakdown.py --profiler ...            # loom from a trace too
  .venv/bin/python tools/step_breakdown.py --trace some/rank0_trace.json   # an existing trace
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from bench_train import FLAVORS, fresh_dump, loom_train_args  # noqa: E402

CATEGORIES = ["gemm", "attention", "elementwise", "optimizer", "comm_wait", "data", "other"]
# The same rules as loom's timers (src/metrics/step_breakdown.cpp: enclosing_category and
# leaf_category), for profiler traces of loom or eager PyTorch: change both together.
GEMM = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::addmv",
        "aten::mv", "aten::_mkldnn_matmul"}
SHAPE_ONLY = {"aten::view", "aten::reshape", "aten::_reshape_alias", "aten::t", "aten::transpose",
              "aten::permute", "aten::expand", "aten::as_strided", "aten::slice", "aten::select",
              "aten::narrow", "aten::unsqueeze", "aten::squeeze", "aten::flatten", "aten::unflatten",
              "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::detach",
              "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::view_as_real",
              "aten::view_as_complex", "aten::_unsafe_view", "aten::resolve_conj",
              "aten::resolve_neg", "aten::contiguous", "aten::to", "aten::_to_copy_view",
              "aten::result_type", "aten::split", "aten::chunk", "aten::unbind", "aten::set_",
              "aten::split_with_sizes", "aten::expand_as", "aten::view_as"}


def classify(name):
    """The category an operator's name decides, or None (decided by an enclosing operator)."""
    if name in GEMM:
        return "gemm"
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if name.startswith("loom::comm_wait"):
        return "comm_wait"
    if name.startswith("loom::optimizer") or name.startswith("Optimizer.step") or \
            name.startswith("Optimizer.zero_grad") or "clip_grad" in name:
        return "optimizer"
    if name.startswith("loom::data"):
        return "data"
    return None


def leaf_category(name):
    """For self time no enclosing operator classified."""
    if name in SHAPE_ONLY:
        return "other"
    if name.startswith("aten::") or name.startswith("loom::kernel") or \
            name.startswith("torch::autograd::AccumulateGrad"):
        return "elementwise"
    return "other"


def breakdown(trace_path, top_ops=0):
    """Per-step mean milliseconds by category, from a Chrome trace with ProfilerStep#N events."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    if not steps:
        raise SystemExit(f"step_breakdown: no ProfilerStep#N events in {trace_path}")
    thread = (steps[0]["pid"], steps[0]["tid"])
    ops = [e for e in events if (e["pid"], e["tid"]) == thread and e.get("cat") != "python_function"]
    ops.sort(key=lambda e: (e["ts"], -e["dur"]))
    totals = dict.fromkeys(CATEGORIES, 0.0)
    step_us = 0.0
    stack = []  # (event, end, decided category, child time)
    self_time = {}
    by_op = {}  # (category, name) -> self microseconds

    def close(entry):
        event, end, decided, children = entry
        own = max(0.0, event["dur"] - children)
        if event["name"].startswith("ProfilerStep#"):
            return  # the step's own self time is "other", computed as the remainder
        cat = decided or leaf_category(event["name"])
        self_time[cat] = self_time.get(cat, 0.0) + own
        key = (cat, event["name"])
        by_op[key] = by_op.get(key, 0.0) + own

    for e in ops:
        while stack and e["ts"] >= stack[-1][1]:
            close(stack.pop())
        if not stack and not e["name"].startswith("ProfilerStep#"):
            continue  # outside a recorded step
        if stack:
            stack[-1][3] += e["dur"]
        decided = stack[-1][2] if stack else None
        decided = decided or classify(e["name"])
        stack.append([e, e["ts"] + e["dur"], decided, 0.0])
    while stack:
        close(stack.pop())
    step_us = sum(s["dur"] for s in steps)
    for cat, us in self_time.items():
        totals[cat] += us
    totals["other"] = step_us - sum(v for k, v in totals.items() if k != "other")
    n = len(steps)
    result = {"steps": n, "step_ms": step_us / n / 1e3, "source": "profiled"}
    for cat in CATEGORIES:
        result[cat + "_ms"] = totals[cat] / n / 1e3
        result[cat + "_pct"] = 100.0 * totals[cat] / step_us
    result["overhead_pct"] = 100.0 - result["gemm_pct"] - result["attention_pct"]
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:top_ops]
    result["top_ops"] = [{"category": c, "name": name, "ms": us / n / 1e3} for (c, name), us in top]
    return result


def run_loom(ns, workdir, total, extra):
    dump = fresh_dump(workdir)
    cmd = [ns.loom] + loom_train_args(ns.flavor, ns.batch_size, ns.seq_len, total, dump) + \
        extra + ns.loom_args
    env = dict(os.environ, OMP_NUM_THREADS=str(ns.threads))
    if ns.nproc > 1:
        cmd = [ns.loom, "launch", "--nproc-per-node", str(ns.nproc), "--"] + cmd[1:]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return dump


def loom_timers(ns, workdir):
    """Means of metrics.jsonl's breakdown/* over the steps after the warm-up."""
    total = ns.warmup + ns.steps
    dump = run_loom(ns, workdir, total, ["--metrics.step_breakdown", "true", "--metrics.log_freq", "1"])
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r.get("step", 0) > ns.warmup and "breakdown/gemm_ms" in r]
    if len(rows) != ns.steps:
        raise SystemExit(f"step_breakdown: expected {ns.steps} breakdown rows, read {len(rows)}")
    n = len(rows)
    result = {"steps": n, "source": "timed"}
    for cat in CATEGORIES:
        result[cat + "_ms"] = sum(r[f"breakdown/{cat}_ms"] for r in rows) / n
    result["step_ms"] = sum(result[cat + "_ms"] for cat in CATEGORIES)  # "other" is the rest
    for cat in CATEGORIES:
        result[cat + "_pct"] = 100.0 * result[cat + "_ms"] / result["step_ms"]
    result["overhead_pct"] = 100.0 - result["gemm_pct"] - result["attention_pct"]
    with open(os.path.join(dump, "step_breakdown", "rank0.json")) as f:
        last = json.load(f)  # the last step's operators
    result["top_ops"] = [{"category": op["category"], "name": op["name"], "ms": op["ms_per_step"]}
                         for op in last["operators"][:ns.top]]
    return result


def loom_trace(ns, workdir):
    total = ns.warmup + ns.steps
    dump = run_loom(ns, workdir, total, [
        "--metrics.log_freq", str(total), "--profiling.enable_profiling",
        "--profiling.profile_freq", str(total), "--profiling.profiler_active", str(ns.steps),
        "--profiling.profiler_warmup", str(min(ns.warmup, 1))])
    traces = sorted(glob.glob(os.path.join(dump, "profile_traces", "*", "rank0_trace.json")))
    if not traces:
        raise SystemExit("step_breakdown: loom wrote no trace")
    return traces[-1]


def reference_trace(ns, workdir):
    args_path = os.path.join(workdir, "args.json")
    with open(args_path, "w") as f:
        json.dump(dict(FLAVORS[ns.flavor], max_seq_len=ns.seq_len, use_scaled_rope=True), f)
    trace = os.path.join(workdir, "reference_trace.json")
    cmd = [ns.python, os.path.join(ROOT, "tools/reference/llama_reference.py"), "bench",
           "--model-args", args_path, "--batch-size", str(ns.batch_size), "--seq-len",
           str(ns.seq_len), "--steps", str(ns.steps), "--warmup", str(ns.warmup), "--threads",
           str(ns.threads), "--trace", trace]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return trace


def print_table(name, r):
    print(f"{name}: {r['steps']} steps, {r['step_ms']:.1f} ms per step ({r['source']})")
    for cat in CATEGORIES:
        print(f"  {cat:12s} {r[cat + '_ms']:8.1f} ms  {r[cat + '_pct']:5.1f}%")
    print(f"  overhead (not GEMM or attention): {r['overhead_pct']:.1f}%")
    for op in r["top_ops"]:
        print(f"    {op['ms']:8.2f} ms  {op['category']:11s} {op['name']}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", help="break down this existing trace instead of running anything")
    p.add_argument("--flavor", default="debugmodel", choices=sorted(FLAVORS))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="steps recorded")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--nproc", type=int, default=1, help="ranks (loom launch); rank 0 is reported")
    p.add_argument("--reference", action="store_true", help="also break down eager PyTorch")
    p.add_argument("--profiler", action="store_true",
                   help="loom from a profiler trace instead of its operator timers")
    p.add_argument("--loom", default=os.path.join(ROOT, "build/bin/loom"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--top", type=int, default=0, help="also list the N operators with most self time")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("loom_args", nargs="*", help="extra `loom train` arguments (after --)")
    ns = p.parse_args()
    results = {}
    if ns.trace:
        results["trace"] = breakdown(ns.trace, ns.top)
    else:
        with tempfile.TemporaryDirectory() as workdir:
            if ns.profiler:
                results["loom"] = breakdown(loom_trace(ns, workdir), ns.top)
            else:
                results["loom"] = loom_timers(ns, workdir)
            if ns.reference:
                results["torch"] = breakdown(reference_trace(ns, workdir), ns.top)
    for name, r in results.items():
        print_table(name, r)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
