//! What every example program does the same way at its edges: picking the devices that `-d`
//! names, and turning a failure into one line on stderr and exit status 1.
//!
//! Exit statuses: 0 on success, 1 for anything that went wrong at run time (no device, an
//! unknown device or port, a failed query), 2 for usage errors (clap's own). The programs
//! never panic on what the system reports; a closed stdout (`| head`) ends them quietly.

use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;

use sideway::device::{Device, DeviceError, DeviceList};

/// Why a program stopped.
#[derive(Debug)]
pub enum CliError {
    /// Listing, opening or querying a device failed, or the device or port asked for is not
    /// there.
    Device(DeviceError),
    /// Writing the output failed.
    Output(io::Error),
    /// Anything else that stopped the run (a verb, the peer, the network), with its message.
    Run(Box<dyn std::error::Error + Send + Sync>),
}

impl CliError {
    /// Wraps any error as [`CliError::Run`], for `map_err`.
    pub fn run(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        CliError::Run(e.into())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Device(e) => e.fmt(f),
            CliError::Output(e) => write!(f, "failed to write the output: {e}"),
            CliError::Run(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CliError {}

impl From<DeviceError> for CliError {
    fn from(e: DeviceError) -> Self {
        CliError::Device(e)
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> Self {
        CliError::Output(e)
    }
}

/// The device named `name`, or every device when `name` is `None`. Fails with
/// [`DeviceError::NoDevice`] (whose message says how to get a device) when there is none,
/// and with [`DeviceError::NotFound`] (which lists the devices there are) for an unknown
/// name.
pub fn select_devices(name: Option<&str>) -> Result<Vec<Device>, DeviceError> {
    let list = DeviceList::new()?;
    if list.is_empty() {
        return Err(DeviceError::NoDevice);
    }
    match name {
        Some(name) => Ok(vec![list.find(name)?]),
        None => Ok(list.iter().collect()),
    }
}

/// Puts sideway's diagnostics (a destroy verb that failed while a resource was dropped, which
/// leaks it on purpose) on standard error as `program: warning: ...`, as rdma-core's programs
/// would print them. Call first thing in `main`.
pub fn log_to_stderr(program: &'static str) {
    static PROGRAM: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    struct Stderr;
    impl log::Log for Stderr {
        fn enabled(&self, meta: &log::Metadata<'_>) -> bool {
            meta.level() <= log::Level::Warn
        }
        fn log(&self, record: &log::Record<'_>) {
            if self.enabled(record.metadata()) {
                let program = PROGRAM.get().copied().unwrap_or("sideway");
                let _ = writeln!(io::stderr(), "{program}: warning: {}", record.args());
            }
        }
        fn flush(&self) {}
    }
    static LOGGER: Stderr = Stderr;
    let _ = PROGRAM.set(program);
    // Fails only when a logger is already set, which then keeps the messages.
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

/// The exit status for a program's result; on failure, first prints `program: error` on
/// stderr. A broken pipe on stdout is a reader that has seen enough, not a failure.
pub fn exit_status(program: &str, result: Result<(), CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            // Nothing is left to tell the user if stderr itself is gone.
            let _ = writeln!(io::stderr(), "{program}: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_errors_keep_their_message() {
        let e = CliError::from(DeviceError::NoDevice);
        assert!(e.to_string().starts_with("no RDMA device found"), "{e}");
        let e = CliError::from(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(
            e.to_string().starts_with("failed to write the output"),
            "{e}"
        );
    }

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status("t", Ok(())), ExitCode::SUCCESS);
        let pipe = io::Error::from(io::ErrorKind::BrokenPipe);
        assert_eq!(
            exit_status("t", Err(CliError::Output(pipe))),
            ExitCode::SUCCESS
        );
        assert_eq!(
            exit_status("t", Err(CliError::Device(DeviceError::NoDevice))),
            ExitCode::FAILURE
        );
    }
}
