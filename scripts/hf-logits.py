#!/usr/bin/env python3
"""Loads a model directory with HF Transformers (AutoModelFor… by its config's architectures)
and writes its logits for given inputs: what `ortbench train` saved must load unchanged and
compute what the engine computes (bench/tests/train.rs).

    hf-logits.py MODEL_DIR INPUTS.safetensors OUT.safetensors

INPUTS holds `input_ids` and `attention_mask` (int64, [B, T]); OUT gets `logits` (float32) and
its metadata the weights HF reported missing or unexpected (both must be empty).
"""
import json
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file


def main(model_dir, inputs, out):
    cfg = json.load(open(f"{model_dir}/config.json"))
    cls = getattr(transformers, cfg["architectures"][0])
    # sdpa, as the baseline; eager for the classes without it (Gemma 2: HF's default there).
    attn = "sdpa" if getattr(cls, "_supports_sdpa", True) else "eager"
    model, info = cls.from_pretrained(model_dir, output_loading_info=True, attn_implementation=attn)
    model.eval()
    x = load_file(inputs)
    with torch.no_grad():
        logits = model(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).logits
    meta = {k: json.dumps(sorted(v)) for k, v in info.items() if k in ("missing_keys", "unexpected_keys")}
    save_file({"logits": logits.float().contiguous()}, out, metadata=meta)


if __name__ == "__main__":
    main(*sys.argv[1:])
