# Sourced by every script: one environment for builds, tests and runs, so that cargo never
# rebuilds torch-sys because a variable changed between `scripts/test` and `scripts/ortbench`.
ORTBENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ORTBENCH_ROOT
export VIRTUAL_ENV="$ORTBENCH_ROOT/.venv"
export PATH="$VIRTUAL_ENV/bin:$HOME/.cargo/bin:$PATH"
# tch's build finds libtorch here; the crates' build.rs embed "$LIBTORCH/lib" as an rpath,
# so binaries run without LD_LIBRARY_PATH. Resolved by setup (a real path, not a symlink, so
# that libtorch's own $ORIGIN-relative runpaths to the CUDA wheels resolve).
if [ -f "$VIRTUAL_ENV/.libtorch-path" ]; then
  LIBTORCH="$(cat "$VIRTUAL_ENV/.libtorch-path")"
  export LIBTORCH
fi
# ONEDNN_MAX_CPU_ISA is left as the user has it: by default libtorch's oneDNN runs bf16 on AMX
# where the CPU has it, as HF users run it (docs/measurements.md "AMX and the bf16 baseline").
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
