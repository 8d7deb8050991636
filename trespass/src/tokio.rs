//! The tokio front end (feature `tokio`): [`Listener`] and [`Stream`], shaped like
//! `tokio::net::TcpListener` and `TcpStream`. A [`Stream`] implements tokio's
//! [`AsyncRead`] and [`AsyncWrite`], so anything generic over them rides on it: `tokio::io`
//! copies, codecs (`tokio_util::codec`), TLS (`tokio-rustls`), HTTP (`hyper` through
//! `hyper_util::rt::TokioIo`), gRPC (`tonic`'s `connect_with_connector` and
//! `serve_with_incoming`). With the feature `futures-io` it implements the `futures`
//! crate's `AsyncRead` and `AsyncWrite` too (`futures_io`'s, which `futures::io` re-exports),
//! with the same meaning and cancel safety, for code generic over those (`futures::io::copy`,
//! async-std style libraries) without `tokio_util::compat`'s wrapper; `poll_close` is
//! [`AsyncWrite::poll_shutdown`]'s half-close.
//!
//! ```no_run
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! # async fn demo() -> std::io::Result<()> {
//! let listener = trespass::tokio::Listener::bind("198.18.0.1:7471").await?;
//! tokio::spawn(async move {
//!     while let Ok((mut stream, _peer)) = listener.accept().await {
//!         tokio::spawn(async move {
//!             let (mut rd, mut wr) = tokio::io::split(&mut stream);
//!             let _ = tokio::io::copy(&mut rd, &mut wr).await;
//!         });
//!     }
//! });
//! let mut stream = trespass::tokio::Stream::connect("198.18.0.1:7471").await?;
//! stream.write_all(b"hello").await?;
//! let mut reply = [0u8; 5];
//! stream.read_exact(&mut reply).await?;
//! # Ok(()) }
//! ```
//!
//! # How it waits
//!
//! No thread per connection: each stream registers its readiness fd (see
//! [`std::os::fd::AsFd`] on [`crate::Stream`]) with tokio's reactor through
//! [`AsyncFd`], twice (the fd and a duplicate of it), so a task reading and a task writing
//! the same stream (`tokio::io::split`) each have their own wake-up. Before a read or a write
//! parks, it busy-polls the completion queue for [`Stream::set_busy_poll`] (by default the
//! [`Config::busy_poll`] of the connection, 20 µs): a peer that answers sooner than a
//! wake-up through the reactor costs no system call. Turn it off (`Duration::ZERO`) for a
//! server with many mostly idle connections on one thread: there every spin is time the other
//! connections wait. A spin holds its runtime thread, timers included: a `tokio::time`
//! timeout around a read fires no sooner than the read's spin ends, so keep a busy poll set
//! by hand well below the timeouts that must hold. (The connection's own keep-alive runs
//! during a long spin.)
//!
//! The blocking calls' adaptive spin (as long as waits keep ending while spinning; up to
//! [`BUSY_POLL_MAX`], 750 µs, in a read that waits for an answer and a third of it in other
//! waits, unless [`Config::busy_poll_max`] sets the limit) pays where a
//! stream has its thread to itself (one connection per current-thread runtime: a 64-byte
//! ping-pong's median half round trip went from 193 to 105 µs in the SoftRoCE guest) and
//! costs where a thread serves several (8 connections on 2 runtime threads fell from about
//! 4300 to 2800 round trips per second, the p99 from 4.8 to 20 ms: one connection's spin is
//! time the others wait). So by default a wait adapts only while its runtime has no more
//! tasks alive than worker threads (tokio's runtime metrics, read when a wait begins), and
//! spins just the busy poll otherwise (the blocking calls count their waiting threads to the
//! same end); [`Stream::set_busy_poll_max`] makes the choice fixed (a limit at or below the
//! busy poll: never adapt; above it: always).
//!
//! Connecting and the server side of the handshake block for up to a round trip through
//! rdma_cm (at most the connect timeout); both run on tokio's blocking pool
//! ([`tokio::task::spawn_blocking`]), never on the runtime's own threads, and a listener
//! completes any number of handshakes at once, so a client that stalls its handshake holds up
//! nobody.
//!
//! # Cancel safety
//!
//! As with tokio's `TcpStream`:
//! - [`AsyncRead::poll_read`] and [`AsyncWrite::poll_write`] either move bytes and return
//!   `Ready`, or move none and return `Pending`: dropping a `read`, `write`, `readable`-style
//!   future that has not completed loses no byte and duplicates none. So are
//!   [`Stream::recv_msg`] (a message being received in pieces stays in the stream; the next
//!   call goes on with it) and [`Stream::send_msg`] (a message is committed whole or not at
//!   all) and [`Listener::accept`] (a connection whose handshake completes after the future was
//!   dropped is returned by the next call).
//! - Composite operations are not, exactly as with tokio's: `read_exact`, `write_all`,
//!   `read_to_end` may have moved some bytes when dropped.
//! - [`Stream::connect`]: a dropped future leaves the connection being set up on the blocking
//!   pool, which closes it when done.
//!
//! # Closing
//!
//! `AsyncWriteExt::shutdown` ([`AsyncWrite::poll_shutdown`]) shuts the write side down
//! as [`crate::Stream::shutdown`] does (the peer reads every byte, then end of stream) and,
//! like `TcpStream`'s, does not wait for the peer. Dropping a stream whose last bytes are not
//! yet in the peer's memory hands it to the blocking pool, which waits for them there (at
//! most the configured linger), never on a runtime thread.

