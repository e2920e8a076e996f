#!/usr/bin/env python3
"""Generation speed: `loom generate` (KV cache) vs transformers' generate (eager attention, its
own KV cache) on the same CPU threads, same weights, same prompt ids, float32, greedy.

Trains the chosen flavor for one step with a checkpoint (the weights do not matter for speed),
exports it to Hugging Face format, then per round runs loom and transformers alternately for
each batch size and reports:
  * decode tokens/s: tokens produced by the steps after the first, over their time;
  * prefill tokens/s: prompt tokens over the time of the prefill forward and the first token.
loom's numbers come from its `stats` line on stderr (model loading excluded); transformers' from
timing generate with max_new_tokens=1 (prefill) and max_new_tokens=N (both warmed up).
Every prompt of a batch is the same text (no padding) and --ignore-eos / min_new_tokens make both
generate exactly N tokens per prompt. Timings on a shared machine are noisy: trust the median
ratio over the absolutes.

  .venv/bin/python tools/bench_generate.py [--flavor debugmodel] [--batch-sizes 1,8]
      [--prompt-tokens 128] [--new-tokens 64] [--threads 2] [--rounds 3] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the county jury said friday an investigation of recent primary election produced no "
         "evidence that any irregularities took place in the city hall of atlanta").split()


def loom_env(threads):
    return dict(os.environ, OMP_NUM_THREADS=str(threads))


def make_checkpoint(loom, flavor, work, threads):
    run = os.path.join(work, "run")
    subprocess.run([loom, "train", "--config", f"{ROOT}/configs/llama3_debug.toml",
                    "--model.flavor", flavor, "--job.dump_folder", run, "--training.steps", "1",
                    "--training.seq_len", "512", "--training.local_batch_size", "1",
                    "--training.global_batch_size", "1", "--validation.enable", "false",
                    "--metrics.peak_tflops", "1", "--checkpoint.enable", "true",
                    "--checkpoint.interval", "1"],
                   check=True, env=loom_env(threads), stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)
    hf = os.path.join(work, "hf")
    subprocess.run([loom, "checkpoint", "export", "--to", "hf", f"{run}/checkpoint", hf,
                    "--dtype", "float32"], check=True, stdout=subprocess.DEVNULL)
    return run, hf


def prompt_text(tokens):
    """A text of about `tokens` tokens (every prompt of a batch is this text: no padding)."""
    return " ".join(WORDS[j % len(WORDS)] for j in range(int(tokens * 0.8)))


def run_loom(loom, run, text, batch, new_tokens, threads, work, device):
    path = os.path.join(work, f"prompts_{batch}.jsonl")
    with open(path, "w") as f:
        for _ in range(batch):
            f.write(json.dumps({"prompt": text}) + "\n")
    r = subprocess.run([loom, "generate", "--checkpoint", run, "--prompts", path, "--format",
                        "json", "--batch-size", str(batch), "--max-new-tokens", str(new_tokens),
                        "--ignore-eos", "--device", device],
                       check=True, capture_output=True, text=True, env=loom_env(threads))
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == batch and all(len(line["tokens"]) == new_tokens for line in lines)
    stats = json.loads(r.stderr.split("stats ", 1)[1].splitlines()[0])
    return lines[0]["prompt_ids"], {"decode_tokens_per_s": stats["decode_tokens_per_s"],
                                    "prefill_tokens_per_s": stats["prefill_tokens_per_s"]}


def run_transformers(model, torch, ids, batch, new_tokens, device):
    input_ids = torch.tensor([ids] * batch, device=device)

    def timed(n):
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                 do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                 pad_token_id=0, use_cache=True)
        assert out.shape[1] == input_ids.shape[1] + n
        if device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    timed(2)  # warm-up
    prefill = timed(1)
    full = timed(new_tokens)
    return {"decode_tokens_per_s": batch * (new_tokens - 1) / max(full - prefill, 1e-9),
            "prefill_tokens_per_s": input_ids.numel() / prefill}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="debugmodel", choices=["debugmodel", "100M"])
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu or cuda (both loom and transformers)")
    p.add_argument("--loom", default=os.path.join(ROOT, "build/bin/loom"))
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()
    import torch
    from transformers import LlamaForCausalLM
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as work:
        run, hf = make_checkpoint(args.loom, args.flavor, work, args.threads)
        model = LlamaForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                                 attn_implementation="eager")
        model.eval()
        model.to(args.device)
        text = prompt_text(args.prompt_tokens)
        results = {b: {"loom": [], "transformers": []} for b in batches}
        prompt_tokens = 0
        for round_index in range(args.rounds):
            for b in batches:
                ids, loom_result = run_loom(args.loom, run, text, b, args.new_tokens,
                                            args.threads, work, args.device)
                prompt_tokens = len(ids)
                results[b]["loom"].append(loom_result)
                results[b]["transformers"].append(run_transformers(model, torch, ids, b,
                                                                   args.new_tokens, args.device))
                print(f"round {round_index + 1} batch {b}: loom {results[b]['loom'][-1]}, "
                      f"transformers {results[b]['transformers'][-1]}", file=sys.stderr)
    summary = {}
    for b in batches:
        row = {}
        for kind in ("decode_tokens_per_s", "prefill_tokens_per_s"):
            loom_v = statistics.median(r[kind] for r in results[b]["loom"])
            hf_v = statistics.median(r[kind] for r in results[b]["transformers"])
            ratios = [l[kind] / t[kind] for l, t in zip(results[b]["loom"], results[b]["transformers"])]
            row[kind] = {"loom": round(loom_v, 1), "transformers": round(hf_v, 1),
                         "ratio_median": round(statistics.median(ratios), 2)}
        summary[f"batch_{b}"] = row
    out = {"flavor": args.flavor, "device": args.device, "threads": args.threads, "prompt_tokens": prompt_tokens,
           "new_tokens": args.new_tokens, "rounds": args.rounds, "results": summary}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
