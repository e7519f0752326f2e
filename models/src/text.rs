//! Text datasets: rows of text (and labels) from `.txt`, `.jsonl` or `.csv` files — `.parquet`
//! is read by the harness (it has Polars) into the same [`TextRows`] — tokenised with the
//! model's `tokenizer.json` through HF's `tokenizers` crate, and laid out as the tensors a
//! `--data` file holds (`input_ids`, `attention_mask`, `labels`, `special_tokens_mask`), so
//! that batching, masking and padding are the tested path of [`DataSource::from_file`](crate::DataSource::from_file).
//!
//! What each task makes of the rows, as HF's example scripts and collators do:
//! - masked-lm (`run_mlm.py --line_by_line`): one row per line, `[CLS] … [SEP]`, truncated to
//!   `seq_len`; `special_tokens_mask` marks what the MLM collator must never select (15 %,
//!   80/10/10 at batch time, `data::mask_tokens`);
//! - causal-lm (`run_clm.py`'s `group_texts`): every text's tokens concatenated and cut into
//!   blocks of `seq_len` (the remainder dropped), labels = inputs, no padding;
//! - sequence classification: one row per text with its label, truncated to `seq_len`.
//!
//! Padding: the engine's graphs have static shapes, so every row is padded to one length — the
//! longest tokenised row rounded up to a multiple of 8, capped at `seq_len` — instead of HF's
//! per-batch dynamic padding. With the attention mask and −100 labels at padding the loss is the
//! same; only work on pad positions differs.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use serde_json::Value;

use crate::config::{ModelConfig, ProblemType};
use crate::data::Task;
use crate::ModelError;

/// A label as a file gives it.
#[derive(Clone, Debug, PartialEq)]
pub enum LabelValue {
    Int(i64),
    Float(f64),
    Str(String),
    /// A multi-hot vector (multi-label classification).
    List(Vec<f64>),
}

/// Rows of a text dataset: the text column and, when present, the label column.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TextRows {
    pub texts: Vec<String>,
    pub labels: Option<Vec<LabelValue>>,
}

/// Which columns to read (`--text-column`, `--label-column`).
#[derive(Clone, Debug)]
pub struct Columns {
    pub text: String,
    pub label: String,
}

impl Default for Columns {
    fn default() -> Self {
        Columns { text: "text".into(), label: "label".into() }
    }
}

fn data_err(path: &Path, m: impl std::fmt::Display) -> ModelError {
    ModelError::Data(format!("--dataset {}: {m}", path.display()))
}

/// Reads `.txt` (one text per non-empty line, no labels), `.jsonl` (one object per line) or
/// `.csv` (a header row). The label column is read when present; a row without it (or with an
/// empty text) is an error, never skipped.
pub fn read_text_rows(path: &Path, cols: &Columns) -> Result<TextRows, ModelError> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    let text =
        std::fs::read_to_string(path).map_err(|e| data_err(path, format!("cannot read: {e}")))?;
    let rows = match ext.as_str() {
        "txt" => TextRows {
            texts: text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
            labels: None,
        },
        "jsonl" | "json" => read_jsonl(path, &text, cols)?,
        "csv" | "tsv" => read_csv(path, &text, cols, if ext == "tsv" { b'\t' } else { b',' })?,
        "parquet" => {
            return Err(data_err(
                path,
                "parquet is read by the ortbench binary (ortbench run/train --dataset)",
            ))
        }
        other => {
            return Err(data_err(
                path,
                format!("unknown format '.{other}': use .txt, .jsonl, .csv or .parquet"),
            ))
        }
    };
    if rows.texts.is_empty() {
        return Err(data_err(path, "no rows"));
    }
    Ok(rows)
}

