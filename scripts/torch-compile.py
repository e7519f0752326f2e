#!/usr/bin/env python3
"""The torch.compile baseline: the same HF model trained on the same batches as `ortbench run
--models DIR --data FILE`, the way HF Trainer runs it with `torch_compile=True` — sdpa
attention, `torch.compile(model)` (inductor, default mode), torch's fused AdamW with HF's decay
groups, global-norm clipping, autocast bf16/fp16 (GradScaler for fp16) — so that the engine's
throughput can be put beside torch.compile's (the GPU tuning issue's target). Python only: the
GPU machine's torch 2.11 + transformers run it.

    torch-compile.py --model DIR --data FILE --out OUT [--batch-size 8] [--steps 20]
                     [--warmup 5] [--precision bf16|fp16|fp32] [--device cuda|cpu]
                     [--lr 5e-5] [--weight-decay 0.01] [--max-grad-norm 1.0] [--dropout P]
                     [--no-compile]

DIR: config.json + model.safetensors (HF format: what `ortbench train` saves, a hub snapshot,
or a tests/fixtures model); with config.json alone, HF's random initialisation (throughput). FILE: the safetensors file `ortbench run --data` reads —
`input_ids` [N, T], optionally `labels` and `attention_mask`; step s takes rows
(s·B + i) mod N, as ortbench's DataSource does. Masked-LM files must hold `labels` (ortbench
draws MLM masking itself); a causal LM without labels predicts its inputs (−100 at padding).
Any other tensor is refused, as ortbench refuses it.

OUT gets `steps.csv` (config `torch-compile`, per-step loss and wall time, each step ended by a
device synchronise) and `results.csv` (median/p90 step time over the steps after --warmup,
samples/s, tokens/s, peak memory, compile time = the first step's wall time) with ortbench's
column names; the last line printed is a one-line summary. Peak memory on CUDA is
`torch.cuda.max_memory_reserved` (the caching allocator's high-water mark: what the process
took from the device, without the CUDA context), on the CPU the process's peak RSS.
`--no-compile` runs the same loop eagerly (the check that the loop is HF's: tests compare it
with the fixtures' HF losses).
"""
import argparse
import csv
import json
import os
import resource
import statistics
import sys
import time

import torch
import transformers
from safetensors.torch import load_file

KNOWN = {"input_ids", "labels", "attention_mask"}


def fail(msg):
    print(f"torch-compile.py: {msg}", file=sys.stderr)
    sys.exit(2)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--dropout", type=float)
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args()
    if a.batch_size < 1 or a.steps < 1 or not 0 <= a.warmup < a.steps:
        fail("need --batch-size ≥ 1, --steps ≥ 1 and 0 ≤ --warmup < --steps")
    if a.device != "cpu" and not a.device.startswith("cuda"):
        fail(f"unknown --device '{a.device}': use cuda, cuda:N or cpu")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {a.device}: torch sees no CUDA device")
    if a.precision == "fp16" and a.device == "cpu":
        fail("fp16 needs --device cuda (GradScaler), as ortbench's pytorch config")
    return a


def architecture(model_dir):
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        fail(f"{path}: not found (--model takes an HF-format directory)")
    cfg = json.load(open(path))
    archs = cfg.get("architectures") or []
    if len(archs) != 1:
        fail(f"{path}: expected one entry in 'architectures', got {archs}")
    if getattr(transformers, archs[0], None) is None:
        fail(f"transformers has no class {archs[0]}")
    return cfg, archs[0]