#![allow(unsafe_code)]

use std::future::{poll_fn, Future};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use ::tokio::net::ToSocketAddrs;
use ::tokio::runtime::RuntimeMetrics;
use ::tokio::task::JoinSet;
use ::tokio::time::Instant;
use sideway::rdmacm::{CmError, Event, EventChannel, EventType};

use crate::config::Config;
use crate::error::{Error, LendError};
use crate::spin::Spin;
use crate::stream::{
    cm, connect_reply, connect_routed, connect_start, handshake_accept, Request, Want,
};

/// The adaptive spin's limit on this front end when [`Config::busy_poll_max`] is not set:
/// 750 µs, the blocking calls' own, and used as they use it: the whole limit only for a read
/// that waits for an answer (one that begins after this side wrote since its last read
/// wait), a third of it (250 µs) for every other wait, so that a bulk transfer's waits spin
/// no longer than before. This front end used to spin at most 250 µs in every wait: 750 µs
/// in every wait had cost it 8 to 24 % of its bandwidth from 4 KiB up in the SoftRoCE guest
/// (`docs/trespass-async.md`, "The answers' limit on tokio", has the numbers of both).
pub const BUSY_POLL_MAX: Duration = crate::config::BUSY_POLL_MAX;

/// The least a read asks for when nothing is unread yet (see `poll_read`).
const MIN_READ: usize = 16 * 1024;

/// The raw fd of the [`crate::Stream`] it sits beside in [`Io`], which closes it: declared
/// before the stream there, so the reactor lets go of it first.
#[derive(Debug)]
struct Borrowed(RawFd);

