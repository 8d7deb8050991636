//! `stride-perf`: the command. Parses the command line and hands it to the engine (through
//! [`stride::mode`]), the stream benchmark or the plotter; every failure ends with one
//! message on standard error and exit status 1.

use std::process::ExitCode;

use clap::Parser;
use stride::cli::{Cli, Command, Verb};
use stride::engine::RunError;
use stride::mode;
use stride::plot;

/// Puts sideway's diagnostics (a destroy verb that failed while dropping a resource) on
/// standard error, as warnings of this program.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, meta: &log::Metadata<'_>) -> bool {
        meta.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!("stride-perf: warning: {}", record.args());
        }
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

fn main() -> ExitCode {
    // Fails only when a logger is already set, which then keeps the messages.
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Send(a) => mode::run(Verb::Send, a),
        Command::Write(a) => mode::run(Verb::Write, a),
        Command::Read(a) => mode::run(Verb::Read, a),
        Command::Atomic(a) => mode::run(Verb::Atomic, a),
        Command::Plot(a) => plot::plot_files(&a.inputs, &a.output, a.intervals)
            .map(|()| println!("wrote {}", a.output.display()))
            .map_err(RunError::new),
        Command::Stream(a) => stride::stream_bench::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stride-perf: error: {e}");
            ExitCode::FAILURE
        }
    }
}
