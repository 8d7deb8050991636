//! [`Error`]: what went wrong, whose fault it was, and what `std::io` kind it maps to.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use sideway::rdmacm::CmError;

use crate::core::ConnError;
use crate::wire::WireError;

/// Why a trespass call failed.
///
/// [`Error::fault`] says whose fault it was; `From<Error> for io::Error` maps each variant to
/// the [`io::ErrorKind`] a `TcpStream` user expects (table on each variant), keeping the
/// `Error` inside (`io::Error::get_ref` and `downcast`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Setting up a connection failed in rdma_cm: the address has no RDMA device, the route
    /// cannot be resolved, the peer is unreachable. (`ConnectionRefused` when the peer
    /// rejected or is unreachable, `AddrNotAvailable` when the address has no RDMA device,
    /// `TimedOut` when a step timed out, else `Other`.)
    #[error("{what}: {source}")]
    Cm {
        /// The step that failed.
        what: &'static str,
        /// rdma_cm's error.
        #[source]
        source: CmError,
    },
    /// Nothing listens for trespass at the address, or the listener refused.
    /// (`ConnectionRefused`.)
    #[error("{addr} refused the connection: {reason}")]
    Refused {
        /// The address.
        addr: SocketAddr,
        /// Why, as far as the listener said.
        reason: String,
    },
    /// The peer speaks another trespass version, or is not trespass at all.
    /// (`ConnectionRefused`.)
    #[error("cannot talk to {addr}: {source}")]
    Handshake {
        /// The peer.
        addr: SocketAddr,
        /// What its hello or refusal said.
        #[source]
        source: WireError,
    },
    /// The connection did not come up within its timeout. (`TimedOut`.)
    #[error("connecting to {addr} took longer than {timeout:?}")]
    ConnectTimeout {
        /// The address.
        addr: SocketAddr,
        /// The timeout.
        timeout: Duration,
    },
    /// Making the connection's verbs resources (PD, CQ, QP, registered memory) or a verb on
    /// the data path failed. (`Other`.)
    #[error("{what}: {source}")]
    Verbs {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The connection failed: the peer broke the protocol (`InvalidData`), went away
    /// (`ConnectionReset`), became unreachable or stopped answering keep-alives
    /// (`TimedOut`), or a local failure (`Other`). Sticky: later calls return it again.
    #[error(transparent)]
    Connection(#[from] ConnError),
    /// The write side was shut down, or the connection closed: nothing more can be written.
    /// (`BrokenPipe`.)
    #[error("the connection's write side is closed ({0})")]
    WriteClosed(&'static str),
    /// The call was wrong for this connection (a message larger than the peer accepts, or
    /// larger than the send buffer in non-blocking mode, a zero timeout). (`InvalidInput`.)
    #[error("{0}")]
    InvalidInput(String),
    /// The peer cannot do what was asked (it does not take lent buffers: an older trespass,
    /// or a device without RDMA READ). (`Unsupported`.)
    #[error("{0}")]
    Unsupported(&'static str),
    /// The operation did not finish within the read or write timeout. (`TimedOut`;
    /// `WouldBlock` in non-blocking mode is not an error of this type.)
    #[error("no progress within the {which} timeout of {timeout:?}")]
    Timeout {
        /// "read" or "write".
        which: &'static str,
        /// The timeout.
        timeout: Duration,
    },
}

/// Whose fault an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The peer misbehaved (broke the protocol, refused, speaks another version).
    Peer,
    /// The network, the device or this host (unreachable, reset, timed out, a verb failed).
    Local,
    /// The caller (invalid input, writing after shutdown).
    Misuse,
}

impl Error {
    /// Whose fault the error is.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Connection(ConnError::Protocol(_)) | Error::Handshake { .. } => Fault::Peer,
            Error::Refused { .. } | Error::Unsupported(_) => Fault::Peer,
            Error::InvalidInput(_) | Error::WriteClosed(_) => Fault::Misuse,
            _ => Fault::Local,
        }
    }

    /// The [`io::ErrorKind`] this error maps to.
    pub fn kind(&self) -> io::ErrorKind {
        use io::ErrorKind as K;
        match self {
            Error::Cm { source, .. } => match source {
                CmError::Rejected { .. } | CmError::Unreachable { .. } => K::ConnectionRefused,
                CmError::AddrUnresolvable { .. } => K::AddrNotAvailable,
                CmError::Timeout { .. } => K::TimedOut,
                _ => K::Other,
            },
            Error::Refused { .. } | Error::Handshake { .. } => K::ConnectionRefused,
            Error::ConnectTimeout { .. } | Error::Timeout { .. } => K::TimedOut,
            Error::Verbs { .. } => K::Other,
            Error::Connection(e) => match e {
                ConnError::Protocol(_) => K::InvalidData,
                ConnError::Reset(_) => K::ConnectionReset,
                ConnError::Unreachable(_) | ConnError::KeepAlive(_) => K::TimedOut,
                _ => K::Other,
            },
            Error::WriteClosed(_) => K::BrokenPipe,
            Error::InvalidInput(_) => K::InvalidInput,
            Error::Unsupported(_) => K::Unsupported,
        }
    }

    pub(crate) fn verbs(
        what: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Verbs {
            what,
            source: Box::new(source),
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}

/// Why [`Stream::lend_msg`](crate::Stream::lend_msg) did not lend a buffer, and the buffer
/// when it is still the caller's (as `std::sync::mpsc::SendError` hands back what was not
/// sent). It is `None` only when the buffer's descriptor was already part committed when
/// the connection failed: the buffer then stays with the connection until it is dropped.
/// Converts into the [`io::Error`] with `?`.
#[derive(Debug)]
pub struct LendError {
    pub(crate) error: io::Error,
    pub(crate) buf: Option<Vec<u8>>,
}

impl LendError {
    pub(crate) fn new(error: impl Into<io::Error>, buf: Option<Vec<u8>>) -> LendError {
        LendError {
            error: error.into(),
            buf,
        }
    }

    /// The error.
    pub fn error(&self) -> &io::Error {
        &self.error
    }

    /// Its kind (`WouldBlock` in non-blocking mode: try again with the buffer).
    pub fn kind(&self) -> io::ErrorKind {
        self.error.kind()
    }

    /// The error and the buffer, when it came back.
    pub fn into_parts(self) -> (io::Error, Option<Vec<u8>>) {
        (self.error, self.buf)
    }
}

impl std::fmt::Display for LendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for LendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<LendError> for io::Error {
    fn from(e: LendError) -> io::Error {
        e.error
    }
}
