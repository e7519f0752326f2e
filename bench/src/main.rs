//! `ortbench`: trains HF transformer models under the `pytorch`, `ort` and `ort-zero1`
//! configurations and reports throughput, memory and loss parity side by side.

mod cli;
mod harness;
mod output;
mod plan;
mod spec;
mod worker;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    let code = match cli.command {
        cli::Command::Run(args) => match harness::run(&args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                2
            }
        },
        cli::Command::Worker { spec } => worker::main(&spec),
        cli::Command::List => {
            cli::print_list();
            0
        }
    };
    std::process::exit(code);
}