fn read_jsonl(path: &Path, text: &str, cols: &Columns) -> Result<TextRows, ModelError> {
    let mut rows = TextRows::default();
    let mut labels = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .map_err(|e| data_err(path, format!("line {}: not JSON: {e}", i + 1)))?;
        let t = v
            .get(&cols.text)
            .and_then(Value::as_str)
            .ok_or_else(|| data_err(path, format!("line {}: no string '{}'", i + 1, cols.text)))?;
        rows.texts.push(t.to_string());
        match v.get(&cols.label) {
            None | Some(Value::Null) => labels.push(None),
            Some(l) => labels.push(Some(json_label(l).ok_or_else(|| {
                data_err(
                    path,
                    format!("line {}: label {l} is not a number, string or list of numbers", i + 1),
                )
            })?)),
        }
    }
    rows.labels = all_or_none(path, labels, &cols.label)?;
    Ok(rows)
}

fn json_label(v: &Value) -> Option<LabelValue> {
    Some(match v {
        Value::Number(n) if n.is_i64() => LabelValue::Int(n.as_i64()?),
        Value::Number(n) => LabelValue::Float(n.as_f64()?),
        Value::String(s) => LabelValue::Str(s.clone()),
        Value::Bool(b) => LabelValue::Int(*b as i64),
        Value::Array(a) => {
            LabelValue::List(a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>()?)
        }
        _ => return None,
    })
}

