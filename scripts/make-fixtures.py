#!/usr/bin/env python3
"""Generates tests/fixtures/: tiny BERT and GPT-2 in HF format plus the losses HF Transformers
computes for them, the independent reference the baseline's parity test compares against.

Needs `transformers` (pinned in scripts/requirements.txt, which scripts/setup installs):
    .venv/bin/python scripts/make-fixtures.py [NAME ...]
(NAME: only those fixtures; default all).

The padded fixtures (`*-padded`) have rows of random lengths, right-padded, with HF's
`attention_mask`; labels are -100 at padding (the collators' rule), and HF is given the mask.

The training loop is HF Trainer's step written out: AdamW (torch.optim.AdamW(fused=True), what
Trainer's default optim="adamw_torch_fused" builds for torch >= 2.8; Trainer's decay groups, from
Trainer.get_decay_parameter_names: no decay on biases, LayerNorm weights and any norm weight — RMSNorm,
model.norm, q_norm/k_norm), clip_grad_norm_ at 1.0, constant LR, dropout off.

The committed fixtures were generated before fused=True was set here (torch.optim.AdamW's
default, the single-tensor loop on CPU); the baseline, which steps with the fused kernel,
reproduces their losses within 7.5e-8 relative, so they were kept. Regenerating them changes
the losses only at fp32 rounding. The fixtures added since (padded, the other heads, text) were
made with transformers 5.23.0 and torch 2.11.0 by this script, as were the Llama family's (Llama,
Mistral, Qwen2, Qwen3: LLAMA_FIXTURES), whose expected.json also names the HF class (`hf_class`) and
holds step-0 losses of the same weights with one thing taken away (`loss0_without_*`).

Other targets: `model-configs` writes the Llama family's configs in models/configs/ as transformers
saves them; `config-defaults` writes tests/fixtures/config-defaults.json (HF's config defaults).
"""
import copy
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification,
                          DistilBertConfig, DistilBertForMaskedLM, DistilBertForSequenceClassification,
                          RobertaConfig, RobertaForMaskedLM, RobertaForSequenceClassification,
                          RobertaForTokenClassification, GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          LlamaForSequenceClassification, MistralConfig, MistralForCausalLM,
                          MistralForSequenceClassification, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2ForSequenceClassification, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3ForSequenceClassification, SmolLM3Config, SmolLM3ForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Phi3ForSequenceClassification, GemmaConfig, GemmaForCausalLM,
                          GemmaForSequenceClassification, Gemma2Config, Gemma2ForCausalLM,
                          Gemma2ForSequenceClassification, Gemma3TextConfig, Gemma3ForCausalLM,
                          Gemma3TextForSequenceClassification)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures")
ROWS, SEQ, BATCH, STEPS = 12, 32, 4, 8
LR, WD, CLIP = 1e-3, 0.01, 1.0


def decay_names(model):
    # transformers.Trainer.get_decay_parameter_names itself (it uses no Trainer state). In 5.23: no
    # decay on nn.LayerNorm modules and on names matching bias, layernorm, rmsnorm, `.norm.`/`norm`
    # as a whole component, or `_norm.` (so no RMSNorm weight of Llama/Qwen decays either: input_/
    # post_attention_layernorm, model.norm, q_norm, k_norm). The BERT/GPT-2 fixtures' decay_params
    # are the same under the older three-pattern rule this used to spell out.
    from transformers import Trainer

    return set(Trainer.get_decay_parameter_names(None, model))


