"""Dataset fixtures for loom's data tests, written by the reference Python packages.

    python make_dataset_fixtures.py OUT_DIR [--rows N] [--row-group R]

OUT_DIR gets: source.jsonl (the documents, one JSON record each), data.parquet (row groups of R
rows, an "id" column beside "text"), data.jsonl.zst (zstandard), hf/ (datasets' save_to_disk,
two .arrow shards), and bad inputs: int_text.parquet (an integer "text"), null_text.parquet (a
null text in row 3), no_text.parquet ("body" only), corrupt.parquet (cut in half),
bad_utf8.parquet and bad_utf8.arrow (row 1 is not UTF-8), null_first.parquet (row groups of 2,
the first all null), cut.jsonl.zst (a frame cut short),
dict/ (a DatasetDict).
"""
import argparse
import json
import os

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

SAMPLES = [
    "Hello, world.",
    "Grüße aus Köln — naïve café.",
    "日本語のテキストです。",
    "emoji 🎉🚀 and ZWJ 👩‍👩‍👧",
    "tabs\tand\nnewlines\n\n  spaces   ",
    "Ελληνικά και русский текст",
    "עברית ועربية",
    "x" * 300,
]


def documents(rows):
    return [f"{i}: {SAMPLES[i % len(SAMPLES)]} {'abc ' * (i % 5)}" for i in range(rows)]


def write_big(out, size):
    """A large Parquet file that barely compresses (base64 of random bytes), written row group by
    row group so this script's own memory stays small. Prints rows and text bytes as JSON."""
    import base64
    os.makedirs(out, exist_ok=True)
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    doc_bytes, group_rows = 4096, 16384
    rows = text_bytes = 0
    with pq.ParquetWriter(os.path.join(out, "big.parquet"), schema, compression="snappy") as w:
        while text_bytes < size:
            blob = base64.b64encode(os.urandom(doc_bytes * group_rows * 3 // 4)).decode()
            texts = [blob[i:i + doc_bytes] for i in range(0, len(blob), doc_bytes)]
            w.write_table(pa.table({"id": range(rows, rows + len(texts)), "text": texts},
                                   schema=schema), row_group_size=group_rows)
            rows += len(texts)
            text_bytes += sum(len(t) for t in texts)
    print(json.dumps({"rows": rows, "text_bytes": text_bytes,
                      "file_bytes": os.path.getsize(os.path.join(out, "big.parquet"))}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, default=60)
    parser.add_argument("--row-group", type=int, default=7)
    parser.add_argument("--big-bytes", type=int, default=0,
                        help="instead: OUT_DIR/big.parquet of about this many bytes (random text, "
                             "documents of 4 KiB, row groups of 16384 documents)")
    args = parser.parse_args()
    out = args.out
    if args.big_bytes:
        return write_big(out, args.big_bytes)
    os.makedirs(out, exist_ok=True)
    docs = documents(args.rows)
    lines = "".join(json.dumps({"text": d, "id": i}, ensure_ascii=False) + "\n"
                    for i, d in enumerate(docs)).encode()
    with open(os.path.join(out, "source.jsonl"), "wb") as f:
        f.write(lines)
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    pq.write_table(table, os.path.join(out, "data.parquet"), row_group_size=args.row_group)
    # Two frames: readers must go on past the first.
    half = len(lines) // 2
    cctx = zstandard.ZstdCompressor(level=3)
    blob = cctx.compress(lines[:half]) + cctx.compress(lines[half:])
    with open(os.path.join(out, "data.jsonl.zst"), "wb") as f:
        f.write(blob)
    with open(os.path.join(out, "cut.jsonl.zst"), "wb") as f:
        f.write(blob[: len(blob) - 7])
    dataset = datasets.Dataset.from_dict({"text": docs, "id": list(range(len(docs)))})
    dataset.save_to_disk(os.path.join(out, "hf"), num_shards=2)
    datasets.DatasetDict({"train": dataset, "test": dataset}).save_to_disk(
        os.path.join(out, "dict"))
    pq.write_table(pa.table({"text": list(range(5))}), os.path.join(out, "int_text.parquet"))
    pq.write_table(pa.table({"text": ["a", "b", "c", None, "e"]}),
                   os.path.join(out, "null_text.parquet"))
    pq.write_table(pa.table({"body": ["a"]}), os.path.join(out, "no_text.parquet"))
    pq.write_table(pa.table({"text": [None, None, "ab", "cd", "ef", "gh"]}),
                   os.path.join(out, "null_first.parquet"), row_group_size=2)
    # Bytes that are not UTF-8 in a string column (view: Arrow's own check never runs).
    bad = pa.table({"text": pa.array([b"a", b"\xff\xfe", b"c"], pa.binary()).view(pa.string())})
    pq.write_table(bad, os.path.join(out, "bad_utf8.parquet"))
    with pa.ipc.new_file(os.path.join(out, "bad_utf8.arrow"), bad.schema) as writer:
        writer.write_table(bad)
    with open(os.path.join(out, "data.parquet"), "rb") as f:
        whole = f.read()
    with open(os.path.join(out, "corrupt.parquet"), "wb") as f:
        f.write(whole[: len(whole) // 2])


if __name__ == "__main__":
    main()