impl AsRawFd for Borrowed {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A connection and its two registrations with the reactor. Field order is drop order:
/// both registrations end before the stream closes its fd.
#[derive(Debug)]
struct Io {
    /// The stream's readiness fd: readers wait on it.
    read_ready: AsyncFd<Borrowed>,
    /// `dup`: writers wait on this one, with a waker of their own.
    write_ready: AsyncFd<Borrowed>,
    /// A duplicate of the stream's readiness fd: held (closed on drop), never read.
    _dup: OwnedFd,
    stream: crate::Stream,
}

/// A trespass connection for tokio: [`AsyncRead`] and [`AsyncWrite`] (a byte stream, as
/// tokio's `TcpStream`), and messages with boundaries ([`send_msg`](Self::send_msg),
/// [`recv_msg`](Self::recv_msg)) on the same connection. See the [module](self) for how it
/// waits, what is cancel-safe and how it closes.
#[derive(Debug)]
pub struct Stream {
    /// `Some` until dropped.
    io: Option<Io>,
    /// How long a call spins before it parks: the connection's adaptive policy.
    spin: Spin,
    /// The runtime's counts, while the spin adapts only when the runtime is not crowded
    /// (the default); `None` once `set_busy_poll_max` fixed the choice.
    uncrowded: Option<RuntimeMetrics>,
    /// The task of a read (or `recv_msg`) that returned `Pending`, while it waits.
    parked_reader: Option<Waker>,
    /// The task of a write (or `send_msg`) that returned `Pending`, while it waits.
    parked_writer: Option<Waker>,
}

impl Stream {
    /// Connects to `addr` with the default [`Config`]. The set-up (address and route
    /// resolution, the handshake) runs on tokio's blocking pool.
    ///
    /// # Errors
    ///
    /// As [`crate::Stream::connect`]: `ConnectionRefused` when nothing listens for trespass
    /// there, `AddrNotAvailable` without an RDMA device for the address, `TimedOut` after the
    /// connect timeout.
    pub fn connect(
        addr: impl ToSocketAddrs + Send + 'static,
    ) -> impl Future<Output = io::Result<Stream>> + Send + 'static {
        Stream::connect_with(&Config::default(), addr)
    }

