//! `ortbench`: trains HF transformer models under the `pytorch`, `ort` and `ort-zero1`
//! configurations and reports throughput, memory and loss parity side by side.
//!
//! The binary (`main.rs`) is a thin shell over this library. Notebooks use the `ortbench-report`
//! crate (re-exported here as `results`, `report`, `output`, `notebook`) to read a run directory
//! back as Polars DataFrames: [`results::load_run`].
//!
//! - `cli`: the command line; `plan`: arguments → validated runs (`spec`);
//! - `harness`: one worker process per run (`worker`; `torch_compile`: the python worker of the
//!   `torch-compile` config and the files it reads), statuses, Ctrl-C, timeouts;
//! - `launch_env`: a rank's place from its launcher's variables (torchrun, srun, mpirun);
//! - `mem_split`: the memory split a worker reports (parameters, gradients, optimizer state,
//!   activations, logits);
//! - `metrics`: step-time statistics, throughput, FLOPs and MFU, speedup and loss parity;
//! - `results`: the tables as DataFrames (Parquet + CSV), `load_run`; `output`: the rows;
//! - `env`: the environment block of run.json (`ortbench env`);
//! - `report`: terminal table, SVG charts, index.html; `compare`: two runs side by side;
//! - `batch_search`: `--batch-size auto`, the largest batch within a memory budget;
//! - `progress`: the progress bars.

pub mod batch_search;
pub mod cli;
pub mod compare;
pub mod cpu_peak;
pub mod dataset;
pub mod env;
pub mod hang;
pub mod harness;
pub mod launch_env;
pub mod mem_split;
pub mod metrics;
pub mod progress;
pub mod run_plan;
pub mod run_spec;
pub mod torch_compile;
pub mod train;
pub mod worker;

// The tables, charts and report live in `ortbench-report` (no libtorch, so that notebooks can
// use them without tch); they keep their paths here.
pub use ortbench_report::{notebook, output, polars, results};

/// The report of a run directory: the summary table (`table`), the charts (`charts`, SVG) and
/// index.html (`html`). `run` writes it at the end; `ortbench report DIR` rewrites it from
/// the files alone.
pub mod report {
    pub use ortbench_report::{charts, html, table, write_report};
}
