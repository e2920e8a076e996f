#!/usr/bin/env python3
"""Every tiny transformers model loom's unit tests compare against, made in one Python process.

    python make_hf_test_models.py OUT_DIR

Runs each maker below as its own command would (`python tools/<maker> OUT_DIR/<folder>`), but
imports torch and transformers once: the test suites that need them share one call (a few
seconds of start-up each, otherwise). tests/unit/hf_test_util.h runs this once per build tree
under a lock and hands each suite its folder.
"""
import os
import runpy
import sys

# (maker script in tools/, output folder under OUT_DIR)
MAKERS = [
    ("make_hf_qwen3_model.py", "qwen3_models"),
    ("make_hf_qwen3_moe_model.py", "qwen3_moe_models"),
    ("make_hf_deepseek_v3_model.py", "deepseek_v3_models"),
    ("make_hf_deepseek_v3_mtp_model.py", "deepseek_v3_mtp"),
    ("make_hf_gpt_oss_model.py", "gpt_oss_models"),
]


def main():
    out = sys.argv[1]
    tools = os.path.dirname(os.path.abspath(__file__))
    for script, folder in MAKERS:
        path = os.path.join(tools, script)
        sys.argv = [path, os.path.join(out, folder)]
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as done:
            if done.code not in (None, 0):
                print(f"{script} failed (exit {done.code})", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