fn read_csv(path: &Path, text: &str, cols: &Columns, delim: u8) -> Result<TextRows, ModelError> {
    let mut r = csv::ReaderBuilder::new().delimiter(delim).from_reader(text.as_bytes());
    let header = r.headers().map_err(|e| data_err(path, e))?.clone();
    let find = |name: &str| header.iter().position(|h| h == name);
    let ti = find(&cols.text).ok_or_else(|| {
        data_err(
            path,
            format!(
                "no column '{}' (columns: {})",
                cols.text,
                header.iter().collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    let li = find(&cols.label);
    let mut rows = TextRows::default();
    let mut labels = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| data_err(path, format!("row {}: {e}", i + 1)))?;
        rows.texts.push(rec.get(ti).unwrap_or("").to_string());
        labels.push(li.and_then(|li| rec.get(li)).filter(|s| !s.is_empty()).map(|s| {
            if let Ok(v) = s.parse::<i64>() {
                LabelValue::Int(v)
            } else if let Ok(v) = s.parse::<f64>() {
                LabelValue::Float(v)
            } else {
                LabelValue::Str(s.to_string())
            }
        }));
    }
    rows.labels = if li.is_some() { all_or_none(path, labels, &cols.label)? } else { None };
    Ok(rows)
}

/// Labels for every row or none: a dataset with some rows unlabelled is an error naming one.
pub fn all_or_none(
    path: &Path,
    labels: Vec<Option<LabelValue>>,
    col: &str,
) -> Result<Option<Vec<LabelValue>>, ModelError> {
    match labels.iter().position(Option::is_none) {
        None if !labels.is_empty() => {
            Ok(Some(labels.into_iter().map(|l| l.expect("checked")).collect()))
        }
        Some(_) if labels.iter().all(Option::is_none) => Ok(None),
        Some(i) => Err(data_err(path, format!("row {} has no '{col}' while others do", i + 1))),
        None => Ok(None),
    }
}

/// Tokenised rows as `--data` tensors (row-major, `n_rows` × `seq_len`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tokenized {
    pub n_rows: usize,
    pub seq_len: usize,
    pub input_ids: Vec<i64>,
    /// None when no row is padded (causal-lm blocks).
    pub attention_mask: Option<Vec<i64>>,
    /// masked-lm only: 1 at `[CLS]`, `[SEP]`, padding — what the collator never selects.
    pub special_tokens_mask: Option<Vec<i64>>,
    /// Int labels: (N,) single-label, (N, L) multi-hot multi-label; causal-lm and masked-lm
    /// have none (made at batch time).
    pub labels: Option<Vec<i64>>,
    /// Float targets (N,) of a regression.
    pub targets: Option<Vec<f32>>,
}

impl Tokenized {
    /// Writes the tensors as a `--data` safetensors file; `mask_token_id` (masked-lm: the
    /// tokenizer's `[MASK]`) goes into its metadata.
    pub fn save(
        &self,
        path: &Path,
        num_labels: usize,
        mask_token_id: Option<u32>,
    ) -> Result<(), ModelError> {
        let (n, t) = (self.n_rows, self.seq_len);
        let le = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> =
            vec![("input_ids".into(), Dtype::I64, vec![n, t], le(&self.input_ids))];
        if let Some(m) = &self.attention_mask {
            owned.push(("attention_mask".into(), Dtype::I64, vec![n, t], le(m)));
        }
        if let Some(m) = &self.special_tokens_mask {
            owned.push(("special_tokens_mask".into(), Dtype::I64, vec![n, t], le(m)));
        }
        if let Some(l) = &self.labels {
            let shape = if l.len() == n { vec![n] } else { vec![n, num_labels] };
            owned.push(("labels".into(), Dtype::I64, shape, le(l)));
        }
        if let Some(y) = &self.targets {
            owned.push((
                "labels".into(),
                Dtype::F32,
                vec![n],
                y.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ));
        }
        let views: Vec<(String, TensorView<'_>)> = owned
            .iter()
            .map(|(name, dt, shape, b)| {
                (name.clone(), TensorView::new(*dt, shape.clone(), b).expect("sizes match"))
            })
            .collect();
        let tmp = path.with_extension("tmp");
        let meta = mask_token_id.map(|id| {
            std::collections::HashMap::from([("mask_token_id".to_string(), id.to_string())])
        });
        safetensors::serialize_to_file(views, meta, &tmp)
            .map_err(|e| ModelError::Data(format!("cannot write {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| ModelError::Data(format!("cannot write {}: {e}", path.display())))
    }
}

/// Tokenises `rows` for `cfg`'s task with rows of at most `seq_len` tokens; `progress(done,
/// total)` is called as texts are encoded.
pub fn tokenize(
    cfg: &ModelConfig,
    tok: &tokenizers::Tokenizer,
    rows: &TextRows,
    seq_len: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Tokenized, ModelError> {
    let task = Task::for_config(cfg);
    let bad = |m: String| ModelError::Data(format!("--dataset: {m}"));
    if let Task::TokenClassification { .. } = task {
        // Word-level tags would have to be aligned to sub-word tokens (HF's
        // `word_ids()` + label_all_tokens): not built.
        return Err(bad("token classification reads pre-tokenised rows (--data with input_ids, per-token labels, attention_mask); text with word-level tags is not supported".into()));
    }
    let total = rows.texts.len();
    // HF's tokenizer(text, truncation=True, max_length=seq_len): the first tokens are kept and
    // the post-processor's [CLS]/[SEP] fit within seq_len. Padding is done below, to one length.
    let mut tok = tok.clone();
    if task != Task::CausalLm {
        tok.with_truncation(Some(tokenizers::TruncationParams {
            max_length: seq_len,
            ..Default::default()
        }))
        .map_err(|e| bad(format!("truncation to {seq_len}: {e}")))?;
    }
    tok.with_padding(None);
    let mut encoded: Vec<(Vec<u32>, Vec<u32>)> = Vec::with_capacity(total);
    // In chunks, so the progress bar moves on long datasets.
    for (c, chunk) in rows.texts.chunks(1024).enumerate() {
        let add_special = task != Task::CausalLm;
        let encs = tok
            .encode_batch(chunk.iter().map(String::as_str).collect::<Vec<_>>(), add_special)
            .map_err(|e| bad(format!("tokenising: {e}")))?;
        encoded.extend(
            encs.into_iter().map(|e| (e.get_ids().to_vec(), e.get_special_tokens_mask().to_vec())),
        );
        progress((c * 1024 + chunk.len()).min(total), total);
    }
    let vocab = cfg.vocab_size() as u32;
    if let Some(id) = encoded.iter().flat_map(|(ids, _)| ids).find(|&&i| i >= vocab) {
        return Err(bad(format!("the tokenizer gives id {id}, outside the model's vocabulary of {vocab}: is it the model's tokenizer?")));
    }
    if task == Task::CausalLm {
        // group_texts: concatenate, drop the remainder, blocks of seq_len.
        let all: Vec<i64> =
            encoded.iter().flat_map(|(ids, _)| ids.iter().map(|&i| i as i64)).collect();
        let n = all.len() / seq_len;
        if n == 0 {
            return Err(bad(format!(
                "{} tokens in all: fewer than one block of --seq-len {seq_len}",
                all.len()
            )));
        }
        return Ok(Tokenized {
            n_rows: n,
            seq_len,
            input_ids: all[..n * seq_len].to_vec(),
            attention_mask: None,
            special_tokens_mask: None,
            labels: None,
            targets: None,
        });
    }
    let longest = encoded.iter().map(|(ids, _)| ids.len()).max().unwrap_or(1).max(1);
    let t = longest.div_ceil(8).saturating_mul(8).min(seq_len).max(2);
    let pad = pad_id(cfg, &tok)?;
    let n = encoded.len();
    let (mut input_ids, mut mask, mut special) =
        (vec![pad; n * t], vec![0i64; n * t], vec![1i64; n * t]);
    for (r, (ids, sp)) in encoded.iter().enumerate() {
        if ids.is_empty() {
            return Err(bad(format!("row {} tokenises to nothing", r + 1)));
        }
        for (j, (&id, &s)) in ids.iter().zip(sp).enumerate() {
            input_ids[r * t + j] = id as i64;
            mask[r * t + j] = 1;
            special[r * t + j] = s as i64;
        }
    }
    let (labels, targets) = match task {
        Task::MaskedLm => (None, None),
        Task::SequenceClassification { num_labels, problem } => {
            let given = rows
                .labels
                .as_ref()
                .ok_or_else(|| bad("a classifier needs a label column (--label-column)".into()))?;
            convert_labels(cfg, given, num_labels, problem).map_err(bad)?
        }
        Task::CausalLm | Task::TokenClassification { .. } => unreachable!("handled above"),
    };
    Ok(Tokenized {
        n_rows: n,
        seq_len: t,
        input_ids,
        attention_mask: Some(mask),
        special_tokens_mask: (task == Task::MaskedLm).then_some(special),
        labels,
        targets,
    })
}

/// The tokenizer's mask token (`[MASK]` or `<mask>`), for the MLM collator.
pub fn mask_token_id(tok: &tokenizers::Tokenizer) -> Option<u32> {
    tok.token_to_id("[MASK]").or_else(|| tok.token_to_id("<mask>"))
}

/// The padding id: the config's `pad_token_id`, else the tokenizer's padding token.
fn pad_id(cfg: &ModelConfig, tok: &tokenizers::Tokenizer) -> Result<i64, ModelError> {
    if let Some(p) = cfg.raw.get("pad_token_id").and_then(Value::as_i64) {
        return Ok(p);
    }
    for name in ["[PAD]", "<pad>", "<|endoftext|>"] {
        if let Some(id) = tok.token_to_id(name) {
            return Ok(id as i64);
        }
    }
    Err(ModelError::Data("--dataset: the model has no pad_token_id and the tokenizer no padding token: set pad_token_id in config.json".into()))
}

/// Labels as the task takes them: class ids (by `label2id` for strings), multi-hot 0/1 lists
/// of `num_labels`, or float targets.
type Labels = (Option<Vec<i64>>, Option<Vec<f32>>);

/// Converts the labels a dataset gives into [`Labels`] for `problem`.
fn convert_labels(
    cfg: &ModelConfig,
    given: &[LabelValue],
    num_labels: usize,
    problem: ProblemType,
) -> Result<Labels, String> {
    let label2id = cfg.raw.get("label2id").and_then(Value::as_object);
    match problem {
        ProblemType::Regression => {
            let ys = given
                .iter()
                .enumerate()
                .map(|(i, l)| match l {
                    LabelValue::Int(v) => Ok(*v as f32),
                    LabelValue::Float(v) if v.is_finite() => Ok(*v as f32),
                    other => Err(format!(
                        "row {}: regression label {other:?} is not a finite number",
                        i + 1
                    )),
                })
                .collect::<Result<Vec<f32>, String>>()?;
            Ok((None, Some(ys)))
        }
        ProblemType::SingleLabel => {
            let ids = given
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let id = match l {
                        LabelValue::Int(v) => *v,
                        LabelValue::Str(s) => label2id
                            .and_then(|m| m.get(s))
                            .and_then(Value::as_i64)
                            .ok_or_else(|| {
                                format!(
                                    "row {}: label '{s}' is not in config.json's label2id",
                                    i + 1
                                )
                            })?,
                        other => {
                            return Err(format!(
                            "row {}: label {other:?} is not a class (an int or a label2id name)",
                            i + 1
                        ))
                        }
                    };
                    if (0..num_labels as i64).contains(&id) {
                        Ok(id)
                    } else {
                        Err(format!("row {}: label {id} is outside [0, {num_labels})", i + 1))
                    }
                })
                .collect::<Result<Vec<i64>, String>>()?;
            Ok((Some(ids), None))
        }
        ProblemType::MultiLabel => {
            let mut out = Vec::with_capacity(given.len() * num_labels);
            for (i, l) in given.iter().enumerate() {
                match l {
                    LabelValue::List(v) if v.len() == num_labels && v.iter().all(|&x| x == 0.0 || x == 1.0) => {
                        out.extend(v.iter().map(|&x| x as i64))
                    }
                    other => return Err(format!("row {}: multi-label targets must be a list of {num_labels} 0/1 values, found {other:?}", i + 1)),
                }
            }
            Ok((Some(out), None))
        }
    }
}

/// The `--data` file of `dataset` tokenised for `cfg` with `tokenizer_json`: from the cache
/// when the same (dataset, tokenizer, config, columns, seq_len) was tokenised before, else read
/// with `read_rows`, tokenised (`progress(done, total)`) and cached. Returns the file and
/// whether it came from the cache.
pub fn prepare(
    cfg: &ModelConfig,
    tokenizer_json: &Path,
    dataset: &Path,
    read_rows: impl FnOnce() -> Result<TextRows, ModelError>,
    cols: &Columns,
    seq_len: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(PathBuf, bool), ModelError> {
    let dir = cache_dir();
    let file = dir
        .join(format!("{}.safetensors", cache_key(dataset, tokenizer_json, cfg, cols, seq_len)?));
    if file.is_file() {
        return Ok((file, true));
    }
    let tok = tokenizers::Tokenizer::from_file(tokenizer_json)
        .map_err(|e| ModelError::Data(format!("{}: {e}", tokenizer_json.display())))?;
    let rows = read_rows()?;
    let t = tokenize(cfg, &tok, &rows, seq_len, progress)?;
    std::fs::create_dir_all(&dir)
        .map_err(|e| ModelError::Data(format!("cannot create {}: {e}", dir.display())))?;
    let mask = (Task::for_config(cfg) == Task::MaskedLm).then(|| mask_token_id(&tok)).flatten();
    t.save(&file, cfg.num_labels(), mask)?;
    Ok((file, false))
}

/// Where tokenised datasets are cached: `$ORTBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/ortbench`,
/// else `~/.cache/ortbench`, under `tokenized/`.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("ORTBENCH_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("ortbench")))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("ortbench"))
        })
        .unwrap_or_else(|| std::env::temp_dir().join("ortbench-cache"));
    base.join("tokenized")
}

/// The cache file of (dataset bytes, tokenizer.json bytes, config.json, columns, seq_len): a
/// change to any of them is a new key.
pub fn cache_key(
    dataset: &Path,
    tokenizer_json: &Path,
    cfg: &ModelConfig,
    cols: &Columns,
    seq_len: usize,
) -> Result<String, ModelError> {
    let mut h = DefaultHasher::new();
    // Bump when the layout of the cached tensors changes.
    1u32.hash(&mut h);
    for p in [dataset, tokenizer_json] {
        std::fs::read(p)
            .map_err(|e| ModelError::Data(format!("cannot read {}: {e}", p.display())))?
            .hash(&mut h);
    }
    cfg.raw.to_string().hash(&mut h);
    cfg.arch.hf_name().hash(&mut h);
    (cols.text.as_str(), cols.label.as_str(), seq_len).hash(&mut h);
    Ok(format!("{:016x}", h.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_jsonl_and_txt_rows() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("a.csv");
        std::fs::write(&csv, "label,text\npositive,\"good, very\"\n0,bad\n").unwrap();
        let r = read_text_rows(&csv, &Columns::default()).unwrap();
        assert_eq!(r.texts, vec!["good, very", "bad"]);
        assert_eq!(r.labels.unwrap(), vec![LabelValue::Str("positive".into()), LabelValue::Int(0)]);
        let jsonl = dir.path().join("a.jsonl");
        std::fs::write(
            &jsonl,
            "{\"sentence\": \"x\", \"y\": [0, 1]}\n\n{\"sentence\": \"z\", \"y\": [1, 1]}\n",
        )
        .unwrap();
        let cols = Columns { text: "sentence".into(), label: "y".into() };
        let r = read_text_rows(&jsonl, &cols).unwrap();
        assert_eq!(r.labels.unwrap()[1], LabelValue::List(vec![1.0, 1.0]));
        let txt = dir.path().join("a.txt");
        std::fs::write(&txt, "one\n\n two \n").unwrap();
        assert_eq!(
            read_text_rows(&txt, &cols).unwrap(),
            TextRows { texts: vec!["one".into(), "two".into()], labels: None }
        );
        // A missing column, a partly labelled file, an unknown format: errors naming them.
        let e = read_text_rows(&csv, &Columns { text: "body".into(), label: "label".into() })
            .unwrap_err()
            .to_string();
        assert!(e.contains("no column 'body'"), "{e}");
        std::fs::write(&jsonl, "{\"text\": \"x\", \"label\": 1}\n{\"text\": \"z\"}\n").unwrap();
        let e = read_text_rows(&jsonl, &Columns::default()).unwrap_err().to_string();
        assert!(e.contains("row 2 has no 'label'"), "{e}");
        let e =
            read_text_rows(&dir.path().join("a.xml"), &Columns::default()).unwrap_err().to_string();
        assert!(e.contains("cannot read") || e.contains("unknown format"), "{e}");
    }
}

/// Against HF: the fixtures' tokenizers (trained and saved by scripts/make-fixtures.py) give the
/// ids and masks HF's tokenizer gave for the same texts (truncation to 16, padding to the
/// longest — ours then pads to a multiple of 8, which only adds padding columns).
#[cfg(test)]
mod hf_tests {
    use super::*;
    use crate::spec::{resolve, HubOptions};

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
    }

    #[test]
    fn tokenisation_matches_hf() {
        for name in [
            "tiny-bert-sentiment",
            "tiny-gpt2-text",
            "tiny-llama-text",
            "tiny-roberta-text",
            "tiny-distilbert-text",
            "tiny-gemma3-text",
        ] {
            let dir = fixture(name);
            let want: Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap())
                    .unwrap();
            let texts: Vec<String> = want["texts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            let model = resolve(dir.to_str().unwrap(), &HubOptions::from_env()).unwrap();
            // Classification for both (GPT-2 via --task), so rows stay one text each.
            let cfg =
                crate::spec::with_task(model.config.clone(), Some("sequence-classification"), name)
                    .unwrap();
            let tok = tokenizers::Tokenizer::from_file(
                model.tokenizer_file(&HubOptions::from_env()).unwrap(),
            )
            .unwrap();
            let labels = Some(vec![LabelValue::Int(0); texts.len()]);
            let t = tokenize(
                &cfg,
                &tok,
                &TextRows { texts: texts.clone(), labels },
                16,
                &mut |_, _| {},
            )
            .unwrap();
            let hf_ids = want["input_ids"].as_array().unwrap();
            let hf_mask = want["attention_mask"].as_array().unwrap();
            let hf_t = hf_ids[0].as_array().unwrap().len();
            assert_eq!(t.seq_len, hf_t.div_ceil(8) * 8, "{name}");
            let mask = t.attention_mask.as_ref().unwrap();
            for (r, (ids, m)) in hf_ids.iter().zip(hf_mask).enumerate() {
                let ids: Vec<i64> =
                    ids.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
                let m: Vec<i64> =
                    m.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
                let row = &t.input_ids[r * t.seq_len..(r + 1) * t.seq_len];
                let row_mask = &mask[r * t.seq_len..(r + 1) * t.seq_len];
                assert_eq!(&row[..hf_t], &ids[..], "{name} row {r}: '{}'", texts[r]);
                assert_eq!(&row_mask[..hf_t], &m[..], "{name} row {r}");
                assert!(
                    row_mask[hf_t..].iter().all(|&v| v == 0),
                    "{name} row {r}: extra columns are padding"
                );
            }
            println!(
                "{name}: {} rows tokenised as HF did (T {} → {})",
                texts.len(),
                hf_t,
                t.seq_len
            );
        }
    }

    /// The sentiment CSV through the whole path: tokenised, cached (a second call is a cache
    /// hit with the same file), read back as `--data` with labels from label2id and the MLM
    /// collator's special tokens.
    #[test]
    fn datasets_tokenise_cache_and_read_back() {
        let cache = tempfile::tempdir().unwrap();
        std::env::set_var("ORTBENCH_CACHE_DIR", cache.path());
        let dir = fixture("tiny-bert-sentiment");
        let model = resolve(dir.to_str().unwrap(), &HubOptions::from_env()).unwrap();
        let tok_json = model.tokenizer_file(&HubOptions::from_env()).unwrap();
        let csv = fixture("text/train.csv");
        let cols = Columns::default();
        let mut calls = 0;
        let (file, hit) = prepare(
            &model.config,
            &tok_json,
            &csv,
            || read_text_rows(&csv, &cols),
            &cols,
            64,
            &mut |_, _| calls += 1,
        )
        .unwrap();
        assert!(!hit && calls >= 1);
        let (again, hit) = prepare(
            &model.config,
            &tok_json,
            &csv,
            || panic!("a cache hit reads nothing"),
            &cols,
            64,
            &mut |_, _| {},
        )
        .unwrap();
        assert!(hit && again == file);
        let data = crate::DataSource::from_file(&model.config, &file, 8, None, 0).unwrap();
        let b = data.batch(0);
        let rows = read_text_rows(&csv, &cols).unwrap();
        let want: Vec<i64> = rows.labels.unwrap()[..8]
            .iter()
            .map(|l| if *l == LabelValue::Str("positive".into()) { 1 } else { 0 })
            .collect();
        assert_eq!(b.labels, want);
        assert!(b.has_padding() && data.seq_len.is_multiple_of(8) && data.seq_len <= 64);

        // Masked LM on the corpus: [CLS]/[SEP]/padding never selected; [MASK] is the tokenizer's.
        let mlm = crate::spec::with_task(model.config.clone(), Some("masked-lm"), "x").unwrap();
        let txt = fixture("text/corpus.txt");
        let (file, _) = prepare(
            &mlm,
            &tok_json,
            &txt,
            || read_text_rows(&txt, &cols),
            &cols,
            32,
            &mut |_, _| {},
        )
        .unwrap();
        let data = crate::DataSource::from_file(&mlm, &file, 16, None, 0).unwrap();
        let tok = tokenizers::Tokenizer::from_file(&tok_json).unwrap();
        let special: Vec<i64> = ["[CLS]", "[SEP]", "[PAD]"]
            .iter()
            .map(|s| tok.token_to_id(s).unwrap() as i64)
            .collect();
        let mask_id = tok.token_to_id("[MASK]").unwrap() as i64;
        let mut masked = 0;
        for step in 0..20 {
            let b = data.batch(step);
            for (i, &l) in b.labels.iter().enumerate() {
                if l != crate::IGNORE_INDEX {
                    assert!(!special.contains(&l), "step {step}: special token selected at {i}");
                    masked += usize::from(b.input_ids[i] == mask_id);
                }
            }
        }
        assert!(masked > 0, "the tokenizer's [MASK] is written");
        std::env::remove_var("ORTBENCH_CACHE_DIR");
    }
}
