#!/usr/bin/env python3
"""Tokenizer parity and throughput: loom vs the PyPI tiktoken package, single thread, same text.

Encodes the embedded corpus (assets/brown) with both, checks the ids are identical, and reports
MB/s of the encode call alone (loom: `loom tokenize --stats`; tiktoken: encode_ordinary).

  .venv/bin/pip install tiktoken==0.9.0
  .venv/bin/python tools/bench_tokenizer.py [--encoding cl100k_base] [--rounds 3]
"""
import argparse
import base64
import gzip
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

import tiktoken

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_ranks(path):
    with open(path, "rb") as f:
        return {base64.b64decode(t): int(r) for t, r in (line.split() for line in f if line.strip())}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--encoding", default="cl100k_base")
    p.add_argument("--tokenizers", default=os.path.join(ROOT, "..", "shared", "data", "tokenizers"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loom", default=os.path.join(ROOT, "build", "bin", "loom"))
    ns = p.parse_args()

    with gzip.open(os.path.join(ROOT, "assets", "brown", "train.jsonl.gz"), "rt", encoding="utf-8") as f:
        text = "\n".join(json.loads(line)["text"] for line in f)
    ranks_path = os.path.join(ns.tokenizers, ns.encoding + ".tiktoken")
    with open(os.path.join(ns.tokenizers, ns.encoding + ".json")) as f:
        spec = json.load(f)
    enc = tiktoken.Encoding(ns.encoding, pat_str=spec["pat_str"], mergeable_ranks=load_ranks(ranks_path),
                            special_tokens=spec["special_tokens"])
    mb = len(text.encode("utf-8")) / 1e6

    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(text)
        loom_speeds, tik_speeds = [], []
        for _ in range(ns.rounds):
            run = subprocess.run([ns.loom, "tokenize", "--tokenizer", ranks_path, "--input", corpus,
                                  "--format", "json", "--stats"], check=True, capture_output=True, text=True)
            loom_ids = json.loads(run.stdout)
            seconds = float(re.search(r"in ([0-9.e+-]+) s", run.stderr).group(1))
            loom_speeds.append(mb / seconds)
            start = time.perf_counter()
            tik_ids = enc.encode_ordinary(text)
            tik_speeds.append(mb / (time.perf_counter() - start))
    same = loom_ids == tik_ids
    result = {"encoding": ns.encoding, "megabytes": round(mb, 2), "tokens": len(tik_ids), "identical_ids": same,
              "loom_mb_per_s": statistics.median(loom_speeds), "tiktoken_mb_per_s": statistics.median(tik_speeds),
              "ratio": statistics.median(loom_speeds) / statistics.median(tik_speeds),
              "tiktoken_version": tiktoken.__version__}
    print(json.dumps(result, indent=2))
    if not same:
        first = next(i for i, (a, b) in enumerate(zip(loom_ids, tik_ids)) if a != b)
        print(f"first difference at token {first}: loom {loom_ids[first:first + 5]} tiktoken {tik_ids[first:first + 5]}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