def perturb(model, seed):
    """Moves every norm weight off HF's init (ones) and every bias off zero, so that a weight read
    wrongly, or one left out, shows in the losses."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            norm = "Norm" in type(mod).__name__
            for p_name, p in mod.named_parameters(recurse=False):
                if norm and p_name == "weight":
                    noise = 0.2 * torch.randn(p.shape, generator=g)
                    # Gemma's (1 + w) norms start at 0: moved by the same draw, added.
                    p.add_(noise) if bool((p == 0).all()) else p.mul_(1 + noise)
                elif p_name == "bias":
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))


def make(name, cls, cfg_cls, seed, base=None, padded=False, randomise=False, left_pad=None, pad_in_text=False,
         departures=None, departure_inputs=None, attn="sdpa", **overrides):
    """`randomise`: norm weights and biases moved off their init (perturb). `left_pad`: odd rows padded
    on the left (default: GPT-2's fixtures). `pad_in_text`: pad_token_id planted among the real tokens
    of rows 2 and 3 (nn.Embedding's padding_idx then takes no gradient from them) and, for sequence
    classification, as row 4's last real token (HF pools the rightmost token that is not pad).
    `departures`: {key: config overrides}: the step-0 loss of the same weights under those overrides
    (e.g. without the sliding window), recorded in expected.json beside HF's. `departure_inputs`: {key:
    f(input_ids) -> extra forward kwargs}: the same, with inputs HF computes otherwise given explicitly (e.g.
    RoBERTa's positions as BERT's 0..T). `attn`: HF's attention implementation (Gemma 2's default is eager: sdpa
    has no soft-capping)."""
    cfg = json.load(open(os.path.join(ROOT, "models", "configs", f"{base or name}.json")))
    for k in ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop",
              "attention_dropout", "dropout", "seq_classif_dropout", "qa_dropout"):
        if k in cfg:
            cfg[k] = 0.0
    cfg.pop("architectures", None)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = cls(cfg_cls(**cfg, attn_implementation=attn))
    if randomise:
        perturb(model, seed)
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
        if cls in (GPT2LMHeadModel, GPT2ForSequenceClassification) if left_pad is None else left_pad:
            mask[1::2] = mask[1::2, ::-1]
        if pad_in_text:
            for row, col in ((2, 3), (3, 4)):
                ids[row, np.flatnonzero(mask[row])[col]] = pad
            if cls.__name__.endswith("ForSequenceClassification"):
                ids[4, np.flatnonzero(mask[4])[-1]] = pad
        ids = np.where(mask == 1, ids, pad)
        tensors = {"input_ids": ids, "attention_mask": mask}
    if cls.__name__.endswith("ForMaskedLM"):  # 15 % of real tokens, replaced by id 103
        labels = np.full_like(ids, -100)
        sel = (rng.random(ids.shape) < 0.15) & (np.arange(SEQ)[None, :] < tokens[:, None])
        sel[:, 0] = True  # at least one label per row
        labels[sel] = ids[sel]
        ids = ids.copy()
        ids[sel] = 103
        tensors.update(input_ids=ids, labels=labels)
    elif cls.__name__.endswith("ForTokenClassification"):  # a tag per token, -100 at padding
        tags = rng.integers(0, model.config.num_labels, size=ids.shape, dtype=np.int64)
        tensors["labels"] = np.where(tensors["attention_mask"] == 1, tags, -100)
    elif cls.__name__.endswith("ForSequenceClassification"):
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

    def step0_loss(m, mask=True, inputs=None):
        rows = list(range(BATCH))
        labels = torch.from_numpy(tensors["labels"][rows]) if "labels" in tensors else torch.from_numpy(ids[rows])
        kwargs = {"attention_mask": torch.from_numpy(tensors["attention_mask"][rows])} if padded and mask else {}
        batch_ids = torch.from_numpy(tensors["input_ids"][rows])
        kwargs.update(inputs(batch_ids) if inputs else {})
        with torch.no_grad():
            return m(input_ids=batch_ids, labels=labels, **kwargs).loss.item()

    extra = {}
    if padded and randomise:  # what the mask is worth here: the same step 0 without it
        extra["loss0_without_attention_mask"] = step0_loss(model, mask=False)
    for key, changes in (departures or {}).items():
        other = cls(cfg_cls(**{**cfg, **changes}, attn_implementation=attn))
        other.load_state_dict(model.state_dict())
        other.train()
        extra[key] = step0_loss(other)
    for key, inputs in (departure_inputs or {}).items():
        model.train()
        extra[key] = step0_loss(model, inputs=inputs)
    if extra:
        model.train()
        extra["loss0_check"] = step0_loss(model)

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
    for key in extra:
        if key != "loss0_check":
            assert abs(extra["loss0_check"] - losses[0]) < 1e-6, (extra["loss0_check"], losses[0])
            print(f"{name}: {key} {extra[key]:.6f} vs loss0 {losses[0]:.6f}: diff {extra[key] - losses[0]:+.3e}",
                  file=sys.stderr)
    extra.pop("loss0_check", None)
    meta = {
        "hf_class": cls.__name__,
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
        **extra,
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
    "tiny-bert-token-cls-padded": lambda: make(
        "tiny-bert-token-cls-padded", BertForTokenClassification, BertConfig, 1238, base="tiny-bert", padded=True,
        num_labels=5, initializer_range=0.2
    ),
    "tiny-gpt2-regression-padded": lambda: make(
        "tiny-gpt2-regression-padded", GPT2ForSequenceClassification, GPT2Config, 4324, base="tiny-gpt2", padded=True,
        num_labels=1, pad_token_id=0  # HF's init: at 0.2 its gradient norms of ~90 make 8 clipped steps chaotic
    ),
}

# The Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2/Qwen3ForCausalLM and the sequence
# classification head), transformers 5.23 with sdpa. All have their norm weights and biases moved off
# HF's init (`randomise`) and initializer_range 0.2 (attention far from uniform).
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
LLAMA_FIXTURES = {
    # GQA (4 heads, 2 kv heads), right-padded with the odd rows on the left (HF's position_ids stay
    # 0..T-1 whatever the mask: a left-padded row's tokens sit at positions T-n..T-1), pad id 0, which
    # also stands among the real tokens of rows 2 and 3 (padding_idx: that embedding row gets no gradient
    # from the lookup, only from the tied lm_head).
    "tiny-llama-padded": dict(cls=LlamaForCausalLM, cfg_cls=LlamaConfig, seed=5001, base="tiny-llama", padded=True,
                              left_pad=True, pad_in_text=True, pad_token_id=0),
    "tiny-llama-mqa": dict(cls=LlamaForCausalLM, cfg_cls=LlamaConfig, seed=5002, base="tiny-llama",
                           num_key_value_heads=1),
    # llama3 rope scaling with original_max_position_embeddings 32 (head_dim 16, theta 1e4): frequency 0
    # kept (wavelength 6.3 < 8), 1 smoothed (19.9), 2..7 divided by 8 (wavelengths 63..19869 > 32).
    "tiny-llama-rope-llama3": dict(cls=LlamaForCausalLM, cfg_cls=LlamaConfig, seed=5003, base="tiny-llama",
                                   rope_parameters=LLAMA3_ROPE, departures={"loss0_without_rope_scaling": {
                                       "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}}),
    # The other rope types HF 5.23 computes for the family, each made to bite at the fixtures' 32
    # positions: linear (every frequency / 4); dynamic NTK with max_position_embeddings 16 (the
    # 32-token batches grow the base: θ·(2·32/16 − 1)^(16/14)); yarn with factor 4 over an original
    # length of 8 (max_position_embeddings 32: the implicit factor agrees) — frequencies 0..1
    # extrapolated, 2..3 ramped, 4..7 interpolated, cos/sin × (0.1·ln 4 + 1).
    "tiny-llama-rope-linear": dict(cls=LlamaForCausalLM, cfg_cls=LlamaConfig, seed=5012, base="tiny-llama",
                                   rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
                                   departures={"loss0_without_rope_scaling": {
                                       "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}}),
    "tiny-llama-rope-dynamic": dict(cls=LlamaForCausalLM, cfg_cls=LlamaConfig, seed=5013, base="tiny-llama",
                                    max_position_embeddings=16,
                                    rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
                                    departures={"loss0_without_rope_scaling": {
                                        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}}),
    "tiny-llama-rope-yarn": dict(cls=LlamaForCausalLM, cfg_cls=LlamaConfig, seed=5014, base="tiny-llama",
                                 max_position_embeddings=32,
                                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                  "original_max_position_embeddings": 8},
                                 departures={"loss0_without_rope_scaling": {
                                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}}),
    # longrope (Phi-3's) on a Llama: an original length of 16 and max_position_embeddings 64, so the
    # 32-token batches take the long factors and cos/sin × √(1 + ln 4 / ln 16).
    "tiny-llama-rope-longrope": dict(cls=LlamaForCausalLM, cfg_cls=LlamaConfig, seed=5016, base="tiny-llama",
                                     max_position_embeddings=64,
                                     rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                      "original_max_position_embeddings": 16,
                                                      "short_factor": [1.0, 1.0, 1.05, 1.1, 1.2, 1.4, 1.6, 2.0],
                                                      "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]},
                                     departures={"loss0_without_rope_scaling": {
                                         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}}),
    # SmolLM3's NoPE layers: no_rope_layer_interval 2, so layer 1 of 2 skips the rotary embedding;
    # padded as tiny-llama-padded. Departure: every layer rotary (no_rope_layers all 1).
    "tiny-smollm3-padded": dict(cls=SmolLM3ForCausalLM, cfg_cls=SmolLM3Config, seed=5015, base="tiny-smollm3",
                                padded=True, left_pad=True, pad_in_text=True, pad_token_id=0,
                                departures={"loss0_without_nope": {"no_rope_layers": [1, 1]}}),
    # Phi-3: fused qkv_proj and gate_up_proj, every layer sliding (4 of 32 positions), padded as
    # tiny-llama-padded; departure: no window.
    "tiny-phi3-padded": dict(cls=Phi3ForCausalLM, cfg_cls=Phi3Config, seed=5017, base="tiny-phi3", padded=True,
                             left_pad=True, pad_in_text=True, sliding_window=4,
                             departures={"loss0_without_sliding_window": {"sliding_window": None}}),
    # Phi-3's longrope, given in the legacy form (rope_scaling type "su", which Phi3Config reads as
    # longrope): original length 16 of max_position_embeddings 64, so the 32-token batches take the
    # long factors. Phi3Config's top-level original_max_position_embeddings is the one its rope
    # reads (it overrides the dict's).
    "tiny-phi3-longrope": dict(cls=Phi3ForCausalLM, cfg_cls=Phi3Config, seed=5018, base="tiny-phi3",
                               max_position_embeddings=64, original_max_position_embeddings=16, rope_parameters=None,
                               rope_scaling={"type": "su", "rope_theta": 10000.0,
                                             "original_max_position_embeddings": 16,
                                             "short_factor": [1.0, 1.0, 1.05, 1.1, 1.2, 1.4, 1.6, 2.0],
                                             "long_factor": [2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0]},
                               departures={"loss0_without_rope_scaling": {
                                   "rope_scaling": None,
                                   "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}}),
    # Phi-3's partial rotary embedding: the first half of each head's 16 dimensions turned, the rest passed
    # through. Departure: the whole head turned.
    "tiny-phi3-partial": dict(cls=Phi3ForCausalLM, cfg_cls=Phi3Config, seed=5020, base="tiny-phi3",
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.5},
                              departures={"loss0_without_partial_rotary": {
                                  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 1.0}}}),
    "tiny-phi3-cls-padded": dict(cls=Phi3ForSequenceClassification, cfg_cls=Phi3Config, seed=5019,
                                 base="tiny-phi3", padded=True, left_pad=True, pad_in_text=True, num_labels=3,
                                 initializer_range=0.05),
    # Gemma: (1 + w) RMSNorms (weights from 0, moved by perturb), the embedding × √64, GeGLU, head_dim 24;
    # padded as tiny-llama-padded; its classifier.
    "tiny-gemma-padded": dict(cls=GemmaForCausalLM, cfg_cls=GemmaConfig, seed=5021, base="tiny-gemma", padded=True,
                              left_pad=True, pad_in_text=True),
    "tiny-gemma-cls-padded": dict(cls=GemmaForSequenceClassification, cfg_cls=GemmaConfig, seed=5022,
                                  base="tiny-gemma", padded=True, left_pad=True, pad_in_text=True, num_labels=3,
                                  initializer_range=0.05),
    # Gemma 2: query_pre_attn_scalar 6 (head_dim 24: scores twice HF's default scale), sliding and global layers alternating (window 8 of the 32
    # positions), attention scores capped at 3 and logits at 2 (both saturate: scores and logits reach several
    # caps at initializer_range 0.2), norms around attention and MLP; eager attention (HF's default for Gemma 2).
    # Departures: no soft-capping; no window; the scale head_dim^-1/2.
    "tiny-gemma2-padded": dict(cls=Gemma2ForCausalLM, cfg_cls=Gemma2Config, seed=5023, base="tiny-gemma2",
                               padded=True, left_pad=True, pad_in_text=True, attn="eager", sliding_window=8,
                               attn_logit_softcapping=3.0, final_logit_softcapping=2.0, query_pre_attn_scalar=6,
                               departures={"loss0_without_softcapping": {"attn_logit_softcapping": None,
                                                                         "final_logit_softcapping": None},
                                           "loss0_without_sliding_window": {
                                               "layer_types": ["full_attention", "full_attention"]},
                                           "loss0_with_head_dim_scale": {"query_pre_attn_scalar": 24}}),
    "tiny-gemma2-cls-padded": dict(cls=Gemma2ForSequenceClassification, cfg_cls=Gemma2Config, seed=5024,
                                   base="tiny-gemma2", padded=True, left_pad=True, pad_in_text=True, num_labels=3,
                                   attn="eager", sliding_window=8, initializer_range=0.05),
    # Gemma 3: q/k norms, layer 0 sliding (window 8) with the local rope (base 100, so that it turns fast enough
    # to differ inside the window), layer 1 global with linear scaling (factor 4, base 1e6), query_pre_attn_scalar 32. Departures: the global rope on the sliding layer
    # too; no window.
    "tiny-gemma3-padded": dict(cls=Gemma3ForCausalLM, cfg_cls=Gemma3TextConfig, seed=5025, base="tiny-gemma3",
                               padded=True, left_pad=True, pad_in_text=True, sliding_window=8,
                               rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                   "rope_theta": 1000000.0},
                                                "sliding_attention": {"rope_type": "default",
                                                                      "rope_theta": 100.0}},
                               departures={"loss0_without_local_rope": {"rope_parameters": {
                                   "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                                   "sliding_attention": {"rope_type": "linear", "factor": 4.0,
                                                         "rope_theta": 1000000.0}}},
                                   "loss0_without_sliding_window": {
                                       "layer_types": ["full_attention", "full_attention"]}}),
    "tiny-gemma3-cls-padded": dict(cls=Gemma3TextForSequenceClassification, cfg_cls=Gemma3TextConfig, seed=5026,
                                   base="tiny-gemma3", padded=True, left_pad=True, pad_in_text=True, num_labels=3,
                                   sliding_window=8, initializer_range=0.05),
    # Mistral's sliding window (8 of the 32 positions: a query sees itself and the 7 before it).
    "tiny-mistral-window": dict(cls=MistralForCausalLM, cfg_cls=MistralConfig, seed=5004, base="tiny-mistral",
                                sliding_window=8,
                                departures={"loss0_without_sliding_window": {"sliding_window": None}}),
    # q/k/v biases (o_proj has none).
    "tiny-qwen2": dict(cls=Qwen2ForCausalLM, cfg_cls=Qwen2Config, seed=5005, base="tiny-qwen2"),
    # head_dim 16 with hidden 48 / 4 heads, RMSNorm on each head's q and k before RoPE.
    "tiny-qwen3": dict(cls=Qwen3ForCausalLM, cfg_cls=Qwen3Config, seed=5006, base="tiny-qwen3"),
    # LlamaForSequenceClassification pools the rightmost token that is not pad_token_id (row 4's last
    # real token is the pad id, so it pools the one before; the odd rows, padded on the left, pool the
    # last position and need the mask). initializer_range 0.05: at 0.2 or 0.1 its gradient norms of 15-40
    # make the 8 clipped steps move 2-3e-4 for a 1e-6 relative change of the weights (3e-6 at 0.05).
    "tiny-llama-cls-padded": dict(cls=LlamaForSequenceClassification, cfg_cls=LlamaConfig, seed=5007,
                                  base="tiny-llama", padded=True, left_pad=True, pad_in_text=True, num_labels=3,
                                  pad_token_id=0, initializer_range=0.05),
    # The other three families' classifiers (HF's generic ForSequenceClassification: last non-pad
    # token, score without bias), padded as tiny-llama-cls-padded; Qwen2's q/k/v biases and Qwen3's
    # q/k norms under the pooled head.
    "tiny-mistral-cls-padded": dict(cls=MistralForSequenceClassification, cfg_cls=MistralConfig, seed=5009,
                                    base="tiny-mistral", padded=True, left_pad=True, pad_in_text=True, num_labels=3,
                                    pad_token_id=0, initializer_range=0.05),
    "tiny-qwen2-cls-padded": dict(cls=Qwen2ForSequenceClassification, cfg_cls=Qwen2Config, seed=5010,
                                  base="tiny-qwen2", padded=True, left_pad=True, pad_in_text=True, num_labels=3,
                                  pad_token_id=0, initializer_range=0.05),
    "tiny-qwen3-cls-padded": dict(cls=Qwen3ForSequenceClassification, cfg_cls=Qwen3Config, seed=5011,
                                  base="tiny-qwen3", padded=True, left_pad=True, pad_in_text=True, num_labels=3,
                                  pad_token_id=0, initializer_range=0.05),
    # Qwen2's windowed layers: use_sliding_window with max_window_layers 1 of 2, so layer 0 is full
    # attention and layer 1 sliding (layer_types recomputed from those).
    "tiny-qwen2-window": dict(cls=Qwen2ForCausalLM, cfg_cls=Qwen2Config, seed=5008, base="tiny-qwen2",
                              use_sliding_window=True, sliding_window=8, max_window_layers=1, layer_types=None,
                              departures={"loss0_without_sliding_window": {"use_sliding_window": False,
                                                                           "layer_types": None}}),
}

# RoBERTa and DistilBERT (transformers 5.23, sdpa), padded with pad ids planted inside the text, norm weights and
# biases randomised, initializer_range 0.2. RoBERTa's odd rows are left-padded, so that its positions (counted from
# pad + 1 over the non-pad tokens) differ from BERT's 0..T in both ways; the departure is HF's own step-0 loss with
# position_ids = 0..T given explicitly.
BERT_POSITIONS = {"loss0_with_bert_positions": lambda ids: {"position_ids": torch.arange(ids.shape[1]).expand(ids.shape)}}
FIXTURES.update({
    "tiny-roberta-padded": lambda: make(
        "tiny-roberta-padded", RobertaForMaskedLM, RobertaConfig, 2101, base="tiny-roberta", padded=True,
        randomise=True, left_pad=True, pad_in_text=True, departure_inputs=BERT_POSITIONS, initializer_range=0.2),
    "tiny-roberta-cls-padded": lambda: make(
        "tiny-roberta-cls-padded", RobertaForSequenceClassification, RobertaConfig, 2102, base="tiny-roberta",
        padded=True, randomise=True, left_pad=True, pad_in_text=True, departure_inputs=BERT_POSITIONS, num_labels=3,
        initializer_range=0.2),
    "tiny-roberta-token-cls-padded": lambda: make(
        "tiny-roberta-token-cls-padded", RobertaForTokenClassification, RobertaConfig, 2103, base="tiny-roberta",
        padded=True, randomise=True, left_pad=False, pad_in_text=True, num_labels=5, initializer_range=0.2),
    "tiny-distilbert-padded": lambda: make(
        "tiny-distilbert-padded", DistilBertForMaskedLM, DistilBertConfig, 2201, base="tiny-distilbert", padded=True,
        randomise=True, left_pad=False, pad_in_text=True, initializer_range=0.2),
    "tiny-distilbert-cls-padded": lambda: make(
        "tiny-distilbert-cls-padded", DistilBertForSequenceClassification, DistilBertConfig, 2202,
        base="tiny-distilbert", padded=True, randomise=True, left_pad=False, pad_in_text=True, num_labels=3,
        initializer_range=0.05),  # at 0.2 its loss falls to 0.03 by step 6, where fp32 rounding is 2e-5 of it
})


def _llama_fixture(name, kw):
    kw = dict(kw)
    return lambda: make(name, kw.pop("cls"), kw.pop("cfg_cls"), kw.pop("seed"), randomise=True,
                        **{"initializer_range": 0.2, **kw})


FIXTURES.update({name: _llama_fixture(name, kw) for name, kw in LLAMA_FIXTURES.items()})


# ---------------------------------------------------------------------------------------------
# The Llama family's configs (models/configs/): the hub's config.json of four published models,
# written out from their pages (legacy rope_theta / rope_scaling form, transformers 4.4x), and the
# tiny test configs. `model-configs` writes each as transformers 5.23 saves it (the config object's
# save_pretrained: rope settings in `rope_parameters`; Qwen's sliding_window null when
# use_sliding_window is false, and its layer_types), checks it round-trips through AutoConfig and
# that the model it builds (on the meta device) has the published parameter count.

HUB_CONFIGS = {
    "smollm2-135m": {  # HuggingFaceTB/SmolLM2-135M
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
        "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
        "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
        "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False,
        "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1", "use_cache": True, "vocab_size": 49152,
    },
    # HuggingFaceTB/SmolLM3-3B: Llama's layout, rotary off on every fourth layer (no_rope_layers
    # from no_rope_layer_interval 4), rope_theta 5e6, 64 K positions, tied embeddings.
    "smollm3-3b": {
        "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 65536, "mlp_bias": False,
        "model_type": "smollm3", "no_rope_layer_interval": 4, "num_attention_heads": 16, "num_hidden_layers": 36,
        "num_key_value_heads": 4, "pad_token_id": 128004, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 5000000.0, "sliding_window": None, "tie_word_embeddings": True, "use_sliding_window": False,
        "vocab_size": 128256,
    },
    # microsoft/Phi-3-mini-4k-instruct: fused qkv_proj / gate_up_proj, every layer sliding (2047).
    "phi-3-mini-4k-instruct": {
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
        "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True, "vocab_size": 32064,
    },
    "qwen2.5-0.5b": {  # Qwen/Qwen2.5-0.5B
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "qwen3-0.6b": {  # Qwen/Qwen3-0.6B
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
        "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    },
    # google/gemma-2-2b: soft-capping (attention 50, logits 30), query_pre_attn_scalar 256, alternating
    # sliding (4096) and global layers, sandwich norms, both hidden_act and hidden_activation given.
    "gemma-2-2b": {
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
        "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
        "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
        "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
        "transformers_version": "4.42.4", "use_cache": True, "vocab_size": 256000,
    },
    # google/gemma-3-270m: Gemma 3's text model — five sliding layers (512) to a global one, local rope base 1e4,
    # global 1e6, q/k norms, no soft-capping, a 262 144-token vocabulary.
    "gemma-3-270m": {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
        "intermediate_size": 2048, "max_position_embeddings": 32768, "model_type": "gemma3_text",
        "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
        "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 262144,
    },
    # google/gemma-3-1b-pt: the same layout at hidden 1152, 26 layers.
    "gemma-3-1b": {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
        "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 262144,
    },
    "llama-3.2-1b": {  # meta-llama/Llama-3.2-1B
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
    },
}
# The sizes their model pages give (safetensors parameter counts; tied lm_head counted once).
PUBLISHED_PARAMS = {"gemma-2-2b": 2_614_341_888, "gemma-3-270m": 268_098_176, "gemma-3-1b": 999_885_952,
                    "phi-3-mini-4k-instruct": 3_821_079_552, "smollm3-3b": 3_075_098_624, "smollm2-135m": 134_515_008, "qwen2.5-0.5b": 494_032_768, "qwen3-0.6b": 596_049_920,
                    "llama-3.2-1b": 1_235_814_400}

# Tiny test configs: sizes off multiples of 8 where HF allows (head_dim must stay even for RoPE's
# rotate_half, hidden a multiple of heads for Llama/Mistral), GQA everywhere, tied and untied heads.
TINY_CONFIGS = {
    "tiny-llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 259, "hidden_size": 64,
        "intermediate_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_act": "silu", "max_position_embeddings": 128, "initializer_range": 0.02, "rms_norm_eps": 1e-05,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True, "rope_theta": 10000.0,
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
    },
    "tiny-mistral": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 263, "hidden_size": 48,
        "intermediate_size": 90, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
        "hidden_act": "silu", "max_position_embeddings": 128, "initializer_range": 0.02, "rms_norm_eps": 1e-05,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "rope_theta": 10000.0,
        "sliding_window": 64, "attention_dropout": 0.0,
    },
    "tiny-qwen2": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 271, "hidden_size": 56,
        "intermediate_size": 84, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_act": "silu", "max_position_embeddings": 128, "initializer_range": 0.02, "rms_norm_eps": 1e-06,
        "bos_token_id": 269, "eos_token_id": 270, "tie_word_embeddings": True, "rope_theta": 1000000.0,
        "use_sliding_window": False, "sliding_window": 32, "max_window_layers": 2, "attention_dropout": 0.0,
    },
    "tiny-smollm3": {
        "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "vocab_size": 263, "hidden_size": 64,
        "intermediate_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_act": "silu", "max_position_embeddings": 128, "initializer_range": 0.02, "rms_norm_eps": 1e-06,
        "pad_token_id": None, "bos_token_id": 261, "eos_token_id": 262, "tie_word_embeddings": True,
        "rope_theta": 10000.0, "no_rope_layer_interval": 2, "use_sliding_window": False, "sliding_window": None,
        "attention_dropout": 0.0,
    },
    "tiny-phi3": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 267, "hidden_size": 64,
        "intermediate_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_act": "silu", "max_position_embeddings": 128, "original_max_position_embeddings": 128,
        "initializer_range": 0.02, "rms_norm_eps": 1e-05, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "tie_word_embeddings": False, "rope_theta": 10000.0, "sliding_window": None, "attention_dropout": 0.0,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    },
    # Gemma: head_dim 24 with hidden 64 / 4 heads (not hidden / heads), tanh-GELU MLP, tied.
    "tiny-gemma": {
        "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "vocab_size": 263, "hidden_size": 64,
        "intermediate_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 24, "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 128, "initializer_range": 0.02,
        "rms_norm_eps": 1e-06, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1, "tie_word_embeddings": True,
        "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": 0.0,
    },
    # Gemma 2: hidden_activation (not hidden_act), query_pre_attn_scalar ≠ head_dim, both soft-caps, a window.
    "tiny-gemma2": {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": 269, "hidden_size": 64,
        "intermediate_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 24, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 128,
        "initializer_range": 0.02, "rms_norm_eps": 1e-06, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
        "tie_word_embeddings": True, "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": 0.0,
        "query_pre_attn_scalar": 20, "sliding_window": 64, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    # Gemma 3 (text): layer 0 sliding, layer 1 global (sliding_window_pattern 2), each with its rope.
    "tiny-gemma3": {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 271, "hidden_size": 64,
        "intermediate_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 24, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 128,
        "initializer_range": 0.02, "rms_norm_eps": 1e-06, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
        "tie_word_embeddings": True, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "attention_bias": False, "attention_dropout": 0.0, "query_pre_attn_scalar": 32, "sliding_window": 64,
        "sliding_window_pattern": 2,
    },
    "tiny-qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 251, "hidden_size": 48,
        "intermediate_size": 76, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 128, "initializer_range": 0.02,
        "rms_norm_eps": 1e-06, "bos_token_id": 249, "eos_token_id": 250, "tie_word_embeddings": False,
        "rope_theta": 1000000.0, "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": 2, "attention_dropout": 0.0,
    },
}


def hf_config(d):
    from transformers import AutoConfig

    d = copy.deepcopy(d)  # HF standardises nested rope dicts in place; the case keeps what was given
    return AutoConfig.for_model(d.pop("model_type"), **d)


def saved_form(d):
    """The config.json transformers saves for the config dict `d` (and a check that it reads back)."""
    import tempfile
    from transformers import AutoConfig

    cfg = hf_config(d)
    with tempfile.TemporaryDirectory() as tmp:
        cfg.save_pretrained(tmp)
        saved = json.load(open(os.path.join(tmp, "config.json")))
        back = AutoConfig.from_pretrained(tmp)
    strip = lambda c: {k: v for k, v in c.to_dict().items() if k != "_name_or_path"}
    assert strip(back) == strip(cfg), "config does not round-trip"
    assert strip(hf_config(saved)) == strip(cfg), "saved JSON does not rebuild the config"
    return saved, cfg


def make_model_configs():
    from transformers import AutoModelForCausalLM

    for name, d in {**HUB_CONFIGS, **TINY_CONFIGS}.items():
        saved, cfg = saved_form(d)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        n = sum(p.numel() for p in model.parameters())  # tied weights once
        if name in PUBLISHED_PARAMS:
            assert n == PUBLISHED_PARAMS[name], (name, n, PUBLISHED_PARAMS[name])
        with open(os.path.join(ROOT, "models", "configs", f"{name}.json"), "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True)
            f.write("\n")
        print(name, type(model).__name__, f"{n:,} parameters", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# `config-defaults`: what transformers 5.23's AutoConfig makes of minimal config.json files, so that
# the Rust config reader's defaults (every field a Transformers config class gives a default for is
# optional) are tested against HF's own. Each case: the config dict as a config.json would hold it and
# HF's `to_dict()` of AutoConfig.for_model for it (less _name_or_path and transformers_version). The
# `hub` cases are the published models' config.json in their legacy form (rope_theta / rope_scaling
# at the top level), which 5.23 reads into `rope_parameters`.

CONFIG_DEFAULT_CASES = [
    ("minimal", {"model_type": "bert"}),
    ("sized", {"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
               "intermediate_size": 100, "vocab_size": 259}),
    # RoBERTa: BertConfig's fields, its own vocab and pad defaults
    ("minimal", {"model_type": "roberta"}),
    ("sized", {"model_type": "roberta", "hidden_size": 48, "num_attention_heads": 4, "num_hidden_layers": 2,
               "intermediate_size": 100, "vocab_size": 261, "max_position_embeddings": 66, "type_vocab_size": 1}),
    # DistilBERT: its own field names (dim, n_layers, n_heads, hidden_dim, activation)
    ("minimal", {"model_type": "distilbert"}),
    ("sized", {"model_type": "distilbert", "dim": 64, "n_heads": 4, "n_layers": 2, "hidden_dim": 100,
               "vocab_size": 259, "activation": "relu", "seq_classif_dropout": 0.3}),
    ("minimal", {"model_type": "gpt2"}),
    ("sized", {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 259,
               "n_positions": 64}),
    ("minimal", {"model_type": "llama"}),
    # head_dim and num_key_value_heads derived from the sizes
    ("sized", {"model_type": "llama", "hidden_size": 96, "num_attention_heads": 6, "num_hidden_layers": 2,
               "intermediate_size": 100, "vocab_size": 259}),
    # legacy rope fields; llama3 scaling without original_max_position_embeddings (HF: max_position_embeddings)
    ("legacy-rope", {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "rope_theta": 500000.0, "max_position_embeddings": 2048,
                     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0}}),
    # the other rope types: legacy dynamic (`type`), linear, yarn without original_max_position_embeddings
    # (HF: max_position_embeddings) and with beta/truncate given
    ("rope-dynamic", {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                      "rope_scaling": {"type": "dynamic", "factor": 2.0}}),
    ("rope-linear", {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                     "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5}}),
    ("rope-yarn", {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                   "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}),
    ("rope-yarn-betas", {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                         "max_position_embeddings": 4096, "original_max_position_embeddings": 1024,
                         "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16,
                                             "beta_slow": 2, "truncate": False}}),
    ("rope-longrope", {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                       "max_position_embeddings": 4096,
                       "rope_parameters": {"rope_type": "longrope", "original_max_position_embeddings": 1024,
                                           "short_factor": [1.0] * 8, "long_factor": [1.0, 2, 3, 4, 5, 6, 7, 8]}}),
    ("minimal", {"model_type": "smollm3"}),
    ("sized", {"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 6,
               "no_rope_layer_interval": 3, "sliding_window": 16}),
    # use_sliding_window: the NoPE layers (no_rope_layers given) slide
    ("window", {"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4,
                "use_sliding_window": True, "sliding_window": 8, "no_rope_layers": [1, 0, 1, 0]}),
    # Phi-3: its defaults (vocab 32064, pad 32000, rms eps 1e-5, untied, no window); a sized one with a window and
    # longrope in the legacy "su" form (Phi3Config reads it as longrope)
    ("minimal", {"model_type": "phi3"}),
    ("sized", {"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
               "num_hidden_layers": 2, "intermediate_size": 100, "vocab_size": 267, "max_position_embeddings": 256,
               "sliding_window": 32, "resid_pdrop": 0.1,
               "rope_scaling": {"type": "su", "original_max_position_embeddings": 64, "short_factor": [1.0] * 8,
                                "long_factor": [2.0] * 8}}),
    # Gemma: head_dim 256 whatever the sizes, gelu_pytorch_tanh ("gelu" read as it), tied, pad 0
    ("minimal", {"model_type": "gemma"}),
    ("sized", {"model_type": "gemma", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
               "num_hidden_layers": 2, "intermediate_size": 100, "vocab_size": 263, "hidden_act": "gelu"}),
    # Gemma 2: its defaults (soft-caps 50 / 30, query_pre_attn_scalar 256, alternating layers, window 4096); sized
    # with hidden_act beside hidden_activation (the MLP reads the latter), a null window-free config refused
    ("minimal", {"model_type": "gemma2"}),
    ("sized", {"model_type": "gemma2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
               "num_hidden_layers": 3, "intermediate_size": 100, "vocab_size": 269, "query_pre_attn_scalar": 20,
               "attn_logit_softcapping": None, "sliding_window": 16}),
    # Gemma 3: per-layer-type rope (defaults 1e6 / 1e4), pattern 6; legacy rope_scaling onto the full layers
    ("minimal", {"model_type": "gemma3_text"}),
    ("sized", {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
               "num_hidden_layers": 4, "intermediate_size": 100, "vocab_size": 271, "sliding_window_pattern": 3,
               "rope_local_base_freq": 20000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
               "final_logit_softcapping": 30.0}),
    ("rope-dict", {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                   "layer_types": ["sliding_attention", "full_attention"],
                   "rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 5e3}}}),
    ("minimal", {"model_type": "mistral"}),
    # num_key_value_heads: Mistral's default is 8 (not num_attention_heads), Qwen2/3's 32
    ("sized", {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 16, "num_hidden_layers": 2,
               "intermediate_size": 90, "vocab_size": 263, "sliding_window": None}),
    ("minimal", {"model_type": "qwen2"}),
    # sliding_window given but use_sliding_window false: HF sets sliding_window to None
    ("sized", {"model_type": "qwen2", "hidden_size": 56, "num_attention_heads": 4, "num_key_value_heads": 2,
               "num_hidden_layers": 3, "intermediate_size": 84, "vocab_size": 271, "sliding_window": 16}),
    # windowed layers from max_window_layers (layers i >= max_window_layers slide)
    ("window", {"model_type": "qwen2", "hidden_size": 56, "num_attention_heads": 4, "num_key_value_heads": 4,
                "num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
    ("minimal", {"model_type": "qwen3"}),
    # head_dim stays 128 (Qwen3Config's default), not hidden_size / num_attention_heads
    ("sized", {"model_type": "qwen3", "hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 1,
               "num_hidden_layers": 2, "intermediate_size": 76, "vocab_size": 251}),
]


def make_config_defaults():
    cases = []
    for name, d in CONFIG_DEFAULT_CASES + [(f"hub:{k}", v) for k, v in HUB_CONFIGS.items()]:
        hf = hf_config(d).to_dict()
        for k in ("_name_or_path", "transformers_version"):
            hf.pop(k, None)
        if "num_key_value_heads" in hf:  # every case a model HF can run
            assert hf["num_attention_heads"] % hf["num_key_value_heads"] == 0, name
        cases.append({"model_type": d["model_type"], "name": name, "config": d, "hf": hf})
    meta = {"transformers": transformers.__version__, "cases": cases}
    with open(os.path.join(OUT, "config-defaults.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    print("config-defaults:", len(cases), "cases", file=sys.stderr)

# ---------------------------------------------------------------------------------------------
# Text fixtures: a toy sentiment dataset (train.csv, eval.csv, train.jsonl) and tiny models with
# real tokenizers trained on it — a WordPiece BERT tokenizer (BertTokenizerFast) and a byte-level
# BPE GPT-2 tokenizer — saved as HF saves them (tokenizer.json, tokenizer_config.json, …).
# `tokens.json` holds what HF's tokenizer gives for the eval texts (truncated to 16, padded to the
# longest), for the Rust tokenisation parity test.

POSITIVE = ["great", "wonderful", "excellent", "lovely", "brilliant", "superb", "charming", "delightful"]
NEGATIVE = ["awful", "terrible", "boring", "dreadful", "poor", "horrible", "dull", "disappointing"]
NOUNS = ["movie", "film", "story", "plot", "acting", "ending", "cast", "music", "script", "show"]
FILLERS = ["i think", "honestly", "to be fair", "in my opinion", "all things considered", "frankly", "overall"]
TAILS = ["and i would watch it again", "from start to finish", "for most of the evening", "if you ask me",
         "and my friends agreed", "", "", ""]


def sentence(rng, label):
    words = POSITIVE if label == 1 else NEGATIVE
    parts = [rng.choice(FILLERS), "the", rng.choice(NOUNS), "was", rng.choice(words)]
    if rng.random() < 0.5:
        parts += ["and", rng.choice(words)]
    parts.append(rng.choice(TAILS))
    return " ".join(p for p in parts if p).strip() + "."


def make_text_fixtures():
    import csv
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast, GPT2TokenizerFast

    rng = np.random.default_rng(7)
    out = os.path.join(OUT, "text")
    os.makedirs(out, exist_ok=True)
    rows = {}
    for split, n in (("train", 512), ("eval", 128)):
        labels = rng.integers(0, 2, size=n)
        rows[split] = [(sentence(rng, int(l)), "positive" if l == 1 else "negative") for l in labels]
        with open(os.path.join(out, f"{split}.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows(rows[split])
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        for text, label in rows["train"]:
            f.write(json.dumps({"text": text, "label": label}) + "\n")
    with open(os.path.join(out, "corpus.txt"), "w") as f:
        for text, _ in rows["train"]:
            f.write(text + "\n")
    corpus = [t for t, _ in rows["train"]]

    # BERT: WordPiece, uncased, [PAD] = 0 as bert-base-uncased.
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    bert_tok = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    cfg = json.load(open(os.path.join(ROOT, "models", "configs", "tiny-bert.json")))
    cfg.pop("architectures", None)
    cfg.update(vocab_size=len(bert_tok), pad_token_id=bert_tok.pad_token_id, num_labels=2,
               id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    torch.manual_seed(11)
    model = BertForSequenceClassification(BertConfig(**cfg, attn_implementation="sdpa"))
    d = os.path.join(OUT, "tiny-bert-sentiment")
    model.save_pretrained(d)
    bert_tok.save_pretrained(d)
    evals = [t for t, _ in rows["eval"][:6]]
    enc = bert_tok(evals, truncation=True, max_length=16, padding="longest")
    json.dump({"texts": evals, "max_length": 16, "input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
              open(os.path.join(d, "tokens.json"), "w"), indent=1)

    # GPT-2: byte-level BPE; pad = eos (HF users' convention for GPT-2).
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    gpt_tok = GPT2TokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    gpt_tok.pad_token = gpt_tok.eos_token
    cfg = json.load(open(os.path.join(ROOT, "models", "configs", "tiny-gpt2.json")))
    cfg.pop("architectures", None)
    eos = gpt_tok.eos_token_id
    cfg.update(vocab_size=len(gpt_tok), bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(12)
    model = GPT2LMHeadModel(GPT2Config(**cfg))
    d = os.path.join(OUT, "tiny-gpt2-text")
    model.save_pretrained(d)
    gpt_tok.save_pretrained(d)
    enc = gpt_tok(evals, truncation=True, max_length=16, padding="longest")
    json.dump({"texts": evals, "max_length": 16, "input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
              open(os.path.join(d, "tokens.json"), "w"), indent=1)
    print("text fixtures:", len(bert_tok), "wordpiece tokens,", len(gpt_tok), "bpe tokens", file=sys.stderr)


FIXTURES["text"] = make_text_fixtures


def make_llama_text_fixture():
    """tiny-llama-text: a tiny Llama with a Llama-3-style tokenizer trained on text/corpus.txt —
    byte-level BPE behind a `Split` pre-tokenizer with Llama 3's regex (ByteLevel with
    use_regex=False, as Llama 3's and Qwen2's tokenizer.json have it), `<|begin_of_text|>` added
    in front of every text by the post-processor, pad = `<|end_of_text|>` — saved as HF saves it,
    with `tokens.json` (what HF's AutoTokenizer gives for the eval texts) for the Rust parity test.
    Reads the corpus the `text` target wrote; does not rewrite it."""
    import csv
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    text = os.path.join(OUT, "text")
    corpus = [l.rstrip("\n") for l in open(os.path.join(text, "corpus.txt"))]
    evals = [r["text"] for r in csv.DictReader(open(os.path.join(text, "eval.csv")))][:6]
    # Llama 3's pre-tokenizer pattern (tokenizer.json of meta-llama/Llama-3.2-1B).
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=420, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = tok.token_to_id(specials[0]), tok.token_to_id(specials[1])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[(specials[0], bos)]),
    ])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], eos_token=specials[1],
                                     pad_token=specials[1])
    cfg = json.load(open(os.path.join(ROOT, "models", "configs", "tiny-llama.json")))
    cfg.pop("architectures", None)
    cfg.pop("transformers_version", None)
    cfg.update(vocab_size=len(hf_tok), bos_token_id=bos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(13)
    model = LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation="sdpa"))
    d = os.path.join(OUT, "tiny-llama-text")
    model.save_pretrained(d)
    hf_tok.save_pretrained(d)
    back = AutoTokenizer.from_pretrained(d)  # what a user of the saved directory gets
    enc = back(evals, truncation=True, max_length=16, padding="longest")
    assert enc["input_ids"] == hf_tok(evals, truncation=True, max_length=16, padding="longest")["input_ids"]
    json.dump({"texts": evals, "max_length": 16, "input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
              open(os.path.join(d, "tokens.json"), "w"), indent=1)
    print("tiny-llama-text:", len(hf_tok), "byte-level BPE tokens (Llama 3 split), first ids", enc["input_ids"][0][:8],
          file=sys.stderr)


FIXTURES["llama-text"] = make_llama_text_fixture


def make_encoder_text_fixtures():
    """tiny-roberta-text and tiny-distilbert-text: RobertaForMaskedLM with RoBERTa's tokenizer layout (byte-level
    BPE trained on text/corpus.txt, `<s> $A </s>` by RobertaProcessing, <pad> = 1, <mask>) and DistilBertForMaskedLM
    with a WordPiece tokenizer (DistilBertTokenizerFast: `[CLS] $A [SEP]`, no token types), saved as HF saves them,
    with `tokens.json` (what AutoTokenizer gives for the eval texts) for the Rust parity test. Reads the corpus the
    `text` target wrote."""
    import csv
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, DistilBertTokenizerFast, RobertaTokenizerFast

    text = os.path.join(OUT, "text")
    corpus = [l.rstrip("\n") for l in open(os.path.join(text, "corpus.txt"))]
    evals = [r["text"] for r in csv.DictReader(open(os.path.join(text, "eval.csv")))][:6]

    # RoBERTa: specials in roberta-base's order (<s> 0, <pad> 1, </s> 2, <unk> 3), <mask> last.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=380, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(["<mask>"])
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                      add_prefix_space=False)
    rob = RobertaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                               cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    assert (rob.bos_token_id, rob.pad_token_id, rob.eos_token_id) == (0, 1, 2)
    # DistilBERT: WordPiece, uncased, [PAD] = 0 as distilbert-base-uncased.
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]",
                                                                                             "[SEP]", "[MASK]"]))
    cls, sep = wp.token_to_id("[CLS]"), wp.token_to_id("[SEP]")
    wp.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    wp.decoder = decoders.WordPiece()
    dis = DistilBertTokenizerFast(tokenizer_object=wp, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                                  cls_token="[CLS]", mask_token="[MASK]")
    for name, hf_tok, base, cls_, cfg_cls, seed in (
            ("tiny-roberta-text", rob, "tiny-roberta", RobertaForMaskedLM, RobertaConfig, 14),
            ("tiny-distilbert-text", dis, "tiny-distilbert", DistilBertForMaskedLM, DistilBertConfig, 15)):
        cfg = json.load(open(os.path.join(ROOT, "models", "configs", f"{base}.json")))
        cfg.pop("architectures", None)
        cfg.update(vocab_size=len(hf_tok), pad_token_id=hf_tok.pad_token_id)
        torch.manual_seed(seed)
        model = cls_(cfg_cls(**cfg, attn_implementation="sdpa"))
        d = os.path.join(OUT, name)
        model.save_pretrained(d)
        hf_tok.save_pretrained(d)
        back = AutoTokenizer.from_pretrained(d)  # what a user of the saved directory gets
        enc = back(evals, truncation=True, max_length=16, padding="longest")
        assert enc["input_ids"] == hf_tok(evals, truncation=True, max_length=16, padding="longest")["input_ids"]
        json.dump({"texts": evals, "max_length": 16, "input_ids": enc["input_ids"],
                   "attention_mask": enc["attention_mask"]}, open(os.path.join(d, "tokens.json"), "w"), indent=1)
        print(f"{name}: {len(hf_tok)} tokens ({type(back).__name__}), first ids", enc["input_ids"][0][:8],
              file=sys.stderr)


FIXTURES["encoder-text"] = make_encoder_text_fixtures


def make_gemma_text_fixture():
    """tiny-gemma3-text: a tiny Gemma 3 with a tokenizer of Gemma's layout trained on text/corpus.txt — BPE over
    SentencePiece-style pieces (the normalizer turns spaces into "▁", no pre-tokenizer), byte fallback to the 256
    `<0xNN>` pieces for characters the vocabulary lacks, `<bos>` added in front by the post-processor, ids <pad> 0,
    <eos> 1, <bos> 2, <unk> 3 as Gemma's — saved as HF saves it, with `tokens.json` (what AutoTokenizer gives for the
    eval texts and one with characters outside the corpus, which take the byte pieces) for the Rust parity test."""
    import csv
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    text = os.path.join(OUT, "text")
    corpus = [l.rstrip("\n") for l in open(os.path.join(text, "corpus.txt"))]
    evals = [r["text"] for r in csv.DictReader(open(os.path.join(text, "eval.csv")))][:5]
    evals.append("the café was naïve — 100% lovely.")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=360, special_tokens=specials))
    # The byte pieces right after the specials, as Gemma's vocabulary has them; merges name pieces, not ids.
    spec = json.loads(tok.to_str())
    trained = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    pieces = specials + [f"<0x{i:02X}>" for i in range(256)] + [p for p, _ in trained if p not in specials]
    spec["model"]["vocab"] = {p: i for i, p in enumerate(pieces)}
    spec["added_tokens"] = [dict(a, id=pieces.index(a["content"])) for a in spec["added_tokens"]]
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                      special_tokens=[("<bos>", 2)])
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                     unk_token="<unk>")
    assert (hf_tok.pad_token_id, hf_tok.eos_token_id, hf_tok.bos_token_id) == (0, 1, 2)
    cfg = json.load(open(os.path.join(ROOT, "models", "configs", "tiny-gemma3.json")))
    for k in ("architectures", "transformers_version"):
        cfg.pop(k, None)
    cfg.update(vocab_size=len(hf_tok), pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(16)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**cfg, attn_implementation="sdpa"))
    d = os.path.join(OUT, "tiny-gemma3-text")
    model.save_pretrained(d)
    hf_tok.save_pretrained(d)
    back = AutoTokenizer.from_pretrained(d)  # what a user of the saved directory gets
    enc = back(evals, truncation=True, max_length=16, padding="longest")
    assert enc["input_ids"] == hf_tok(evals, truncation=True, max_length=16, padding="longest")["input_ids"]
    byte_ids = [i for i in back(evals[-1])["input_ids"] if 4 <= i < 260]
    assert byte_ids, "the non-corpus characters take byte pieces"
    json.dump({"texts": evals, "max_length": 16, "input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
              open(os.path.join(d, "tokens.json"), "w"), indent=1)
    print(f"tiny-gemma3-text: {len(hf_tok)} pieces ({type(back).__name__}); byte pieces for the last text:",
          back.convert_ids_to_tokens(byte_ids), file=sys.stderr)


FIXTURES["gemma-text"] = make_gemma_text_fixture
FIXTURES["model-configs"] = make_model_configs
FIXTURES["config-defaults"] = make_config_defaults

if __name__ == "__main__":
    for fixture in sys.argv[1:] or FIXTURES:
        FIXTURES[fixture]()
