//! The `ortbench` binary: a thin shell over the library (`lib.rs`).

use clap::Parser;
use ortbench::{cli, compare, env, harness, report, train, worker};

/// Prints an error as one line and returns the exit code for it.
fn fail(e: anyhow::Error) -> i32 {
    eprintln!("error: {e:#}");
    2
}

fn main() {
    let cli = cli::Cli::parse();
    let code = match cli.command {
        cli::Command::Run(args) => harness::run(&args).unwrap_or_else(fail),
        cli::Command::Worker { spec } => worker::main(&spec),
        cli::Command::List => {
            cli::print_list();
            0
        }
        cli::Command::Env { json } => {
            let e = env::collect();
            if json {
                println!("{}", serde_json::to_string_pretty(&e).unwrap_or_default());
            } else {
                print!("{}", env::format(&e));
            }
            0
        }
        cli::Command::Report { dir } => match report::write_report(&dir) {
            Ok(index) => {
                println!("{}", index.display());
                0
            }
            Err(e) => fail(e),
        },
        cli::Command::Compare(args) => compare::run(&args).unwrap_or_else(fail),
        cli::Command::Train(args) => train::run(&args).unwrap_or_else(fail),
        cli::Command::Export(args) => train::export(&args).unwrap_or_else(fail),
    };
    std::process::exit(code);
}
