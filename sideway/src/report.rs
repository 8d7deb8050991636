//! [`Report`]: an error for `main` to return, printed as the sentence the error says.
//!
//! A `main` that returns `Result<(), E>` prints a failure with `E`'s `Debug`, which for a
//! typed error is its fields (`NoSuchPort { device: "rxe0", port: 9, port_count: 1 }`),
//! not the text it was written to say (`rxe0 has no port 9; its ports are 1..=1`). The
//! crate's error types keep the derived `Debug` (tests and logs want the fields); `Report`
//! is the small wrapper that prints the text instead, for `main` and for functions that
//! only pass errors up. Leaf of the module graph: it knows no other module.

use std::error::Error;
use std::fmt;

/// Any error, printed by `Debug` (and `Display`) as its own text followed by the causes
/// that text does not already say. Return it from `main`: `?` converts every error type of
/// this crate (and of std, and any other `Error + Send + Sync`) into it.
///
/// ```
/// fn main() -> Result<(), sideway::Report> {
///     let gid: sideway::gid::Gid = "fe80::1".parse()?; // a ParseGidError would convert too
///     println!("{gid:?}");
///     Ok(())
/// }
/// ```
///
/// What a failed `main` prints then, against what the error's own `Debug` prints:
///
/// ```
/// let error = sideway::device::DeviceError::NotFound {
///     name: "mlx9".into(),
///     available: vec!["rxe0".into()],
/// };
/// assert!(format!("{error:?}").starts_with("NotFound {"));
/// let report = sideway::Report::from(error);
/// assert_eq!(format!("{report:?}"), "no RDMA device named \"mlx9\"; available: rxe0");
/// ```
///
/// `Report` is a report, not an error: it is not itself an [`Error`] (that is what lets `?`
/// convert any error into it, as `From<E: Error>` would otherwise clash with `From<T> for
/// T`). [`error`](Self::error) and [`into_inner`](Self::into_inner) give the error back,
/// and so does `?` in a function that returns `Box<dyn Error>` (with or without
/// `+ Send + Sync`): the box holds the error the report wraps, to print or downcast.
///
/// ```
/// use std::error::Error;
///
/// fn parse(text: &str) -> Result<sideway::gid::Gid, sideway::Report> {
///     Ok(text.parse()?)
/// }
///
/// fn caller() -> Result<(), Box<dyn Error>> {
///     let _gid = parse("not a gid")?; // Report into Box<dyn Error>
///     Ok(())
/// }
///
/// let err = caller().unwrap_err();
/// assert!(err.downcast_ref::<sideway::gid::ParseGidError>().is_some());
/// ```
pub struct Report(Box<dyn Error + Send + Sync + 'static>);

impl Report {
    /// Wraps `error`.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Self {
        Report(Box::new(error))
    }

    /// The error, to inspect or downcast.
    pub fn error(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The error, boxed.
    pub fn into_inner(self) -> Box<dyn Error + Send + Sync + 'static> {
        self.0
    }
}

impl<E: Error + Send + Sync + 'static> From<E> for Report {
    fn from(error: E) -> Self {
        Report::new(error)
    }
}

/// `?` from a function returning `Report` into one returning `Box<dyn Error + Send + Sync>`:
/// the box holds the wrapped error.
impl From<Report> for Box<dyn Error + Send + Sync + 'static> {
    fn from(report: Report) -> Self {
        report.0
    }
}

/// `?` from a function returning `Report` into one returning `Box<dyn Error>`: the box holds
/// the wrapped error.
impl From<Report> for Box<dyn Error + 'static> {
    fn from(report: Report) -> Self {
        report.0
    }
}

impl fmt::Display for Report {
    /// The error's text, then each cause whose text it does not already contain (this
    /// crate's errors mostly end with their cause's text), one per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = self.0.to_string();
        f.write_str(&said)?;
        let mut first = true;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !said.contains(&text) {
                if first {
                    f.write_str("\n\nCaused by:")?;
                    first = false;
                }
                write!(f, "\n    {text}")?;
                said.push_str(&text);
            }
            cause = c.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Report {
    /// The same as `Display`: what a `main` returning `Err(report)` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[derive(Debug)]
    struct Outer {
        says_cause: bool,
        cause: io::Error,
    }

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("failed to open rxe0")?;
            if self.says_cause {
                write!(f, ": {}", self.cause)?;
            }
            Ok(())
        }
    }

    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.cause)
        }
    }

    fn outer(says_cause: bool) -> Outer {
        Outer {
            says_cause,
            cause: io::Error::new(io::ErrorKind::NotFound, "no such device"),
        }
    }

    #[test]
    fn a_cause_is_printed_once() {
        assert_eq!(
            format!("{:?}", Report::from(outer(true))),
            "failed to open rxe0: no such device"
        );
        assert_eq!(
            format!("{:?}", Report::from(outer(false))),
            "failed to open rxe0\n\nCaused by:\n    no such device"
        );
    }

    #[test]
    fn question_mark_turns_a_report_into_a_boxed_error() {
        fn reported() -> Result<(), Report> {
            Err(outer(true).into())
        }
        fn boxed() -> Result<(), Box<dyn Error>> {
            reported()?;
            Ok(())
        }
        fn boxed_send_sync() -> Result<(), Box<dyn Error + Send + Sync>> {
            reported()?;
            Ok(())
        }
        let err = boxed().unwrap_err();
        assert_eq!(err.to_string(), "failed to open rxe0: no such device");
        assert!(err.downcast_ref::<Outer>().is_some());
        let err = boxed_send_sync().unwrap_err();
        assert!(err.downcast_ref::<Outer>().is_some());
        assert!(err.source().is_some());
    }

    /// A compile-time check: every error type of the crate converts with `?`, so each is
    /// `Send + Sync + 'static`.
    #[test]
    fn every_error_of_the_crate_converts() {
        fn converts<E: Into<Report>>() {}
        converts::<crate::address_handle::AddressHandleError>();
        converts::<crate::verbs::address_handle::GrhError>();
        converts::<crate::verbs::protection_domain::AllocPdError>();
        converts::<crate::memory_region::BufferError>();
        converts::<crate::rdmacm::CmError>();
        converts::<crate::completion_queue::CompletionQueueError>();
        converts::<crate::queue_pair::ConnectError>();
        converts::<crate::device::DeviceError>();
        converts::<crate::async_event::EventError>();
        converts::<crate::verbs::queue_pair::InvalidWorkRequest>();
        converts::<crate::memory_region::MemoryRegionError>();
        converts::<crate::memory_window::MemoryWindowError>();
        converts::<crate::queue_pair::ModifyQpError>();
        converts::<crate::gid::ParseGidError>();
        converts::<crate::queue_pair::PostError>();
        converts::<crate::verbs::queue_pair::QueryQpError>();
        converts::<crate::queue_pair::QueuePairError>();
        converts::<crate::shared_receive_queue::SharedReceiveQueueError>();
        converts::<crate::testing::TestDeviceError>();
        converts::<crate::completion_queue::WorkCompletionError>();
        converts::<rdma_mummy_sys::LoadError>();
        converts::<crate::device_memory::DeviceMemoryError>();
        converts::<crate::queue_pair::EceError>();
        converts::<crate::sharing::ImportError>();
    }
}
