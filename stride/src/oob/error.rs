//! What goes wrong on the out-of-band channel ([`OobError`]), and how its messages read.

use std::io;
use std::time::Duration;

use super::message::VERSION;

/// What went wrong on the out-of-band channel.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OobError {
    /// The client could not reach the server.
    #[error("TCP connect to the stride-perf server at {addr}: {}", connect_text(source, *port, *limit))]
    Connect {
        /// `host:port`.
        addr: String,
        /// The TCP port.
        port: u16,
        /// How long the connect could wait.
        limit: Duration,
        /// The error.
        source: io::Error,
    },
    /// The server could not listen.
    #[error("could not listen on TCP port {port}: {source} (another server running? use -p)")]
    Listen {
        /// The port.
        port: u16,
        /// The error.
        source: io::Error,
    },
    /// The peer went silent past the timeout.
    #[error("{what} (peer {peer}): no answer within {} (did it die or hang? see its output)", show_wait(*limit))]
    Timeout {
        /// What was being done.
        what: String,
        /// The peer's address.
        peer: String,
        /// The timeout.
        limit: Duration,
    },
    /// The peer closed the connection.
    #[error("{what}: the peer closed the connection (did it exit with an error? see its output)")]
    Closed {
        /// What was being done.
        what: String,
    },
    /// Another socket error.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// The peer does not speak this protocol.
    #[error("the peer is not stride-perf, or sent garbage: {0}")]
    Garbage(String),
    /// The peer speaks another version of the protocol.
    #[error("the peer speaks stride-perf protocol version {peer}, this program version {VERSION}: run the same stride-perf version on both sides")]
    Version {
        /// The peer's version.
        peer: u16,
    },
    /// A message arrived that does not fit this point of the protocol.
    #[error("expected a {expected} message from the peer, got {got}")]
    Unexpected {
        /// What this side waited for.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },
    /// The two sides' parameters differ.
    #[error("the two sides' test parameters differ; run both with the same options:\n  {}", .0.join("\n  "))]
    Mismatch(Vec<String>),
    /// The peer stopped with an error.
    #[error("the peer stopped: {0}")]
    PeerAborted(String),
    /// The peer began a message and did not finish it in time.
    #[error("the peer at {peer} sent {got} bytes of a message (starting {head}) and not the rest within {limit:?}: it is not stride-perf, or it broke or hung mid-message; check its output")]
    PartialFrame {
        /// The peer's address.
        peer: String,
        /// How many bytes of the frame came.
        got: usize,
        /// The first of them, in hex.
        head: String,
        /// How long the rest had.
        limit: Duration,
    },
    /// The peer sent another number of QP endpoints than this side has QPs.
    #[error("the peer sent {sent} QP endpoints, but this run has {expected} QPs (-q {expected}): the peer is broken or runs another test; run the same stride-perf version with the same options on both sides")]
    EndpointCount {
        /// How many endpoints the peer sent.
        sent: usize,
        /// How many this side has (one per QP).
        expected: usize,
    },
    /// A peer endpoint's buffer does not fit the 64-bit address space.
    #[error("the peer's QP {qp} advertised a {len}-byte buffer at address {addr:#x}, which runs past the end of the 64-bit address space: the peer is broken; run the same stride-perf version on both sides")]
    EndpointAddress {
        /// The QP's index in the peer's list.
        qp: usize,
        /// The address the peer sent.
        addr: u64,
        /// The buffer's length in bytes (the same on both sides).
        len: u64,
    },
    /// The peer's results carry a number that no run measures.
    #[error("the peer at {peer} sent results with {source}: the peer is broken; run the same stride-perf version on both sides")]
    PeerNumber {
        /// The peer's address.
        peer: String,
        /// Which number, and why.
        source: crate::report::BadNumber,
    },
    /// A number in a peer endpoint that no QP may have: a QP number, PSN or DCT number
    /// over 24 bits, an MTU that is not a path MTU.
    #[error("the peer's QP {qp} sent {field} {value} ({value:#x}), {rule}: the peer is broken; run the same stride-perf version on both sides")]
    EndpointField {
        /// The QP's index in the peer's list.
        qp: usize,
        /// Which number: "QP number", "PSN", "DCT number", "MTU".
        field: &'static str,
        /// The number the peer sent.
        value: u32,
        /// What it breaks.
        rule: &'static str,
    },
}

/// A wait's length as a person reads it: "15 s", "200 ms".
fn show_wait(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// What a failed connect to the server means, and what to do.
fn connect_text(source: &io::Error, port: u16, limit: Duration) -> String {
    let start = "start it first with the same options and no address";
    match source.kind() {
        // A server takes one client, and stops listening until it is started again: a
        // refusal while it runs (or right after its run, before its restart) is that.
        io::ErrorKind::ConnectionRefused => format!(
            "connection refused: is the server running, on port {port}? A server takes one \
             client per run and listens only while it waits for one, so a running server may \
             be busy with another client, or have just ended its run: try again once that \
             run is over and the server is started anew; else {start}"
        ),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
            "no answer within {}: the address routes nowhere or a firewall drops it; check \
             the address and -p {port}",
            show_wait(limit)
        ),
        _ => format!("{source} (is the server running, on port {port}? {start})"),
    }
}
