#!/usr/bin/env python3
"""Runs an ONNX model exported by ortbench (`ortbench_models::onnx`) on onnxruntime's CPU
execution provider and writes its logits: what `models/tests/onnx.rs` compares against the
engine.

    onnx-check.py MODEL.onnx INPUTS.safetensors OUT.safetensors [--check]

INPUTS holds `input_ids` and `attention_mask`, int64 (B, T); OUT gets `logits` (f32). With
--check the model first goes through onnx's checker with full shape inference (needs the
`onnx` package; onnxruntime alone is enough without it).

Needs: onnxruntime, numpy, safetensors (`pip install onnxruntime numpy safetensors`).
"""
import argparse
import sys

import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file, save_file


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("inputs")
    ap.add_argument("out")
    ap.add_argument("--check", action="store_true", help="run onnx.checker (full_check) first")
    args = ap.parse_args()

    if args.check:
        import onnx

        onnx.checker.check_model(onnx.load(args.model), full_check=True)

    feeds = load_file(args.inputs)
    for name in ("input_ids", "attention_mask"):
        if name not in feeds or feeds[name].dtype != np.int64 or feeds[name].ndim != 2:
            print(f"{args.inputs}: needs '{name}' as int64 (batch, sequence)", file=sys.stderr)
            return 2
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: ORT warns about pruned initializers otherwise
    sess = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
    (logits,) = sess.run(["logits"], {k: feeds[k] for k in ("input_ids", "attention_mask")})
    save_file({"logits": np.ascontiguousarray(logits, dtype=np.float32)}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
