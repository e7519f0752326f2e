//! End-to-end and parity tests live in `tests/tests/*.rs`.

pub mod counting;