    /// Connects to `addr` with `config`. The future borrows nothing (it can be handed to
    /// `tokio::spawn` as it is).
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub fn connect_with(
        config: &Config,
        addr: impl ToSocketAddrs + Send + 'static,
    ) -> impl Future<Output = io::Result<Stream>> + Send + 'static {
        let config = config.clone();
        async move {
            let addr = first_addr(addr).await?;
            Stream::from_std(connect(&config, addr).await?)
        }
    }

    /// Takes over a connected [`crate::Stream`] (it is switched to non-blocking mode). Must
    /// be called within a tokio runtime with I/O enabled.
    ///
    /// # Errors
    ///
    /// When the fd cannot be registered with the reactor (no runtime, or the reactor is
    /// out of resources) or duplicated.
    pub fn from_std(mut stream: crate::Stream) -> io::Result<Stream> {
        stream.set_nonblocking(true)?;
        // The busy poll and the adaptation's limit carry over (the configuration's, or
        // BUSY_POLL_MAX, the same for both front ends); whether a wait adapts depends on how
        // crowded the runtime is (see the module's "How it waits").
        let spin = stream.spin();
        let uncrowded = Some(::tokio::runtime::Handle::current().metrics());
        let fd = Borrowed(stream.as_raw_fd());
        // SAFETY: the fd is the stream's readiness fd, which the stream owns and closes only
        // when it is dropped; the stream goes into the same `Io` as this registration,
        // declared after it, so the registration ends first, and nothing replaces an `Io`'s
        // stream. `Borrowed::as_raw_fd` always returns the same number.
        let read_ready = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let dup = stream.as_fd().try_clone_to_owned()?;
        // SAFETY: as above, with `dup`, which goes into the same `Io` after this
        // registration and is never replaced.
        let write_ready = unsafe {
            AsyncFd::register_with_interest(Borrowed(dup.as_raw_fd()), Interest::READABLE)
        }
        .map_err(|e| e.into_parts().1)?;
        Ok(Stream {
            io: Some(Io {
                read_ready,
                write_ready,
                _dup: dup,
                stream,
            }),
            spin,
            uncrowded,
            parked_reader: None,
            parked_writer: None,
        })
    }

    fn io(&self) -> &Io {
        self.io
            .as_ref()
            .expect("a stream has its connection until it is dropped")
    }

    fn io_mut(&mut self) -> &mut Io {
        self.io
            .as_mut()
            .expect("a stream has its connection until it is dropped")
    }

    /// A handle for other threads' reads and writes that never wait, as
    /// [`crate::Stream::try_handle`]. This stream's waits are not disturbed by them: the
    /// handle never consumes the events this stream's tasks wait for.
    pub fn try_handle(&self) -> crate::TryHandle {
        self.io().stream.try_handle()
    }

    /// Gives the blocking [`crate::Stream`] back: its registrations with the reactor end
    /// (it stays in non-blocking mode). Dropping a `Stream` hands the wait for its last bytes
    /// (at most the linger) to the blocking pool and returns at once; a caller that must
    /// know when they are gone (a proxy before its process exits) takes the blocking stream
    /// and drops it where it can wait, e.g. in `spawn_blocking(..).await`.
    pub fn into_std(mut self) -> crate::Stream {
        let Io {
            read_ready,
            write_ready,
            _dup,
            stream,
        } = self
            .io
            .take()
            .expect("a stream has its connection until it is dropped");
        // The registrations end before the duplicate fd they watch is closed.
        drop(read_ready);
        drop(write_ready);
        drop(_dup);
        stream
    }

    /// The peer's address.
    ///
    /// # Errors
    ///
    /// `NotConnected` when rdma_cm did not report one.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io().stream.peer_addr()
    }

    /// This side's address.
    ///
    /// # Errors
    ///
    /// `NotConnected` when rdma_cm did not report one.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io().stream.local_addr()
    }

    /// As [`crate::Stream::set_nodelay`]: off, small writes are held until 16 KiB are
    /// pending, a message is sent or the stream is flushed.
    ///
    /// # Errors
    ///
    /// None today; kept for `TcpStream`'s shape.
    pub fn set_nodelay(&mut self, nodelay: bool) -> io::Result<()> {
        self.io_mut().stream.set_nodelay(nodelay)
    }

    /// Whether `nodelay` is on.
    ///
    /// # Errors
    ///
    /// None today; kept for `TcpStream`'s shape.
    pub fn nodelay(&self) -> io::Result<bool> {
        self.io().stream.nodelay()
    }

    /// How long a read or a write busy-polls before it parks the task, at least (zero:
    /// park at once unless the adaptive spin says otherwise). See the [module](self) for
    /// the trade-off.
    pub fn set_busy_poll(&mut self, d: Duration) {
        self.spin.set_min(d);
    }

    /// The least busy-poll time.
    pub fn busy_poll(&self) -> Duration {
        self.spin.min()
    }

    /// The adaptive spin's limit, as [`Config::busy_poll_max`], and the end of the default
    /// choice by how crowded the runtime is: at or below the busy poll, no wait adapts
    /// (every one spins exactly [`busy_poll`](Self::busy_poll)); above it, every wait does.
    pub fn set_busy_poll_max(&mut self, d: Duration) {
        self.spin.set_max(d);
        self.uncrowded = None;
    }

    /// The adaptive spin's limit.
    pub fn busy_poll_max(&self) -> Duration {
        self.spin.max()
    }

    /// Shuts down the read side, the write side or both, as [`crate::Stream::shutdown`].
    /// Does not wait.
    ///
    /// # Errors
    ///
    /// None today; kept for `TcpStream`'s shape.
    pub fn shutdown_std(&mut self, how: Shutdown) -> io::Result<()> {
        self.io_mut().stream.shutdown(how)
    }

    /// Sends `msg` as one message (the peer's `recv_msg` returns exactly these bytes),
    /// waiting until the send buffer has room for all of it. Cancel-safe: the message is
    /// committed whole when the future completes, and not at all before.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `msg` is larger than the peer accepts or than the send buffer
    /// ([`Config::send_buffer`]); the connection's error.
    pub async fn send_msg(&mut self, msg: &[u8]) -> io::Result<()> {
        poll_fn(|cx| self.poll_send_msg(cx, msg)).await
    }

    /// The poll form of [`send_msg`](Self::send_msg).
    ///
    /// # Errors
    ///
    /// As [`send_msg`](Self::send_msg).
    pub fn poll_send_msg(&mut self, cx: &mut Context<'_>, msg: &[u8]) -> Poll<io::Result<()>> {
        self.poll_io(cx, Want::Write, |s| s.send_msg(msg))
    }

    /// Receives the next message into `buf` (cleared first) and returns its length, or
    /// `None` at end of stream. Cancel-safe: a message that arrived in part stays in the
    /// stream until a later call completes it.
    ///
    /// # Errors
    ///
    /// The connection's error; `InvalidData` when the peer sent a message larger than
    /// [`Config::max_message`].
    pub async fn recv_msg(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<usize>> {
        poll_fn(|cx| self.poll_recv_msg(cx, buf)).await
    }

    /// The poll form of [`recv_msg`](Self::recv_msg).
    ///
    /// # Errors
    ///
    /// As [`recv_msg`](Self::recv_msg).
    pub fn poll_recv_msg(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut Vec<u8>,
    ) -> Poll<io::Result<Option<usize>>> {
        self.poll_io(cx, Want::Read, |s| s.recv_msg(buf))
    }

    /// Lends `buf` to the peer as one message, without copying it (see
    /// [`crate::Stream::lend_msg`]); take it back with [`reclaim`](Self::reclaim) once the
    /// peer fetched it. Cancel-safe: the buffer is lent when the future completes and not
    /// before; a future dropped earlier drops the buffer unlent.
    ///
    /// # Errors
    ///
    /// As [`crate::Stream::lend_msg`] (never `WouldBlock`): the [`LendError`] carries the
    /// buffer back when it was not lent.
    pub async fn lend_msg(&mut self, buf: Vec<u8>) -> Result<(), LendError> {
        let mut slot = Some(buf);
        let mut failed = None;
        let done = poll_fn(|cx| {
            self.poll_io(cx, Want::Lend, |s| {
                let Some(b) = slot.take() else {
                    return Ok(());
                };
                match s.lend_msg(b) {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        let kind = e.kind();
                        let (err, back) = e.into_parts();
                        if kind == io::ErrorKind::WouldBlock {
                            slot = back;
                            return Err(err);
                        }
                        failed = back;
                        Err(err)
                    }
                }
            })
        })
        .await;
        match done {
            Ok(()) => Ok(()),
            Err(err) => {
                let back = failed.or(slot);
                Err(LendError::new(err, back))
            }
        }
    }

    /// Takes back the oldest buffer lent with [`lend_msg`](Self::lend_msg), once the peer
    /// fetched it (see [`crate::Stream::reclaim`]). Cancel-safe: a buffer is taken from the
    /// connection only when the future completes.
    ///
    /// # Errors
    ///
    /// As [`crate::Stream::reclaim`] (never `WouldBlock`).
    pub async fn reclaim(&mut self) -> io::Result<Vec<u8>> {
        poll_fn(|cx| self.poll_io(cx, Want::Reclaim, |s| s.reclaim())).await
    }

    /// Buffers lent and not yet reclaimed.
    pub fn lent(&self) -> usize {
        self.io().stream.lent()
    }

    /// One operation (reading, or writing, lending and reclaiming, which wait on the
    /// writers' registration): waits for the fd of that direction, tries, and on
    /// `WouldBlock` busy-polls, then parks until the fd turns readable again.
    fn poll_io<T>(
        &mut self,
        cx: &mut Context<'_>,
        want: Want,
        mut op: impl FnMut(&mut crate::Stream) -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        let read = want == Want::Read;
        // Parked before and woken since: the wait goes on, and it spun already.
        let waiting = if read {
            self.parked_reader.is_some()
        } else {
            self.parked_writer.is_some()
        };
        // Adapt unless the runtime has more tasks alive than threads to run them (then a
        // long spin here is time they wait) and the user left the choice to us.
        let adapt = self
            .uncrowded
            .as_ref()
            .is_none_or(|m| m.num_alive_tasks() <= m.num_workers());
        let spin = &mut self.spin;
        let io = self
            .io
            .as_mut()
            .expect("a stream has its connection until it is dropped");
        let reg = if read {
            &io.read_ready
        } else {
            &io.write_ready
        };
        // The operation goes first: the fd turns readable only when something arrives, so
        // a stream with room to write (or bytes to read) may never see an event.
        let result = loop {
            match op(&mut io.stream) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => break Poll::Ready(done),
            }
            // The stream armed its fd before saying WouldBlock: whatever arrives from here
            // on makes it readable, and the reactor sees that. A new wait spins as long as
            // the adaptive policy says (the blocking calls' policy, spin.rs), and teaches it
            // how it ended; a woken one that must wait again spins only the minimum.
            // A read that begins after this side wrote waits for an answer: the whole limit
            // (and a catch after misses restarts the average), as in the blocking calls;
            // every other wait a third of it.
            let answer = read && !waiting && io.stream.awaits_answer();
            let (d, learn) = if waiting {
                (spin.min(), false)
            } else if adapt {
                (spin.time_for(answer), true)
            } else {
                (spin.min(), true)
            };
            let started = std::time::Instant::now();
            if io.stream.spin_until_ready(d, want) {
                if learn {
                    spin.record_wait(started.elapsed(), false, answer);
                }
                continue;
            }
            match reg.poll_read_ready(cx) {
                // An event the reactor saw, from before the arming or after: take it and
                // try again (a later one gets a new tick, which this clear leaves alone).
                Poll::Ready(Ok(mut guard)) => guard.clear_ready(),
                Poll::Ready(Err(e)) => break Poll::Ready(Err(e)),
                Poll::Pending => {
                    if learn {
                        spin.record_wait(started.elapsed(), true, answer);
                    }
                    break Poll::Pending;
                }
            }
        };
        // What this call consumed (completions, and the event that announced them) may be
        // what the task of the other direction waits for: no event will come for it now,
        // so wake it here when its side is ready.
        let (mine, other) = if read {
            (&mut self.parked_reader, &mut self.parked_writer)
        } else {
            (&mut self.parked_writer, &mut self.parked_reader)
        };
        let other_want = if read { Want::Write } else { Want::Read };
        if other.is_some() && io.stream.is_ready(other_want) {
            if let Some(w) = other.take() {
                w.wake();
            }
        }
        match &result {
            Poll::Pending => match mine {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *mine = Some(cx.waker().clone()),
            },
            Poll::Ready(_) => *mine = None,
        }
        // A thread reading through a `TryHandle` in this stream's place must not take the
        // credits a parked writer waits for (see `TryHandle::wait_readable`).
        if !read {
            io.stream.set_owner_writes(mine.is_some());
        }
        result
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A caller's buffer may be large and uninitialised (hyper's grows to hundreds of
        // KiB): zero only what can be filled now, or a small first piece when nothing is
        // there yet, not the whole of it on every call.
        let now = this.io().stream.unread_len().max(MIN_READ);
        let unfilled = buf.initialize_unfilled_to(buf.remaining().min(now));
        let n = ready!(this.poll_io(cx, Want::Read, |s| s.read(unfilled)))?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_io(cx, Want::Write, |s| s.write(buf))
    }

    /// Posts what coalescing held back (`nodelay` off); does not wait for the peer.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().io_mut().stream.flush())
    }

    /// Shuts the write side down (the peer reads every byte written, then end of stream);
    /// does not wait for the peer, as `TcpStream`'s does not.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().io_mut().stream.shutdown(Shutdown::Write))
    }
}

