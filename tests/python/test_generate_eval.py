#!/usr/bin/env python3
"""`loom eval` and `loom generate` agree with transformers on the Hugging Face export of the same
checkpoint.

Trains a debug model (llama3 by default; --config configs/qwen3_debug.toml for Qwen3 with tied
embeddings) on 2 ranks with FSDP (so the checkpoint is sharded), exports it to Hugging Face format
in float32 and checks, against transformers' class for it (LlamaForCausalLM, Qwen3ForCausalLM;
eager attention):
  * perplexity over sliding windows of new texts (the windows of docs/generate_eval.md,
    computed here independently) within 1e-4 relative;
  * greedy generation with the KV cache emits exactly transformers' greedy tokens for several
    prompts (transformers' generate with its own cache), with the trained weights and with
    seeded noise added to them (the trained ones repeat ' the'; the noisy ones vary);
  * batched prompts of different lengths give the same tokens as one by one;
  * loading the Hugging Face folder itself gives the same tokens and perplexity as the native
    checkpoint;
  * with --config-layouts: the folder with its config.json rewritten in transformers 5's layout
    (rope_parameters, no top-level rope_theta), for the trained RoPE and for a non-default theta
    without scaling, evaluates within 1e-5 of transformers on the same model (in 4's layout,
    which this transformers reads), and theta 10000 would be noticed (the slow label's runs;
    the Hf* unit suites read transformers 5's own files in the default suite).
--config picks the job (its model family) trained when no --checkpoint is given.
A missing transformers fails the test (scripts/setup.sh installs it).

Usage: test_generate_eval.py LOOM_BINARY WORK_DIR [--config TOML] [--checkpoint STEP_DIR]
                             [--texts FILE.jsonl] [--prompts FILE.jsonl] [--config-layouts]
--checkpoint checks an existing native step folder instead of training one (its config.toml
names the tokenizer; brown_bpe is assumed for the special-token ids); --texts / --prompts replace
the built-in texts and prompts ({"text": ...} / {"prompt": ...} lines).
"""
import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = [
    "The harbor master wrote down every ship that entered the bay before the storm.",
    "Farmers in the valley argued about the new road, and the council voted twice.",
    "She opened the old piano and played a tune nobody in the house had heard.",
]
PROMPTS = ["The governor said", "In the first week of the trial", "Water", "Most of the men"]
NEW_TOKENS = 20


def run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def special_ids():
    added = json.load(open(f"{ROOT}/assets/tokenizer/brown_bpe_4k.json"))["added_tokens"]
    ids = {t["content"]: t["id"] for t in added}
    return ids["<|begin_of_text|>"], ids["<|end_of_text|>"], ids["<|pad|>"]


def loom_windows(n, seq_len, stride):
    """(begin, end, first_scored) as docs/generate_eval.md defines sliding windows."""
    windows, predicted, begin = [], 0, 0
    while predicted < n - 1:
        end = min(begin + seq_len, n - 1)
        windows.append((begin, end, max(predicted + 1, begin + 1)))
        predicted = end
        begin += stride
    return windows


def main():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception as e:  # a missing or broken transformers fails: a skip hides a broken setup
        print(f"FAILED: {type(e).__name__}: {e} (scripts/setup.sh installs transformers into .venv)")
        return 1
    p = argparse.ArgumentParser()
    p.add_argument("loom")
    p.add_argument("work")
    p.add_argument("--config", default=f"{ROOT}/configs/llama3_debug.toml")
    p.add_argument("--checkpoint")
    p.add_argument("--texts")
    p.add_argument("--prompts")
    p.add_argument("--config-layouts", action="store_true")
    a = p.parse_args()
    loom, work = a.loom, a.work
    texts = [json.loads(l)["text"] for l in open(a.texts) if l.strip()] if a.texts else TEXTS
    prompt_list = ([json.loads(l)["prompt"] for l in open(a.prompts) if l.strip()]
                   if a.prompts else PROMPTS)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    step = a.checkpoint or train(loom, work, a.config)
    failures = check(loom, work, step, texts, prompt_list, a.config_layouts)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK: loom eval and generate match transformers")
    return 0


