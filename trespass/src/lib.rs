//! trespass: socket-like byte streams and messages over RDMA.
//!
//! A [`Stream`] is what a `TcpStream` is, over an RDMA reliable connection: [`Read`](std::io::Read) and
//! [`Write`](std::io::Write), half-close with [`Stream::shutdown`], timeouts, non-blocking
//! mode and a pollable fd ([`AsFd`](std::os::fd::AsFd)); and, on the same connection,
//! messages with boundaries ([`Stream::send_msg`], [`Stream::recv_msg`]). [`Listener`]
//! accepts them. Connections are set up through rdma_cm, so any address with an RDMA device
//! works: IPv4 or IPv6, RoCE or InfiniBand.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! let mut stream = trespass::Stream::connect("198.18.0.1:7471")?;
//! stream.write_all(b"hello")?;
//! let mut reply = [0u8; 5];
//! stream.read_exact(&mut reply)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # How it works
//!
//! Each side registers a receive ring and tells the peer where it is in rdma_cm's private
//! data. Bytes travel as RDMA WRITEs with immediate into the peer's ring; the immediate
//! says how many bytes landed. Credits come back the same way: the reader reports the bytes
//! it consumed once a quarter of the ring was read, and the receives it posted again once a
//! quarter of them were, so a writer never overruns the ring and never meets a receiver
//! that is not ready. `docs/trespass-protocol.md` is the specification: wire format,
//! flow-control rules, memory per connection, failure model.
//!
//! The [`core`] module is the protocol itself, with no I/O (no verb, no fd, no clock); the
//! verbs driver pumps it, under the blocking API and under the tokio front end
//! (`trespass::tokio`, with the `tokio` feature: `AsyncRead` and `AsyncWrite` streams, no
//! thread per connection).
//!
//! # Errors
//!
//! Calls return `std::io::Error`s whose kind is what a `TcpStream` user expects
//! (`ConnectionRefused`, `ConnectionReset`, `TimedOut`, `BrokenPipe`, `InvalidData` for a peer
//! that broke the protocol) and whose inner error is an [`Error`] saying what happened.
//! A failed connection stays failed: every later call returns the same error.
//!
//! # What it does not do (yet)
//!
//! Zero-copy is for whole messages: [`Stream::lend_msg`] hands a buffer to the peer, which
//! fetches it with RDMA READ into its own, and [`Stream::reclaim`] gives it back (each lent
//! buffer is registered for its transfer alone; stream bytes are always copied). Many
//! connections can share one receive
//! queue per device ([`Config::shared_receive_queue`]). The thread-per-core mode is the tokio front end on one pinned current-thread runtime per
//! core (`docs/trespass-async.md` says why that runtime). The keep-alive probes are
//! answered by one process-wide helper thread.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod config;
pub mod core;
mod driver;
mod error;
mod keeper;
mod loan;
mod pool;
mod readiness;
mod signals;
mod spin;
mod stream;
#[cfg(feature = "tokio")]
pub mod tokio;
pub mod wire;

pub use config::Config;
pub use error::{Error, Fault, LendError};
pub use signals::leave_signals_to_the_application;
pub use stream::{Listener, ReadWait, ReadWaited, StandIn, Standing, Stream, TryHandle, MAX_LENT};
