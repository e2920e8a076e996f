#!/usr/bin/env python3
"""Test fixtures for loom's Hugging Face tokenizer.json support, made with the PyPI `tokenizers`
package: two byte-level BPE tokenizers trained on the embedded corpus (a GPT-2-style one with the
ByteLevel pre-tokenizer, and a Llama-3-style one with a Split regex + ByteLevel and
ignore_merges), and the ids `tokenizers` gives for tricky texts.

  .venv/bin/pip install tokenizers==0.21.1 && .venv/bin/python tools/make_hf_tokenizer_fixture.py
"""
import gzip
import json
import os
import sys

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, decoders, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizers")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_vectors import TEXTS  # noqa: E402

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"]


def corpus():
    with gzip.open(os.path.join(ROOT, "assets", "brown", "train.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def build(style):
    tok = Tokenizer(models.BPE(ignore_merges=(style == "llama3")))
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return tok


def main():
    vectors = {"tokenizers_version": __import__("tokenizers").__version__, "tokenizers": {}}
    for style in ("gpt2", "llama3"):
        tok = build(style)
        path = os.path.join(OUT, f"hf_{style}_style.json")
        tok.save(path)
        vectors["tokenizers"][style] = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids}
                                        for t in TEXTS]
        print(f"wrote {path} ({tok.get_vocab_size()} tokens)")
    lines = ["{", f' "tokenizers_version": {json.dumps(vectors["tokenizers_version"])},', ' "tokenizers": {']
    for i, (style, cases) in enumerate(vectors["tokenizers"].items()):
        lines.append(f"  {json.dumps(style)}: [")
        lines += ["   " + json.dumps(c, ensure_ascii=False) + ("," if j + 1 < len(cases) else "")
                  for j, c in enumerate(cases)]
        lines.append("  ]" + ("," if i == 0 else ""))
    lines += [" }", "}"]
    with open(os.path.join(OUT, "hf_vectors.json"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
