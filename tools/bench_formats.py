#!/usr/bin/env python3
"""Loader throughput per format and tokenizer: loom against Hugging Face `tokenizers` (and the
sentencepiece package for SentencePiece models), one core each, on the same text.

Writes the embedded Brown corpus (repeated --repeat times) as Parquet (row groups of 1000 rows),
zstd JSONL and gzip JSONL; makes a SentencePiece BPE model and a Qwen-style (NFC, Qwen split
regex, ByteLevel) tokenizer.json on it; then runs `loom_bench_loader --files` (read + tokenize
on one thread, back to back) and the Python packages' batch encode on one thread (encode only:
the text already in memory). Prints one table.

  .venv/bin/python tools/bench_formats.py [--repeat 4] [--rounds 3] [--dir /tmp/loom_bench_formats]
"""
import argparse
import gzip
import json
import os
import subprocess
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # `tokenizers`' thread pool: one core, like loom's loop
os.environ["TOKENIZERS_PARALLELISM"] = "true"

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import sentencepiece as spm  # noqa: E402
import zstandard  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def write_formats(out, texts):
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    pq.write_table(pa.table({"text": texts}), f"{out}/data.parquet", row_group_size=1000)
    with open(f"{out}/data.jsonl.zst", "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3).compress(lines))
    with gzip.open(f"{out}/data.jsonl.gz", "wb") as f:
        f.write(lines)
    return [f"{out}/data.parquet", f"{out}/data.jsonl.zst", f"{out}/data.jsonl.gz"]


def make_tokenizers(out, texts):
    with open(f"{out}/corpus.txt", "w") as f:
        f.write("\n".join(texts[:20000]))  # sentencepiece reads lines of at most 4 KB
    spm.SentencePieceTrainer.train(input=f"{out}/corpus.txt", model_prefix=f"{out}/sp_bpe",
                                   model_type="bpe", vocab_size=4000, byte_fallback=True,
                                   minloglevel=2)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train([f"{out}/corpus.txt"], trainers.BpeTrainer(
        vocab_size=4000, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(f"{out}/qwen_style.json")
    return {"brown_bpe (byte-level BPE)": f"{ROOT}/assets/tokenizer/brown_bpe_4k.json",
            "Qwen-style NFC BPE": f"{out}/qwen_style.json",
            "SentencePiece BPE": f"{out}/sp_bpe.model"}


def python_rate(path, texts, rounds):
    """Tokens/s of the Python package's batch encode on one thread (median of rounds)."""
    if path.endswith(".model"):
        sp = spm.SentencePieceProcessor(model_file=path)
        encode = lambda: sp.encode(texts, num_threads=1)  # noqa: E731
        name = "sentencepiece"
    else:
        tok = Tokenizer.from_file(path)
        encode = lambda: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]  # noqa: E731
        name = "tokenizers"
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        ids = encode()
        rates.append(sum(len(i) for i in ids) / (time.perf_counter() - start))
    return name, sorted(rates)[len(rates) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default="/tmp/loom_bench_formats")
    p.add_argument("--bench", default=f"{ROOT}/build/bin/loom_bench_loader")
    ns = p.parse_args()
    os.makedirs(ns.dir, exist_ok=True)
    with gzip.open(f"{ROOT}/assets/brown/train.jsonl.gz", "rt", encoding="utf-8") as f:
        brown = [json.loads(line)["text"] for line in f]
    texts = brown * ns.repeat
    files = write_formats(ns.dir, texts)
    tokenizers = make_tokenizers(ns.dir, texts)
    result = subprocess.run([ns.bench, "--rounds", str(ns.rounds), "--files", *files,
                             "--tokenizers", *tokenizers.values()],
                            check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"{len(texts)} documents, {mb:.1f} MB of text; one core each; tokens/s (millions)\n")
    print(f"{'tokenizer':28} {'format':12} {'loom read':>10} {'loom read+tok':>14} "
          f"{'Python encode':>14} {'(package)':>14}")
    for label, path in tokenizers.items():
        package, rate = python_rate(path, texts, ns.rounds)
        for row in (r for r in rows if r["tokenizer"] == path):
            fmt = row["file"].split("/")[-1].replace("data.", "")
            print(f"{label:28} {fmt:12} {row['read_mb_per_s']:>7.0f} MB/s "
                  f"{row['tokens_per_s_per_core'] / 1e6:>14.2f} {rate / 1e6:>14.2f} {package:>14}")


if __name__ == "__main__":
    main()