/// The `futures` crate's reading trait, as [`AsyncRead`] (feature `futures-io`): the same
/// `poll_io`, into the caller's slice (initialised already, so none of `poll_read`'s sizing).
#[cfg(feature = "futures-io")]
impl futures_io::AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_io(cx, Want::Read, |s| s.read(buf))
    }
}

/// The `futures` crate's writing trait: tokio's [`AsyncWrite`] under the `futures` names
/// (feature `futures-io`), `poll_close` being `poll_shutdown`'s half-close.
#[cfg(feature = "futures-io")]
impl futures_io::AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        AsyncWrite::poll_write(self, cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_flush(self, cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_shutdown(self, cx)
    }
}

impl AsRawFd for Stream {
    /// The connection's readiness fd (see [`crate::Stream`]'s `AsFd`).
    fn as_raw_fd(&self) -> RawFd {
        self.io().stream.as_raw_fd()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let Some(io) = self.io.take() else { return };
        if io.stream.close_is_quick() {
            return;
        }
        // The last bytes are still on their way: wait for them (at most the linger) on the
        // blocking pool, not on this thread, which may be the runtime's.
        match ::tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(move || drop(io));
            }
            Err(_) => drop(io),
        }
    }
}

/// A trespass listener for tokio, shaped like `tokio::net::TcpListener`.
///
/// Each connection request's handshake (reading the client's hello, making the
/// connection's resources, accepting, waiting for the connection to be established) runs on
/// tokio's blocking pool, any number at once; [`accept`](Self::accept) returns connections in
/// the order their handshakes complete. A request that cannot be completed is refused and
/// logged (target `trespass`), and accept goes on, as [`crate::Listener::accept`] does.
#[derive(Debug)]
pub struct Listener {
    io: AsyncFd<crate::Listener>,
    config: Config,
    local: SocketAddr,
    handshakes: Mutex<JoinSet<Result<crate::Stream, Error>>>,
}