def train(loom, work, config):
    """24 steps of the debug model on 2 FSDP ranks: the checkpoint is two ranks' shards."""
    run(loom, "launch", "--nproc-per-node", "2", "--master-port", str(free_port()), "--",
        "train", "--config", config, "--job.dump_folder", work,
        "--training.steps", "24", "--training.seq_len", "64", "--training.local_batch_size", "2",
        "--training.global_batch_size", "4", "--parallelism.data_parallel_shard_degree", "2",
        "--validation.enable", "false", "--metrics.peak_tflops", "1", "--debug.seed", "5",
        "--checkpoint.enable", "true", "--checkpoint.interval", "24")
    step = f"{work}/checkpoint/step-24"
    index = json.load(open(f"{step}/index.json"))
    assert index["world_size"] == 2, index["world_size"]
    return step


def check(loom, work, step, texts, prompt_list, config_layouts):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM
    hf = f"{work}/hf"
    run(loom, "checkpoint", "export", "--to", "hf", step, hf, "--dtype", "float32")
    bos, eos, pad = special_ids()
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                                 attn_implementation="eager")
    print(f"transformers class: {type(model).__name__}")
    model.eval()
    failures = []

    # Perplexity over sliding windows, each document alone.
    docs = f"{work}/texts.jsonl"
    with open(docs, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    seq_len, stride = 12, 5
    result = json.loads(run(loom, "eval", "--checkpoint", step, "--dataset", docs, "--seq-len",
                            str(seq_len), "--stride", str(stride), "--per-document",
                            "--batch-size", "3"))
    documents = [[bos] + json.loads(run(loom, "tokenize", "--tokenizer", "brown_bpe", "--text",
                                        text, "--format", "json")) + [eos] for text in texts]

    def transformers_perplexity(model):
        """Perplexity over the same sliding windows as loom eval; and the tokens scored."""
        nll, count = 0.0, 0
        with torch.no_grad():
            for ids in documents:
                for begin, end, first in loom_windows(len(ids), seq_len, stride):
                    logits = model(torch.tensor([ids[begin:end]])).logits[0].double()
                    targets = torch.tensor(ids[begin + 1:end + 1])
                    losses = F.cross_entropy(logits, targets, reduction="none")
                    keep = first - (begin + 1)
                    nll += losses[keep:].sum().item()
                    count += len(targets) - keep
        return math.exp(nll / count), count

    ppl, count = transformers_perplexity(model)
    rel = abs(result["perplexity"] - ppl) / ppl
    print(f"perplexity: loom {result['perplexity']:.6f}, transformers {ppl:.6f} "
          f"({count} tokens; loom {result['tokens']}), relative difference {rel:.2e}")
    if result["tokens"] != count or rel > 1e-4:
        failures.append("perplexity differs from transformers'")
    from_hf_folder = json.loads(run(loom, "eval", "--checkpoint", hf, "--tokenizer", "brown_bpe",
                                    "--dataset", docs, "--seq-len", str(seq_len), "--stride",
                                    str(stride), "--per-document"))
    if abs(from_hf_folder["perplexity"] - result["perplexity"]) > 1e-6 * ppl:
        failures.append(f"eval of the Hugging Face folder gives perplexity "
                        f"{from_hf_folder['perplexity']}, the native checkpoint "
                        f"{result['perplexity']}")

    if config_layouts:
        failures += check_config_layouts(loom, work, hf, docs, seq_len, stride,
                                         transformers_perplexity)

    # Greedy generation: batched (prompts of different lengths) and one by one.
    prompts = f"{work}/prompts.jsonl"
    with open(prompts, "w") as f:
        for p in prompt_list:
            f.write(json.dumps({"prompt": p}) + "\n")
    common = ["generate", "--prompts", prompts, "--format", "json", "--max-new-tokens",
              str(NEW_TOKENS)]
    batched = [json.loads(l) for l in run(loom, *common, "--checkpoint", step,
                                          "--batch-size", "4").splitlines()]
    single = [json.loads(l) for l in run(loom, *common, "--checkpoint", step,
                                         "--batch-size", "1").splitlines()]
    from_hf = [json.loads(l) for l in run(loom, *common, "--checkpoint", hf, "--tokenizer",
                                          "brown_bpe", "--batch-size", "2").splitlines()]
    for i, p in enumerate(prompt_list):
        ids = batched[i]["prompt_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=pad,
                                 use_cache=True)
        reference = out[0, len(ids):].tolist()
        same = batched[i]["tokens"] == reference
        print(f"prompt {p!r}: {len(reference)} tokens, loom == transformers: {same}; "
              f"batched == one by one: {batched[i]['tokens'] == single[i]['tokens']}; "
              f"HF folder == native: {from_hf[i]['tokens'] == batched[i]['tokens']}")
        if not same:
            failures.append(f"greedy tokens differ for {p!r}: loom {batched[i]['tokens']} "
                            f"transformers {reference}")
        if batched[i]["tokens"] != single[i]["tokens"]:
            failures.append(f"batched differs from one by one for {p!r}")
        if from_hf[i]["tokens"] != batched[i]["tokens"]:
            failures.append(f"the Hugging Face folder generates differently for {p!r}")
    failures += check_varied_generation(loom, work, hf, prompts, [b["prompt_ids"] for b in batched],
                                        eos, pad)
    return failures


def check_varied_generation(loom, work, hf, prompts, prompt_ids, eos, pad):
    """24 steps leave the debug models repeating their most frequent token (' the'), which a
    wrong cache or RoPE would repeat as well. The export's weights with seeded noise (3x each
    tensor's spread, at least fan_in^-0.5 so the depth-scaled projections count; norms kept)
    generate varied tokens: `loom generate` on that folder must emit transformers' greedy tokens
    there too."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    noisy = f"{work}/noisy"
    os.makedirs(noisy)
    generator = torch.Generator().manual_seed(0)
    weights = {k: v if k.endswith("norm.weight")
               else v + max(3 * v.std().item(), v.shape[-1] ** -0.5)
               * torch.randn(v.shape, generator=generator)
               for k, v in sorted(load_file(f"{hf}/model.safetensors").items())}
    save_file(weights, f"{noisy}/model.safetensors", metadata={"format": "pt"})
    for f in os.listdir(hf):
        if f != "model.safetensors":
            os.symlink(f"{hf}/{f}", f"{noisy}/{f}")
    model = AutoModelForCausalLM.from_pretrained(noisy, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    got = [json.loads(l) for l in run(loom, "generate", "--prompts", prompts, "--format", "json",
                                      "--max-new-tokens", str(NEW_TOKENS), "--checkpoint", noisy,
                                      "--tokenizer", "brown_bpe", "--batch-size", "4").splitlines()]
    failures = []
    for ids, row in zip(prompt_ids, got):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                                 do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos,
                                 pad_token_id=pad, use_cache=True)
        reference = out[0, len(ids):].tolist()
        print(f"noisy weights, prompt ids {ids}: {len(set(reference))} distinct tokens of "
              f"{len(reference)}, loom == transformers: {row['tokens'] == reference}")
        if row["tokens"] != reference:
            failures.append(f"noisy weights: greedy tokens differ after {ids}: loom "
                            f"{row['tokens']} transformers {reference}")
        if len(set(reference)) < 5:
            failures.append(f"noisy weights: transformers generates only {set(reference)} after "
                            f"{ids}; the comparison would not see the cache's positions")
    return failures


def rope_variant(exported, layout, theta, llama3):
    """The export's config.json with its RoPE written as transformers `layout` (4 or 5) writes
    it: 4 has a top-level rope_theta (and rope_scaling), 5 a rope_parameters dict holding both."""
    config = {k: v for k, v in exported.items()
              if k not in ("rope_theta", "rope_scaling", "rope_parameters")}
    scaling = dict(exported["rope_scaling"]) if llama3 else None
    if layout == 4:
        config["rope_theta"] = theta
        if scaling:
            config["rope_scaling"] = scaling
    else:
        config["rope_parameters"] = {**(scaling or {"rope_type": "default"}), "rope_theta": theta}
    return config


def check_config_layouts(loom, work, hf, docs, seq_len, stride, transformers_perplexity):
    """`loom eval` on the export rewritten in transformers 5's layout (rope_parameters, no
    top-level rope_theta) equals transformers on the same model in 4's layout within 1e-5 (this
    venv's transformers 4 does not read rope_parameters), for the trained RoPE (llama3, theta
    500000) and a non-default theta without scaling; and that theta is far enough from 10000,
    the value loom used to read from such a config, for the comparison to notice."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    exported = json.load(open(f"{hf}/config.json"))
    failures = []
    # 24 steps teach the debug model little about positions: with its own weights theta 10000
    # moves the perplexity by under 1e-5. Queries and keys 4x larger sharpen attention so that
    # the RoPE shows (both sides read the same weights); with q/k norms (Qwen3) the norms' scales
    # are what sets their size.
    weights = load_file(f"{hf}/model.safetensors")
    qk_norm = any(k.endswith("q_norm.weight") for k in weights)
    scaled = ("q_norm.weight", "k_norm.weight") if qk_norm else ("q_proj.weight", "k_proj.weight")
    sharp = {k: v * 4 if k.endswith(scaled) else v for k, v in weights.items()}
    save_file(sharp, f"{work}/sharp.safetensors", metadata={"format": "pt"})

    def folder(name, config):
        path = f"{work}/{name}"
        os.makedirs(path)
        os.symlink(f"{work}/sharp.safetensors", f"{path}/model.safetensors")
        for f in os.listdir(hf):
            if f not in ("config.json", "model.safetensors"):
                os.symlink(f"{hf}/{f}", f"{path}/{f}")
        with open(f"{path}/config.json", "w") as out:
            json.dump(config, out, indent=1)
        return path

    def reference(name, config):
        model = AutoModelForCausalLM.from_pretrained(folder(name, config), dtype=torch.float32,
                                                     attn_implementation="eager")
        return transformers_perplexity(model.eval())[0]

    misread = reference("hf4_theta10000", rope_variant(exported, 4, 10000.0, False))
    trained_scaling = bool(exported.get("rope_scaling"))
    for theta, llama3 in ((exported["rope_theta"], trained_scaling), (123456.0, False)):
        name = f"theta{theta:g}_{'llama3' if llama3 else 'default'}"
        expected = reference(f"hf4_{name}", rope_variant(exported, 4, theta, llama3))
        v5 = folder(f"hf5_{name}", rope_variant(exported, 5, theta, llama3))
        got = json.loads(run(loom, "eval", "--checkpoint", v5, "--tokenizer", "brown_bpe",
                             "--dataset", docs, "--seq-len", str(seq_len), "--stride",
                             str(stride), "--per-document"))["perplexity"]
        rel = abs(got - expected) / expected
        apart = abs(misread - expected) / expected
        print(f"transformers 5 layout, {name}: loom {got:.6f}, transformers (4 layout) "
              f"{expected:.6f}, relative difference {rel:.2e}; theta 10000 gives {misread:.6f} "
              f"({apart:.1e} away)")
        if rel > 1e-5:
            failures.append(f"{name} in transformers 5's layout: loom eval {got}, "
                            f"transformers {expected}")
        if apart < 1e-4:  # ten times the tolerance
            failures.append(f"{name}: theta 10000 gives nearly the same perplexity; the check "
                            f"would not notice a misread theta")
    return failures


if __name__ == "__main__":
    sys.exit(main())