def load_model(model_dir, cfg, arch, dropout, device):
    cls = getattr(transformers, arch)
    overrides = {}
    if dropout is not None:
        keys = ["hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"]
        overrides = {k: dropout for k in keys if k in cfg}
    if not any(os.path.isfile(os.path.join(model_dir, f)) for f in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")):
        # A directory with only config.json: HF's random initialisation (throughput runs).
        print(f"torch-compile.py: no weights in {model_dir}: HF's random initialisation", file=sys.stderr)
        config = transformers.AutoConfig.from_pretrained(model_dir, **overrides)
        return cls._from_config(config, attn_implementation="sdpa").to(device).train()
    model, info = cls.from_pretrained(model_dir, attn_implementation="sdpa", output_loading_info=True, **overrides)
    missing = info.get("missing_keys") or []
    if missing:
        print(f"torch-compile.py: {len(missing)} weights newly initialised (not in {model_dir}): {sorted(missing)[:5]}…", file=sys.stderr)
    return model.to(device).train()


def decay_groups(model, weight_decay):
    # HF Trainer's get_decay_parameter_names: every weight but biases and LayerNorm's.
    from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
    from transformers.trainer_pt_utils import get_parameter_names

    decay = set(get_parameter_names(model, ALL_LAYERNORM_LAYERS, ["bias", "layernorm", "rmsnorm"]))
    params = dict(model.named_parameters())
    return [
        {"params": [p for n, p in params.items() if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in params.items() if n not in decay], "weight_decay": 0.0},
    ]


def batches(data_path, arch, batch_size):
    data = load_file(data_path)
    extra = sorted(set(data) - KNOWN)
    if extra:
        fail(f"{data_path}: unused tensors {extra} (expected input_ids, labels, attention_mask)")
    if "input_ids" not in data:
        fail(f"{data_path}: no input_ids")
    ids = data["input_ids"]
    mask = data.get("attention_mask")
    labels = data.get("labels")
    if labels is None:
        if "CausalLM" not in arch and "LMHead" not in arch:
            fail(f"{data_path}: no labels (a {arch} needs them: ortbench draws masked-LM masking itself)")
        labels = ids.clone()
        if mask is not None:
            labels[mask == 0] = -100
    n = ids.shape[0]

    def batch(step):
        rows = torch.tensor([(step * batch_size + i) % n for i in range(batch_size)])
        b = {"input_ids": ids[rows], "labels": labels[rows]}
        if mask is not None:
            b["attention_mask"] = mask[rows]
        return b

    return batch, ids.shape[1]


def peak_bytes(device):
    if device.startswith("cuda"):
        return torch.cuda.max_memory_reserved(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    a = parse()
    torch.manual_seed(0)
    device = a.device
    # Everything the user gave is checked before the model is loaded.
    cfg, arch = architecture(a.model)
    batch, seq = batches(a.data, arch, a.batch_size)
    transformers.utils.logging.disable_progress_bar()
    model = load_model(a.model, cfg, arch, a.dropout, device)
    # HF Trainer's default optim="adamw_torch_fused" (fused on the CPU too in torch 2.11).
    opt = torch.optim.AdamW(decay_groups(model, a.weight_decay), lr=a.lr, fused=True)
    scaler = torch.amp.GradScaler("cuda") if a.precision == "fp16" else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[a.precision]
    step_fn = model if a.no_compile else torch.compile(model)
    config = "pytorch-eager" if a.no_compile else "torch-compile"
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)

    rows, times = [], []
    for s in range(a.steps):
        b = {k: v.to(device, non_blocking=True) for k, v in batch(s).items()}
        t0 = time.perf_counter()
        with torch.autocast(device_type=device.split(":")[0], dtype=dtype, enabled=dtype is not None):
            loss = step_fn(**b).loss
        opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm) if a.max_grad_norm > 0 else torch.tensor(0.0)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        times.append(ms)
        rows.append({"model": a.model, "config": config, "precision": a.precision, "rank": 0, "step": s, "loss": loss.item(), "step_ms": ms, "grad_norm": float(norm)})
        print(f"step {s + 1}/{a.steps} loss {loss.item():.6f} {ms:.1f} ms", file=sys.stderr)

    timed = times[a.warmup:]
    med = statistics.median(timed)
    p90 = sorted(timed)[min(len(timed) - 1, int(0.9 * len(timed)))]
    result = {
        "model": a.model, "config": config, "precision": a.precision, "device": device, "batch_size": a.batch_size, "seq_len": seq,
        "steps": a.steps, "warmup": a.warmup, "step_ms_median": med, "step_ms_p90": p90, "samples_per_s": a.batch_size * 1e3 / med,
        "tokens_per_s": a.batch_size * seq * 1e3 / med, "peak_mem_bytes": peak_bytes(device), "final_loss": rows[-1]["loss"],
        "compile_s": times[0] / 1e3, "torch": torch.__version__, "transformers": transformers.__version__,
    }
    os.makedirs(a.out, exist_ok=True)
    for name, table in [("steps.csv", rows), ("results.csv", [result])]:
        with open(os.path.join(a.out, name), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(table[0]))
            w.writeheader()
            w.writerows(table)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
