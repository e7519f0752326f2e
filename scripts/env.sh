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
# oneDNN's AMX path can kill bf16 matmuls with SIGILL on these CPUs; cap the ISA.
export ONEDNN_MAX_CPU_ISA="${ONEDNN_MAX_CPU_ISA:-AVX512_CORE_BF16}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
