//! One whole training step (forward, backward, gradient reduction, AdamW) of the tiny models
//! under each config, as `ortbench run` runs them: `pytorch` (libtorch eager through
//! `TorchTrainer`), `ort` (the engine through `EngineTrainer`) and `ort-zero1` (the engine with
//! ZeRO-1 on a one-rank group: the sharded optimizer path with nothing to exchange). Same
//! weights and batches for all three (batch 8 × seq 64, fp32, HF Trainer's AdamW settings).
//!
//! `cargo bench -p ortbench --bench step`

mod common;

use common::*;
use criterion::{criterion_group, criterion_main, Criterion};
use ortbench_engine::collective::LocalGroup;
use ortbench_engine::parallel::Strategy;
use ortbench_engine::DType;
use ortbench_models::graph::trainer::{EngineOptions, EngineTrainer};
use ortbench_models::torch::{TorchTrainer, TrainOptions};
use ortbench_models::{spec::builtin_config, DataSource, LrSchedule, Weights};

const BATCH: usize = 8;
const SEQ: usize = 64;

fn step(c: &mut Criterion) {
    for model in ["tiny-bert", "tiny-gpt2"] {
        let cfg = builtin_config(model).expect("builtin tiny config");
        let weights = Weights::init(&cfg, 42);
        let data = DataSource::synthetic(&cfg, BATCH, SEQ, 42).expect("synthetic data");
        // Batches made before timing, cycled: the steps time training, not data generation.
        let batches: Vec<_> = (0..16).map(|i| data.batch(i)).collect();
        let batch = |k: usize| &batches[k % batches.len()];
        let torch = TrainOptions::default();
        let engine = EngineOptions {
            lr: torch.lr,
            weight_decay: torch.weight_decay,
            max_grad_norm: torch.max_grad_norm,
            schedule: LrSchedule::Constant { warmup_steps: 0 },
            precision: DType::F32,
            seed: 42,
        };
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

criterion_group! {
    name = benches;
    config = criterion();
    targets = step
}
criterion_main!(benches);
