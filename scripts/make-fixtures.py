#!/usr/bin/env python3
"""Generates tests/fixtures/: tiny BERT and GPT-2 in HF format plus the losses HF Transformers
computes for them, the independent reference the baseline's parity test compares against.

Needs `transformers` (not a runtime dependency of ortbench):
    .venv/bin/pip install transformers==5.23.0 && .venv/bin/python scripts/make-fixtures.py [NAME ...]
(NAME: only those fixtures; default all).

The padded fixtures (`*-padded`) have rows of random lengths, right-padded, with HF's
`attention_mask`; labels are -100 at padding (the collators' rule), and HF is given the mask.

The training loop is HF Trainer's step written out: AdamW (torch.optim.AdamW(fused=True), what
Trainer's default optim="adamw_torch_fused" builds for torch >= 2.8; Trainer's decay groups: no
decay on biases and LayerNorm weights), clip_grad_norm_ at 1.0, constant LR, dropout off.

The committed fixtures were generated before fused=True was set here (torch.optim.AdamW's
default, the single-tensor loop on CPU); the baseline, which steps with the fused kernel,
reproduces their losses within 7.5e-8 relative, so they were kept (this environment has no
transformers to regenerate them). Regenerating changes the losses only at fp32 rounding.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification, GPT2Config,
                          GPT2ForSequenceClassification, GPT2LMHeadModel)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures")
ROWS, SEQ, BATCH, STEPS = 12, 32, 4, 8
LR, WD, CLIP = 1e-3, 0.01, 1.0


def decay_names(model):
    # transformers.Trainer.get_decay_parameter_names
    from transformers.trainer_pt_utils import get_parameter_names
    from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS

    return set(get_parameter_names(model, ALL_LAYERNORM_LAYERS, ["bias", "layernorm", "rmsnorm"]))


def make(name, cls, cfg_cls, seed, base=None, padded=False, **overrides):
    cfg = json.load(open(os.path.join(ROOT, "models", "configs", f"{base or name}.json")))
    for k in ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if k in cfg:
            cfg[k] = 0.0
    cfg.pop("architectures", None)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = cls(cfg_cls(**cfg, attn_implementation="sdpa"))
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg["vocab_size"], size=(ROWS, SEQ), dtype=np.int64)
    tensors = {"input_ids": ids}
    # Padding: rows of 6..SEQ tokens (two rows full) and pad_token_id (BERT's 0; GPT-2 has
    # none, so its eos as HF users set it) on the right; GPT-2's odd rows on the left (as
    # tokenizers with padding_side="left" give it: every key of a pad query is then masked).
    tokens = np.full(ROWS, SEQ)
    if padded:
        tokens = rng.integers(6, SEQ + 1, size=ROWS)
        tokens[:2] = SEQ
        pad = cfg.get("pad_token_id")
        pad = cfg.get("eos_token_id", cfg["vocab_size"] - 1) if pad is None else pad
        mask = (np.arange(SEQ)[None, :] < tokens[:, None]).astype(np.int64)
        if cls in (GPT2LMHeadModel, GPT2ForSequenceClassification):
            mask[1::2] = mask[1::2, ::-1]
        ids = np.where(mask == 1, ids, pad)
        tensors = {"input_ids": ids, "attention_mask": mask}
    if cls is BertForMaskedLM:
        labels = np.full_like(ids, -100)
        sel = (rng.random(ids.shape) < 0.15) & (np.arange(SEQ)[None, :] < tokens[:, None])
        sel[:, 0] = True  # at least one label per row
        labels[sel] = ids[sel]
        ids = ids.copy()
        ids[sel] = 103
        tensors.update(input_ids=ids, labels=labels)
    elif cls in (BertForSequenceClassification, GPT2ForSequenceClassification):
        n = model.config.num_labels
        if n == 1:  # regression: float targets
            tensors["labels"] = rng.normal(size=ROWS).astype(np.float32)
        elif cfg.get("problem_type") == "multi_label_classification":  # float 0/1 targets
            tensors["labels"] = rng.integers(0, 2, size=(ROWS, n)).astype(np.float32)
        else:
            tensors["labels"] = rng.integers(0, n, size=ROWS, dtype=np.int64)
    elif padded:
        tensors["labels"] = np.where(tensors["attention_mask"] == 1, ids, -100)
    save_file(tensors, os.path.join(out, "batches.safetensors"))

    decay = decay_names(model)
    params = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in params if n in decay], "weight_decay": WD},
        {"params": [p for n, p in params if n not in decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, fused=True)
    model.train()
    losses, norms = [], []
    for step in range(STEPS):
        rows = [(step * BATCH + i) % ROWS for i in range(BATCH)]
        batch_ids = torch.from_numpy(tensors["input_ids"][rows])
        batch_labels = torch.from_numpy(tensors["labels"][rows]) if "labels" in tensors else batch_ids
        kwargs = {"attention_mask": torch.from_numpy(tensors["attention_mask"][rows])} if padded else {}
        loss = model(input_ids=batch_ids, labels=batch_labels, **kwargs).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        norms.append(norm.item())
    meta = {
        "losses": losses,
        "grad_norms": norms,
        "lr": LR,
        "weight_decay": WD,
        "max_grad_norm": CLIP,
        "batch_size": BATCH,
        "seq_len": SEQ,
        "steps": STEPS,
        "decay_params": sorted(decay),
        "optim": "adamw_torch_fused",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    json.dump(meta, open(os.path.join(out, "expected.json"), "w"), indent=1)
    print(name, [round(l, 4) for l in losses], file=sys.stderr)


FIXTURES = {
    "tiny-bert": lambda: make("tiny-bert", BertForMaskedLM, BertConfig, 1234),
    "tiny-gpt2": lambda: make("tiny-gpt2", GPT2LMHeadModel, GPT2Config, 4321),
    # initializer_range 0.2 (HF's default is 0.02): attention far from uniform, so that a mask
    # ignored moves the loss well past the tests' 1e-4.
    "tiny-bert-padded": lambda: make(
        "tiny-bert-padded", BertForMaskedLM, BertConfig, 1235, base="tiny-bert", padded=True, initializer_range=0.2
    ),
    "tiny-bert-cls-padded": lambda: make(
        "tiny-bert-cls-padded", BertForSequenceClassification, BertConfig, 1236, base="tiny-bert", padded=True,
        num_labels=3, initializer_range=0.2
    ),
    "tiny-gpt2-padded": lambda: make(
        "tiny-gpt2-padded", GPT2LMHeadModel, GPT2Config, 4322, base="tiny-gpt2", padded=True, initializer_range=0.2
    ),
    # The other classification heads and losses (padded; GPT-2 pools the last non-pad token).
    "tiny-gpt2-cls-padded": lambda: make(
        "tiny-gpt2-cls-padded", GPT2ForSequenceClassification, GPT2Config, 4323, base="tiny-gpt2", padded=True,
        num_labels=3, pad_token_id=0, initializer_range=0.2
    ),
    "tiny-bert-multilabel-padded": lambda: make(
        "tiny-bert-multilabel-padded", BertForSequenceClassification, BertConfig, 1237, base="tiny-bert", padded=True,
        num_labels=4, problem_type="multi_label_classification", initializer_range=0.2
    ),
    "tiny-gpt2-regression-padded": lambda: make(
        "tiny-gpt2-regression-padded", GPT2ForSequenceClassification, GPT2Config, 4324, base="tiny-gpt2", padded=True,
        num_labels=1, pad_token_id=0  # HF's init: at 0.2 its gradient norms of ~90 make 8 clipped steps chaotic
    ),
}
for fixture in sys.argv[1:] or FIXTURES:
    FIXTURES[fixture]()
