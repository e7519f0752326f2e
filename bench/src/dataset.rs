//! `--dataset FILE`: a text dataset tokenised for one model (`ortbench_models::text`), cached,
//! and handed to the workers as the `--data` file it becomes. Parquet is read here, with the
//! Polars the harness already has; the other formats by `text::read_text_rows`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use ortbench_models::text::{self, Columns, LabelValue, TextRows};
use ortbench_models::{HubOptions, ModelConfig, ResolvedModel};
use ortbench_report::polars::prelude::{DataType, ParquetReader, SerReader};

/// The `--data` file of `dataset` for `cfg` (the resolved model with its `--task`): tokenised
/// with the model's tokenizer.json into rows of at most `seq_len` tokens, or found in the cache.
/// A progress bar shows on a terminal for datasets of more than 10 000 rows.
pub fn prepare(
    model: &ResolvedModel,
    cfg: &ModelConfig,
    dataset: &Path,
    cols: &Columns,
    seq_len: usize,
) -> Result<PathBuf> {
    if !dataset.is_file() {
        bail!("--dataset {}: no such file", dataset.display());
    }
    let tokenizer = model.tokenizer_file(&HubOptions::from_env())?;
    let mut bar: Option<ProgressBar> = None;
    let tty = std::io::stderr().is_terminal();
    let mut progress = |done: usize, total: usize| {
        if total < 10_000 || !tty {
            return;
        }
        let b = bar.get_or_insert_with(|| {
            let b = ProgressBar::new(total as u64);
            b.set_style(
                ProgressStyle::with_template(
                    "tokenising [{bar:32.cyan/blue}] {pos}/{len} rows · ETA {eta}",
                )
                .expect("valid template"),
            );
            b
        });
        b.set_position(done as u64);
    };
    let read = || -> Result<TextRows, ortbench_models::ModelError> {
        if dataset
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
        {
            read_parquet(dataset, cols)
                .map_err(|e| ortbench_models::ModelError::Data(format!("{e:#}")))
        } else {
            text::read_text_rows(dataset, cols)
        }
    };
    let (file, cached) =
        text::prepare(cfg, &tokenizer, dataset, read, cols, seq_len, &mut progress)
            .with_context(|| format!("model '{}'", model.name))?;
    eprintln!(
        "dataset {} for '{}' ({}): {} {}",
        dataset.display(),
        model.name,
        ortbench_models::data::Task::for_config(cfg).name(),
        if cached { "tokenised before, from" } else { "tokenised into" },
        file.display()
    );
    Ok(file)
}

/// A parquet file's text column and, when present, its label column (ints, floats, strings,
/// or lists of numbers for multi-label targets).
fn read_parquet(path: &Path, cols: &Columns) -> Result<TextRows> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("--dataset {}: cannot read", path.display()))?;
    let df = ParquetReader::new(file)
        .finish()
        .with_context(|| format!("--dataset {}: not a parquet file", path.display()))?;
    let names: Vec<String> = df.get_column_names().iter().map(|s| s.to_string()).collect();
    let text = df.column(&cols.text).with_context(|| {
        format!(
            "--dataset {}: no column '{}' (columns: {})",
            path.display(),
            cols.text,
            names.join(", ")
        )
    })?;
    let texts: Vec<String> = text
        .str()
        .with_context(|| {
            format!("--dataset {}: column '{}' is not text", path.display(), cols.text)
        })?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.map(String::from)
                .with_context(|| format!("--dataset {}: row {} has no text", path.display(), i + 1))
        })
        .collect::<Result<_>>()?;
    let labels = match df.column(&cols.label) {
        Err(_) => None,
        Ok(c) => {
            let c = c.as_materialized_series();
            let vals: Vec<Option<LabelValue>> = match c.dtype() {
                DataType::String => {
                    c.str()?.iter().map(|v| v.map(|s| LabelValue::Str(s.to_string()))).collect()
                }
                DataType::Float32 | DataType::Float64 => c
                    .cast(&DataType::Float64)?
                    .f64()?
                    .iter()
                    .map(|v| v.map(LabelValue::Float))
                    .collect(),
                DataType::List(_) => c
                    .list()?
                    .amortized_iter()
                    .map(|v| v.map(|s| s.as_ref().clone()))
                    .map(|v| {
                        v.and_then(|s| s.cast(&DataType::Float64).ok()).map(|s| {
                            LabelValue::List(
                                s.f64()
                                    .map(|f| f.into_no_null_iter().collect())
                                    .unwrap_or_default(),
                            )
                        })
                    })
                    .collect(),
                d if d.is_integer() || *d == DataType::Boolean => c
                    .cast(&DataType::Int64)?
                    .i64()?
                    .iter()
                    .map(|v| v.map(LabelValue::Int))
                    .collect(),
                other => bail!(
                    "--dataset {}: label column '{}' has type {other}",
                    path.display(),
                    cols.label
                ),
            };
            text::all_or_none(path, vals, &cols.label)?
        }
    };
    Ok(TextRows { texts, labels })
}
