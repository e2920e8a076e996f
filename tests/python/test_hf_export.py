#!/usr/bin/env python3
"""`loom checkpoint export --to hf` loads in transformers' LlamaForCausalLM and gives loom's logits.

Trains the debug model for a few steps with checkpoints on, exports the final checkpoint, loads
it with transformers, and compares the logits on a sentence with those of tools/reference (the
plain-PyTorch Llama that the golden tests hold loom's C++ model to) run on the loom checkpoint's
own tensors. Then imports the export back (`import --from hf`) and checks the weights round-trip
bit for bit. A transformers that is missing or fails to import (a version that does not work
with this torch) fails the test: scripts/setup.sh installs a matching one, and a skip would hide
a broken setup.

Usage: test_hf_export.py LOOM_BINARY WORK_DIR
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = "A lighthouse keeper counted the ships that never came back to the harbor."


def run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main():
    try:
        import torch
        from safetensors import safe_open
        from transformers import LlamaForCausalLM
    except Exception as e:  # not installed, or a version that fails to import with this torch
        print(f"FAILED: transformers cannot be loaded: {type(e).__name__}: {e} "
              "(scripts/setup.sh installs a matching transformers into .venv)")
        return 1
    loom, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run(loom, "train", "--config", f"{ROOT}/configs/llama3_debug.toml", "--job.dump_folder", work,
        "--training.steps", "4", "--training.seq_len", "64", "--training.local_batch_size", "2",
        "--validation.enable", "false", "--metrics.peak_tflops", "1", "--debug.seed", "3",
        "--checkpoint.enable", "true", "--checkpoint.export_dtype", "float32")
    step = f"{work}/checkpoint/step-4"
    hf = f"{work}/hf"
    # A tiny shard limit forces the sharded layout with model.safetensors.index.json.
    run(loom, "checkpoint", "export", "--to", "hf", f"{work}/checkpoint", hf, "--dtype", "float32",
        "--max-shard-size-gb", "0.01")
    assert os.path.exists(f"{hf}/model.safetensors.index.json"), os.listdir(hf)
    ids = json.loads(run(loom, "tokenize", "--tokenizer", "brown_bpe", "--text", TEXT,
                         "--format", "json"))
    tokens = torch.tensor([ids])

    model = LlamaForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                             attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        hf_logits = model(tokens).logits.float()

    spec = importlib.util.spec_from_file_location("ref", f"{ROOT}/tools/reference/llama_reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    cfg = json.load(open(f"{hf}/config.json"))
    args = ref.ModelArgs(dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"],
                         n_heads=cfg["num_attention_heads"], n_kv_heads=cfg["num_key_value_heads"],
                         vocab_size=cfg["vocab_size"], max_seq_len=256,
                         multiple_of=cfg["intermediate_size"], norm_eps=cfg["rms_norm_eps"],
                         rope_theta=cfg["rope_theta"], use_scaled_rope="rope_scaling" in cfg)
    reference = ref.Transformer(args)
    weights = {}
    with safe_open(f"{step}/rank-00000.safetensors", framework="pt") as f:
        for key in f.keys():
            if key.startswith("model."):
                weights[key[len("model."):]] = f.get_tensor(key)
    ref.load_weights_strict(reference, weights)
    with torch.no_grad():
        ref_logits = reference(tokens)

    diff = (hf_logits - ref_logits).abs().max().item()
    scale = ref_logits.abs().max().item()
    same_argmax = bool((hf_logits.argmax(-1) == ref_logits.argmax(-1)).all())
    print(f"{len(ids)} tokens; max |logit difference| {diff:.3g} (logits up to {scale:.3g}); "
          f"same argmax: {same_argmax}")
    if not (diff < 1e-4 * max(1.0, scale) and same_argmax):
        print("FAILED: transformers' logits differ from loom's")
        return 1

    if check_auto_classes(loom, hf, ids) != 0:
        return 1
    # export refuses a non-empty folder unless --overwrite, and then replaces its files only.
    refused = subprocess.run([loom, "checkpoint", "export", "--to", "hf", step, hf],
                             capture_output=True, text=True)
    if refused.returncode != 2 or "--overwrite" not in refused.stderr + refused.stdout:
        print(f"FAILED: export into a non-empty folder: exit {refused.returncode}\n"
              f"{refused.stdout}{refused.stderr}")
        return 1
    open(f"{hf}/README.md", "w").write("mine\n")
    run(loom, "checkpoint", "export", "--to", "hf", step, hf, "--dtype", "float32", "--overwrite")
    if (os.path.exists(f"{hf}/model.safetensors.index.json")
            or not os.path.exists(f"{hf}/model.safetensors")
            or open(f"{hf}/README.md").read() != "mine\n"):
        print(f"FAILED: --overwrite left stale shards or removed a user's file: {os.listdir(hf)}")
        return 1

    # Round trip: import the export as a loom checkpoint; the weights come back exactly.
    back = f"{work}/imported"
    run(loom, "checkpoint", "import", "--from", "hf", hf, back)
    with safe_open(f"{back}/step-0/rank-00000.safetensors", framework="pt") as f:
        for key in f.keys():
            name = key[len("model."):]
            if not torch.equal(f.get_tensor(key), weights[name]):
                print(f"FAILED: {name} changed in the export/import round trip")
                return 1
        if len(list(f.keys())) != len(weights):
            print("FAILED: the import lost tensors")
            return 1
    print("OK: transformers matches loom; export -> import round-trips exactly")
    return 0


def check_auto_classes(loom, hf, ids):
    """AutoTokenizer and AutoModelForCausalLM load the folder; generate() knows the end token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(hf)
    encoded = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    if encoded != ids:
        print(f"FAILED: AutoTokenizer's ids differ from loom's:\n{encoded}\n{ids}")
        return 1
    # Training and loom generate put BOS first; so does the export's post-processor.
    with_special = tokenizer(TEXT)["input_ids"]
    if with_special != [tokenizer.bos_token_id] + ids:
        print(f"FAILED: AutoTokenizer does not add the BOS training used:\n{with_special[:8]}\n"
              f"{ids[:8]}")
        return 1
    config = json.load(open(f"{hf}/config.json"))
    generation = json.load(open(f"{hf}/generation_config.json"))
    if tokenizer.eos_token != "<|end_of_text|>" or tokenizer.bos_token != "<|begin_of_text|>":
        print(f"FAILED: special tokens {tokenizer.bos_token!r} {tokenizer.eos_token!r}")
        return 1
    if not (config["eos_token_id"] == generation["eos_token_id"] == tokenizer.eos_token_id
            and config["bos_token_id"] == tokenizer.bos_token_id):
        print(f"FAILED: end token ids: config {config['eos_token_id']}, generation_config "
              f"{generation['eos_token_id']}, tokenizer {tokenizer.eos_token_id}")
        return 1
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    if model.generation_config.eos_token_id != tokenizer.eos_token_id:
        print(f"FAILED: generate() would stop at {model.generation_config.eos_token_id}, "
              f"not {tokenizer.eos_token_id}")
        return 1
    prompt = tokenizer(TEXT[:40], return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0], skip_special_tokens=True)
    if out.shape[1] <= prompt["input_ids"].shape[1] or not text.startswith(TEXT[:20]):
        print(f"FAILED: generate() gave {out.tolist()} = {text!r}")
        return 1
    print(f"AutoTokenizer + AutoModelForCausalLM: eos {tokenizer.eos_token_id}, generated {text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