impl Listener {
    /// Listens on `addr` with the default [`Config`].
    ///
    /// # Errors
    ///
    /// As [`crate::Listener::bind`]; also when the reactor cannot take the fd.
    pub async fn bind(addr: impl ToSocketAddrs) -> io::Result<Listener> {
        Listener::bind_with(&Config::default(), addr).await
    }

    /// Listens on `addr` with `config` (which accepted connections get too).
    ///
    /// # Errors
    ///
    /// As [`bind`](Self::bind).
    pub async fn bind_with(config: &Config, addr: impl ToSocketAddrs) -> io::Result<Listener> {
        let addr = first_addr(addr).await?;
        Listener::from_std(config.bind(addr)?)
    }

    /// Takes over a bound [`crate::Listener`]. Must be called within a tokio runtime with
    /// I/O enabled.
    ///
    /// # Errors
    ///
    /// When the reactor cannot take the fd.
    pub fn from_std(listener: crate::Listener) -> io::Result<Listener> {
        let config = listener.config().clone();
        let local = listener.local_addr()?;
        // SAFETY: the fd is the listener's rdma_cm event channel, which the listener owns and
        // keeps open as long as it lives; the registration owns the listener and only ever
        // lends it out shared (`get_ref`), so it is never replaced.
        let io = unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Listener {
            io,
            config,
            local,
            handshakes: Mutex::new(JoinSet::new()),
        })
    }

    /// The address listened on.
    ///
    /// # Errors
    ///
    /// None today; kept for `TcpListener`'s shape.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// Accepts the next connection. Cancel-safe.
    ///
    /// # Errors
    ///
    /// rdma_cm failures of the listener itself; a connection that failed on registering
    /// with the reactor.
    pub async fn accept(&self) -> io::Result<(Stream, SocketAddr)> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// The poll form of [`accept`](Self::accept).
    ///
    /// # Errors
    ///
    /// As [`accept`](Self::accept).
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Stream, SocketAddr)>> {
        loop {
            {
                let mut set = self.handshakes.lock().unwrap_or_else(|p| p.into_inner());
                while let Poll::Ready(Some(done)) = set.poll_join_next(cx) {
                    match done.map_err(joined) {
                        Ok(Ok(stream)) => {
                            let stream = Stream::from_std(stream)?;
                            let peer = stream.peer_addr()?;
                            return Poll::Ready(Ok((stream, peer)));
                        }
                        Ok(Err(e)) => log::warn!(
                            target: "trespass",
                            "refused a connection on {}: {e}",
                            self.local
                        ),
                        Err(e) => log::warn!(
                            target: "trespass",
                            "a handshake on {} did not finish: {e}",
                            self.local
                        ),
                    }
                }
            }
            match self.io.get_ref().try_request()? {
                Some(request) => {
                    let config = self.config.clone();
                    let local = self.local;
                    let mut set = self.handshakes.lock().unwrap_or_else(|p| p.into_inner());
                    set.spawn(handshake(config, local, request));
                }
                // Nothing waiting: take the reactor's event, if it has one, and look again;
                // else park until the channel turns readable.
                None => ready!(self.io.poll_read_ready(cx))?.clear_ready(),
            }
        }
    }
}

