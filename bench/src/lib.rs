//! `ortbench`: trains HF transformer models under the `pytorch`, `ort` and `ort-zero1`
//! configurations and reports throughput, memory and loss parity side by side.
//!
//! The binary (`main.rs`) is a thin shell over this library; notebooks use
//! [`results::load_run`] to read a run directory back as Polars DataFrames.
//!
//! - `cli`: the command line; `plan`: arguments → validated runs (`spec`);
//! - `harness`: one worker process per run (`worker`), statuses, Ctrl-C, timeouts;
//! - `metrics`: step-time statistics, throughput, FLOPs and MFU, speedup and loss parity;
//! - `results`: the tables as DataFrames (Parquet + CSV), `load_run`; `output`: the rows;
//! - `env`: the environment block of run.json (`ortbench env`);
//! - `report`: terminal table, SVG charts, index.html; `compare`: two runs side by side;
//! - `progress`: the progress bars.

pub mod cli;
pub mod compare;
pub mod env;
pub mod harness;
pub mod metrics;
pub mod output;
pub mod plan;
pub mod progress;
pub mod report;
pub mod results;
pub mod spec;
pub mod worker;

pub use polars;
