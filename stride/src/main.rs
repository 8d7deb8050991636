//! `stride-perf`: the command. Parses the command line and hands it to the engine or the
//! plotter; every failure ends with one message on standard error and exit status 1.

use std::process::ExitCode;

use clap::Parser;
use stride::cli::{Cli, Command, Verb};
use stride::engine::{self, RunError};
use stride::plot;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Send(a) => engine::run(Verb::Send, a),
        Command::Write(a) => engine::run(Verb::Write, a),
        Command::Read(a) => engine::run(Verb::Read, a),
        Command::Atomic(a) => engine::run(Verb::Atomic, a),
        Command::Plot(a) => plot::plot_files(&a.inputs, &a.output)
            .map(|()| println!("wrote {}", a.output.display()))
            .map_err(RunError::new),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stride-perf: error: {e}");
            ExitCode::FAILURE
        }
    }
}