/// A handshake task that panicked or was cancelled, as an I/O error.
fn joined(e: ::tokio::task::JoinError) -> io::Error {
    io::Error::other(format!("a trespass handshake did not finish: {e}"))
}

/// The first address `addr` resolves to (through tokio's resolver: no runtime thread waits
/// on a name lookup).
async fn first_addr(addr: impl ToSocketAddrs) -> io::Result<SocketAddr> {
    ::tokio::net::lookup_host(addr)
        .await?
        .next()
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the address resolved to no socket address",
            )
        })
}

/// The next event on `channel`, or `None` once `deadline` passed. Waits through the
/// reactor: the task parks, no thread blocks.
async fn next_event(
    channel: &EventChannel,
    deadline: Instant,
) -> io::Result<Option<Result<Event, CmError>>> {
    // SAFETY: `channel` is borrowed for the whole of this function, so its fd stays open
    // while the registration, dropped before the function returns, exists; `Borrowed`
    // always returns the same number.
    let reg = unsafe {
        AsyncFd::register_with_interest(Borrowed(channel.as_raw_fd()), Interest::READABLE)
    }
    .map_err(|e| e.into_parts().1)?;
    let wait = async {
        loop {
            match channel.try_get_event() {
                Ok(Some(event)) => return Ok(Ok(event)),
                Ok(None) => reg.readable().await?.clear_ready(),
                Err(e) => return Ok(Err(e)),
            }
        }
    };
    match ::tokio::time::timeout_at(deadline, wait).await {
        Ok(r) => r.map(Some),
        Err(_) => Ok(None),
    }
}

