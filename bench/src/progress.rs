//! Progress of `run` on stderr: two indicatif bars (runs, and the current run's steps, with
//! ETAs) when stderr is a terminal; plain lines otherwise (logs, CI, tests), because
//! indicatif draws nothing — and prints nothing — to a stream that is not a terminal.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    bars: Option<Bars>,
    total_runs: usize,
}

struct Bars {
    multi: MultiProgress,
    runs: ProgressBar,
    steps: ProgressBar,
}

impl Progress {
    /// Bars when stderr is a terminal and `ORTBENCH_NO_PROGRESS` is unset.
    pub fn new(total_runs: usize) -> Progress {
        let tty =
            std::io::stderr().is_terminal() && std::env::var_os("ORTBENCH_NO_PROGRESS").is_none();
        let bars = tty.then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(8));
            let runs = multi.add(ProgressBar::new(total_runs as u64));
            runs.set_style(
                ProgressStyle::with_template("{prefix:>5} [{bar:32.cyan/blue}] {pos}/{len} runs · {elapsed_precise} · ETA {eta}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            runs.set_prefix("runs");
            let steps = multi.add(ProgressBar::new(0));
            steps.set_style(
                ProgressStyle::with_template("{prefix:>5} [{bar:32.green/white}] {pos}/{len} steps · {msg} · ETA {eta}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            steps.set_prefix("steps");
            runs.enable_steady_tick(Duration::from_millis(250));
            Bars { multi, runs, steps }
        });
        Progress { bars, total_runs }
    }

    /// A line above the bars (or on stderr).
    pub fn println(&self, line: &str) {
        match &self.bars {
            Some(b) => {
                let _ = b.multi.println(line);
            }
            None => eprintln!("{line}"),
        }
    }

    pub fn start_run(&self, index: usize, label: &str, steps: usize) {
        self.println(&format!("[{}/{}] {label}", index + 1, self.total_runs));
        if let Some(b) = &self.bars {
            b.steps.reset();
            b.steps.set_length(steps as u64);
            b.steps.set_position(0);
            b.steps.set_message(format!("{label} · starting"));
        }
    }

    /// Rank 0 finished `step` (0-based).
    pub fn step(&self, label: &str, step: usize, steps: usize, loss: f64, step_ms: f64) {
        match &self.bars {
            Some(b) => {
                b.steps.set_position(step as u64 + 1);
                b.steps.set_message(format!("{label} · loss {loss:.4} · {step_ms:.1} ms"));
            }
            None => eprintln!("  step {:>3}/{steps}  loss {loss:.4}  {step_ms:>9.1} ms", step + 1),
        }
    }

    pub fn end_run(&self, status: &str, detail: &str) {
        if status != "ok" {
            self.println(&format!("  {status}: {detail}"));
        }
        if let Some(b) = &self.bars {
            b.runs.inc(1);
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bars {
            b.steps.finish_and_clear();
            b.runs.finish_and_clear();
            let _ = b.multi.clear();
        }
    }
}
