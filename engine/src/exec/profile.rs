//! A per-op profile of executed steps: wall time and calls per op kind (matmuls split by
//! their transpose flags). Enabled with `ORTBENCH_PROFILE=1` or [`enable`]; read with [`take`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

static ENABLED: OnceLock<AtomicBool> = OnceLock::new();
static TABLE: Mutex<Option<HashMap<String, (Duration, u64)>>> = Mutex::new(None);

fn flag() -> &'static AtomicBool {
    ENABLED
        .get_or_init(|| AtomicBool::new(std::env::var("ORTBENCH_PROFILE").is_ok_and(|v| v == "1")))
}

pub fn enabled() -> bool {
    flag().load(Ordering::Relaxed)
}

pub fn enable(on: bool) {
    flag().store(on, Ordering::Relaxed);
}

pub(crate) fn record(key: String, d: Duration) {
    let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let e = t.get_or_insert_with(HashMap::new).entry(key).or_default();
    e.0 += d;
    e.1 += 1;
}

/// The profile so far, slowest first, and resets it.
pub fn take() -> Vec<(String, Duration, u64)> {
    let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rows: Vec<_> =
        t.take().unwrap_or_default().into_iter().map(|(k, (d, n))| (k, d, n)).collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    rows
}

/// The profile as a text table with shares of the total.
pub fn format(rows: &[(String, Duration, u64)]) -> String {
    let total: f64 = rows.iter().map(|r| r.1.as_secs_f64()).sum();
    let mut s = format!("{:<32} {:>10} {:>7} {:>7}\n", "op", "ms", "calls", "share");
    for (k, d, n) in rows {
        let ms = d.as_secs_f64() * 1e3;
        s += &format!(
            "{k:<32} {ms:>10.1} {n:>7} {:>6.1}%\n",
            100.0 * d.as_secs_f64() / total.max(1e-12)
        );
    }
    s += &format!("{:<32} {:>10.1}\n", "total", total * 1e3);
    s
}
