//! One whole training step (forward, backward, gradient reduction, AdamW) of the tiny models
//! under each config, as `ortbench run` runs them: `pytorch` (libtorch eager through
//! `TorchTrainer`), `ort` (the engine through `EngineTrainer`) and `ort-zero1` (the engine with
//! ZeRO-1 on a one-rank group: the sharded optimizer path with nothing to exchange). Same
//! weights and batches for all three (batch 8 × seq 64, fp32, HF Trainer's AdamW settings).
//!
//! Then bert-base and gpt2 at batch 8 × seq 128 (fp32): the planned executor's forward and
//! backward alone (`executor`: `PlannedExecutor::train_step`) against the whole `ort` step
//! (`trainer`: the same plus the gradient reduction on one rank and AdamW). The graph passes
//! come from `ORTBENCH_PASSES` (unset: all; `none`: the builders' eager graphs; the group's
//! name says which). A step takes seconds on 2 cores, so these groups take minutes.
//!
//! `cargo bench -p ortbench --bench step`; the base models alone: `cargo bench -p ortbench
//! --bench step -- executor`

mod common;

use common::*;
use criterion::{criterion_group, criterion_main, Criterion};
use ortbench_engine::collective::LocalGroup;
use ortbench_engine::exec::planned::PlannedExecutor;
use ortbench_engine::parallel::Strategy;
use ortbench_engine::passes::PassConfig;
use ortbench_engine::DType;
use ortbench_models::graph::trainer::{EngineOptions, EngineTrainer};
use ortbench_models::graph::{build_training_graph, GraphOptions};
use ortbench_models::torch::{TorchTrainer, TrainOptions};
use ortbench_models::{spec::builtin_config, DataSource, LrSchedule, Weights};

/// The tiny models' batch.
const BATCH: usize = 8;
const SEQ: usize = 64;
/// bert-base's and gpt2's batch.
const BASE_BATCH: usize = 8;
const BASE_SEQ: usize = 128;

/// The engine's options with HF Trainer's AdamW settings (as `TorchTrainer`'s defaults).
fn engine_options() -> EngineOptions {
    let torch = TrainOptions::default();
    EngineOptions {
        lr: torch.lr,
        weight_decay: torch.weight_decay,
        max_grad_norm: torch.max_grad_norm,
        schedule: LrSchedule::Constant { warmup_steps: 0 },
        precision: DType::F32,
        seed: 42,
    }
}

fn step(c: &mut Criterion) {
    for model in ["tiny-bert", "tiny-gpt2"] {
        let cfg = builtin_config(model).expect("builtin tiny config");
        let weights = Weights::init(&cfg, 42);
        let data = DataSource::synthetic(&cfg, BATCH, SEQ, 42).expect("synthetic data");
        // Batches made before timing, cycled: the steps time training, not data generation.
        let batches: Vec<_> = (0..16).map(|i| data.batch(i)).collect();
        let batch = |k: usize| &batches[k % batches.len()];
        let torch = TrainOptions::default();
        let engine = engine_options();
        let mut g = c.benchmark_group(format!("train step {model} (b{BATCH} x s{SEQ}, fp32)"));
        flat(&mut g);
        let mut k = 0;
        let mut pytorch =
            TorchTrainer::new(&cfg, &weights, tch::Device::Cpu, torch).expect("pytorch trainer");
        g.bench_function("pytorch", |b| {
            b.iter(|| {
                k += 1;
                pytorch.step(batch(k)).expect("pytorch step")
            })
        });
        drop(pytorch);
        let mut ort =
            EngineTrainer::new(&cfg, &weights, BATCH, SEQ, engine.clone()).expect("ort trainer");
        g.bench_function("ort", |b| {
            b.iter(|| {
                k += 1;
                ort.step(batch(k)).expect("ort step")
            })
        });
        drop(ort);
        let group = LocalGroup::new(1).pop().expect("one rank");
        let mut zero1 =
            EngineTrainer::with_group(&cfg, &weights, BATCH, SEQ, engine, group, Strategy::Zero1)
                .expect("ort-zero1 trainer");
        g.bench_function("ort-zero1", |b| {
            b.iter(|| {
                k += 1;
                zero1.step(batch(k)).expect("ort-zero1 step")
            })
        });
        g.finish();
    }
}

fn executor_step(c: &mut Criterion) {
    let passes = PassConfig::from_env().expect("ORTBENCH_PASSES");
    let passes_name = if passes == PassConfig::all() {
        "all passes".to_string()
    } else {
        format!("passes {passes}")
    };
    for model in ["bert-base-uncased", "gpt2"] {
        let cfg = builtin_config(model).expect("builtin config");
        let gopts = GraphOptions::new(BASE_BATCH, BASE_SEQ).with_passes(passes);
        let weights = Weights::init(&cfg, 42);
        let data = DataSource::synthetic(&cfg, BASE_BATCH, BASE_SEQ, 42).expect("synthetic data");
        let batches: Vec<_> = (0..4).map(|i| data.batch(i)).collect();
        let batch = |k: usize| &batches[k % batches.len()];
        let mut g = c.benchmark_group(format!(
            "executor step {model} (b{BASE_BATCH} x s{BASE_SEQ}, fp32, {passes_name})"
        ));
        flat(&mut g);
        let mut k = 0;
        let model_graph = build_training_graph(&cfg, &gopts).expect("training graph");
        let params = model_graph.flatten(&weights).expect("flat parameters");
        let feeds: Vec<_> =
            batches.iter().map(|b| model_graph.feed(b).expect("graph inputs")).collect();
        let mut grads = vec![0f32; params.len()];
        let mut ex = PlannedExecutor::new(&model_graph.graph).expect("planned executor");
        g.bench_function("executor", |b| {
            b.iter(|| {
                k += 1;
                ex.train_step(&params, &feeds[k % feeds.len()].inputs(), k as u64, &mut grads)
                    .expect("executor step")
            })
        });
        drop((ex, grads, feeds, params, model_graph));
        let group = LocalGroup::new(1).pop().expect("one rank");
        let mut ort = EngineTrainer::with_graph_options(
            &cfg,
            &weights,
            &gopts,
            engine_options(),
            group,
            Strategy::Ddp,
        )
        .expect("ort trainer");
        g.bench_function("trainer", |b| {
            b.iter(|| {
                k += 1;
                ort.step(batch(k)).expect("ort step")
            })
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = criterion();
    targets = step, executor_step
}
criterion_main!(benches);
