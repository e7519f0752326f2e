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

    torch-compile.py --worker SPEC.json

is the `torch-compile` config of `ortbench run` (bench/src/torch_compile.rs starts it with the
venv's python instead of `ortbench worker`). SPEC.json is the run spec the Rust workers get, plus
a `torch_compile` object the harness adds: `model_dir` (config.json + model.safetensors: the
initial weights the Rust configs build from the seed or load, saved by the harness), `data` (the
run's global batches, steps × batch rows in step order, as DataSource made them), `threads` (the
intra-op threads the Rust workers use) and `compile` (false: eager, for tests). It trains the
same loop as above and speaks the Rust workers' protocol on stdout, one JSON object a line: a
`step` record per step, then a `summary` (with `compile_s`, the first step's wall time: inductor
compiles the forward and backward graphs there) — or an `error`. Everything else goes to stderr.
"""
import argparse
import csv
import json
import math
import os
import resource
import statistics
import sys
import threading
import time

if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    # Worker mode: an import failure is the run's error record, not a traceback.
    try:
        import torch
        import transformers
        from safetensors.torch import load_file
    except Exception as e:  # noqa: BLE001 - reported to the harness
        print(json.dumps({"event": "error", "message": f"torch-compile worker: cannot import torch/transformers/safetensors ({e}); run scripts/setup", "oom": False}), flush=True)
        sys.exit(1)
else:
    import torch
    import transformers
    from safetensors.torch import load_file

KNOWN = {"input_ids", "labels", "attention_mask"}


class Refused(Exception):
    """A refusal of the user's input (worker mode: the run's error record)."""


WORKER = False


def fail(msg):
    if WORKER:
        raise Refused(msg)
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
        return cls._from_config(config, attn_implementation="sdpa", dtype=torch.float32).to(device).train()
    # dtype float32: transformers 5 loads in the config's `dtype` by default (SmolLM2's and
    # Qwen's say bfloat16), which would train pure bf16 weights instead of fp32 masters under
    # autocast, as the other configs do.
    model, info = cls.from_pretrained(model_dir, attn_implementation="sdpa", output_loading_info=True,
                                      dtype=torch.float32, **overrides)
    missing = info.get("missing_keys") or []
    if missing:
        print(f"torch-compile.py: {len(missing)} weights newly initialised (not in {model_dir}): {sorted(missing)[:5]}…", file=sys.stderr)
    return model.to(device).train()


def decay_groups(model, weight_decay):
    # HF Trainer's get_decay_parameter_names itself (it reads no Trainer state): every weight but
    # biases, LayerNorm's and every norm's (RMSNorm weights of Llama/Qwen included: model.norm,
    # q_norm, k_norm), as scripts/make-fixtures.py.
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))
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


def train(model, batch, steps, device, precision, lr, weight_decay, max_grad_norm, compile_model, schedule=None, on_step=None):
    """HF Trainer's step, `steps` times: forward (compiled unless told not to) under autocast,
    backward (GradScaler for fp16), global-norm clipping, torch's fused AdamW with HF's decay
    groups, the learning-rate schedule. Returns per step (loss, wall ms, gradient norm before
    clipping, loss scale, skipped, device ms or None); `on_step` gets each as it ends."""
    # HF Trainer's default optim="adamw_torch_fused" (fused on the CPU too in torch 2.11).
    opt = torch.optim.AdamW(decay_groups(model, weight_decay), lr=lr, fused=True)
    sched = None
    if schedule is not None:
        kind, warmup_steps = schedule
        if kind == "linear":
            sched = transformers.get_linear_schedule_with_warmup(opt, warmup_steps, steps)
        else:
            sched = transformers.get_constant_schedule_with_warmup(opt, warmup_steps)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
    step_fn = torch.compile(model) if compile_model else model
    cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    multi_label = getattr(model.config, "problem_type", None) == "multi_label_classification"
    params = [p for p in model.parameters()]
    out = []
    for s in range(steps):
        b = batch(s)
        if multi_label:
            b["labels"] = b["labels"].float()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        if cuda:
            start.record()
        b = {k: v.to(device, non_blocking=True) for k, v in b.items()}
        with torch.autocast(device_type=device.split(":")[0], dtype=dtype, enabled=dtype is not None):
            loss = step_fn(**b).loss
        opt.zero_grad(set_to_none=True)
        scale = 1.0
        if scaler is not None:
            scale = float(scaler.get_scale())
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        else:
            loss.backward()
        if max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        skipped = False
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
            skipped = float(scaler.get_scale()) < scale
        else:
            opt.step()
        if sched is not None and not skipped:
            sched.step()
        if cuda:
            end.record()
        loss_v, norm_v = loss.item(), float(norm)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        rec = (loss_v, ms, norm_v, scale, skipped, start.elapsed_time(end) if cuda else None)
        out.append(rec)
        if on_step is not None:
            on_step(s, rec)
    return out


def main():
    a = parse()
    torch.manual_seed(0)
    device = a.device
    # Everything the user gave is checked before the model is loaded.
    cfg, arch = architecture(a.model)
    batch, seq = batches(a.data, arch, a.batch_size)
    transformers.utils.logging.disable_progress_bar()
    model = load_model(a.model, cfg, arch, a.dropout, device)
    config = "pytorch-eager" if a.no_compile else "torch-compile"

    rows, times = [], []

    def log(s, rec):
        loss, ms, norm = rec[0], rec[1], rec[2]
        times.append(ms)
        rows.append({"model": a.model, "config": config, "precision": a.precision, "rank": 0, "step": s, "loss": loss, "step_ms": ms, "grad_norm": norm})
        print(f"step {s + 1}/{a.steps} loss {loss:.6f} {ms:.1f} ms", file=sys.stderr)

    train(model, batch, a.steps, device, a.precision, a.lr, a.weight_decay, a.max_grad_norm, not a.no_compile, on_step=log)

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


def finite_or_name(v):
    # JSON has no NaN or infinity (json.dumps would write the non-JSON tokens NaN/Infinity): an
    # overflowed step's loss is written "NaN", "inf" or "-inf", as bench/src/worker.rs's
    # maybe_finite reads it.
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if v != v else ("inf" if v > 0 else "-inf")
    return v


def emit(event):
    # One JSON object a line on stdout, as the Rust workers write them (bench/src/worker.rs).
    event = {k: finite_or_name(v) for k, v in event.items()}
    sys.stdout.write(json.dumps(event, allow_nan=False) + "\n")
    sys.stdout.flush()


class DeviceMemory:
    """A GPU run's peak memory as the Rust workers' DeviceWatch measures it: device memory in
    use (cudaMemGetInfo), polled, minus what was in use when the watch started."""

    def __init__(self, device):
        self.device = device
        free, total = torch.cuda.mem_get_info(device)
        self.base = self.peak = total - free
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self):
        while not self.stop.wait(0.002):
            free, total = torch.cuda.mem_get_info(self.device)
            self.peak = max(self.peak, total - free)

    def peak_bytes(self):
        self.stop.set()
        self.thread.join()
        free, total = torch.cuda.mem_get_info(self.device)
        return max(self.peak, total - free) - self.base


def worker(spec_path):
    """`ortbench run`'s torch-compile config: the run spec in, the worker protocol out."""
    global WORKER
    WORKER = True
    spec = json.load(open(spec_path))
    tc = spec["torch_compile"]
    device = {"cuda": "cuda:0"}.get(spec["device"], spec["device"])
    precision = spec["precision"]
    if device != "cpu" and not device.startswith("cuda"):
        fail(f"unknown device '{spec['device']}': use cpu, cuda or cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {spec['device']}: torch sees no CUDA device")
    if precision == "fp16" and device == "cpu":
        fail("fp16 autocast needs a CUDA device (GradScaler), as the pytorch config")
    if int(spec.get("ranks", 1)) != 1:
        fail("torch-compile runs one rank")
    torch.set_num_threads(int(tc["threads"]))
    torch.manual_seed(int(spec["seed"]))
    transformers.utils.logging.disable_progress_bar()
    cfg, arch = architecture(tc["model_dir"])
    batch, _ = batches(tc["data"], arch, int(spec["batch_size"]))
    watch = DeviceMemory(device) if device.startswith("cuda") else None
    # fp32 weights whatever the config's `dtype` says (load_model says why).
    model, info = getattr(transformers, arch).from_pretrained(tc["model_dir"], attn_implementation="sdpa",
                                                              output_loading_info=True, dtype=torch.float32)
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    if missing or unexpected:
        fail(f"the weights the harness saved do not fit {arch}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    model = model.to(device).train()
    if not tc.get("compile", True):
        print("torch-compile worker: eager (compile=false): no torch.compile", file=sys.stderr)

    def step(s, rec):
        loss, ms, norm, scale, skipped, device_ms = rec
        if not (loss == loss and abs(loss) != float("inf")) and not skipped:
            raise RuntimeError(f"loss is {loss} at step {s}")
        emit({"event": "step", "rank": 0, "step": s, "loss": loss, "step_ms": ms, "device_ms": device_ms, "grad_norm": norm, "loss_scale": scale, "skipped": skipped})

    recs = train(model, batch, int(spec["steps"]), device, precision, float(spec["lr"]), float(spec["weight_decay"]), float(spec["max_grad_norm"]),
                 tc.get("compile", True), schedule=(spec["lr_schedule"], int(spec["lr_warmup_steps"])), on_step=step)
    params = sum(p.numel() for p in model.parameters())
    emit({
        "event": "summary",
        "param_count": params,
        "peak_mem_bytes": watch.peak_bytes() if watch else peak_bytes("cpu"),
        # torch.optim.AdamW: exp_avg and exp_avg_sq in fp32 for every parameter.
        "optimizer_bytes_per_rank": 8 * params,
        "hw_flops_per_sample": None,
        "compile_s": recs[0][1] / 1e3,
        # The memory split (bench/src/mem_split.rs): fp32 parameters (the worker loads them so),
        # their gradients and both AdamW moments from the count; what inductor keeps of the
        # logits and the activations is not known, so they are left unknown, not guessed.
        "mem_split": {"params_bytes": 4 * params, "grads_bytes": 4 * params, "optimizer_bytes": 8 * params,
                      "activations_bytes": None, "logits_bytes": None, "source": "analytic"},
    })


def worker_main():
    if len(sys.argv) != 3:
        print("usage: torch-compile.py --worker SPEC.json", file=sys.stderr)
        sys.exit(2)
    try:
        worker(sys.argv[2])
    except Exception as e:  # noqa: BLE001 - every failure is the run's error record
        message = f"{e}" if isinstance(e, Refused) else f"{type(e).__name__}: {e}"
        oom = isinstance(e, torch.OutOfMemoryError) or "out of memory" in message.lower() or "not enough memory" in message.lower()
        emit({"event": "error", "message": f"torch-compile: {message}".strip(), "oom": oom})
        import traceback

        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_main()
    else:
        main()