/// [`crate::stream::connect`] with every wait a wait of this task: resolves the address and
/// the route, makes the resources, connects, and reads the listener's reply.
async fn connect(config: &Config, addr: SocketAddr) -> Result<crate::Stream, Error> {
    let timeout = config.connect_timeout;
    let deadline = Instant::now() + timeout;
    let (channel, id) = connect_start(addr, timeout)?;
    // The next event, of type `expected` when one is named.
    let step = |what: &'static str, expected: Option<EventType>| {
        let channel = &channel;
        async move {
            match next_event(channel, deadline).await {
                Err(source) => Err(Error::verbs("waiting for rdma_cm", source)),
                Ok(None) => Err(Error::ConnectTimeout { addr, timeout }),
                Ok(Some(event)) => event
                    .and_then(|ev| match expected {
                        Some(t) => ev.expect_type(t),
                        None => Ok(ev),
                    })
                    .map_err(cm(what)),
            }
        }
    };
    step("resolving the address", Some(EventType::AddrResolved)).await?;
    let left = deadline.saturating_duration_since(Instant::now());
    id.resolve_route(left.clamp(Duration::from_millis(1), Duration::from_secs(5)))
        .map_err(cm("resolving the route"))?;
    step("resolving the route", Some(EventType::RouteResolved)).await?;
    let res = connect_routed(&id, config)?;
    // The reply: `Established` or a refusal, which connect_reply reads, whatever its type.
    let reply = step("waiting for the peer to accept", None).await?;
    connect_reply(reply, res, config, addr)
}

/// [`crate::stream::handshake`] with the wait for `Established` a wait of this task.
async fn handshake(
    config: Config,
    local: SocketAddr,
    request: Request,
) -> Result<crate::Stream, Error> {
    let accepted = handshake_accept(&config, local, request)?;
    let what = "waiting for the connection to be established";
    let timeout = config.connect_timeout;
    match next_event(&accepted.channel, Instant::now() + timeout).await {
        Err(source) => Err(Error::verbs("waiting for rdma_cm", source)),
        Ok(None) => Err(cm(what)(CmError::Timeout {
            timeout,
            waiting_for: Some(EventType::Established),
            endpoints: accepted.endpoints(),
        })),
        Ok(Some(event)) => {
            event
                .and_then(|ev| ev.expect_type(EventType::Established))
                .map_err(cm(what))?;
            accepted.established(&config)
        }
    }
}
