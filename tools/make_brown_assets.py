#!/usr/bin/env python3
"""Builds assets/brown/{train,validation}.jsonl.gz from the Brown corpus (../shared/data).

Validation holds every 25th document (20 of 500, spread over all genres); training the rest.
Deterministic: gzip without timestamps, so re-running gives identical files.

  python3 tools/make_brown_assets.py [SOURCE.jsonl.gz]
"""
import gzip
import io
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
source = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "data", "brown.jsonl.gz")
with gzip.open(source, "rt", encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
splits = {"train": [], "validation": []}
for i, record in enumerate(records):
    splits["validation" if i % 25 == 0 else "train"].append(record)
out_dir = os.path.join(ROOT, "assets", "brown")
os.makedirs(out_dir, exist_ok=True)
for name, rows in splits.items():
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9, mtime=0) as gz:
        for row in rows:
            gz.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    with open(os.path.join(out_dir, f"{name}.jsonl.gz"), "wb") as f:
        f.write(buffer.getvalue())
    print(f"{name}: {len(rows)} documents")
