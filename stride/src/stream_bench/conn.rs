//! The calls `stride-perf stream` makes on a connection, over either of trespass's front
//! ends: the blocking [`trespass::Stream`], or the tokio [`trespass::tokio::Stream`]
//! (`--tokio`), each connection's thread driving its stream through a current-thread
//! runtime of its own, the per-core mode of `docs/trespass-async.md`. The measuring loops
//! are written once, generic over [`Conn`], so both front ends run the same code between
//! their calls.

use std::future::Future;
use std::io::{self, Read, Write};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A connection's calls, as the measuring loops make them.
pub(crate) trait Conn {
    /// Writes all of `buf` (stream bytes).
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Reads exactly `buf.len()` stream bytes.
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()>;
    /// Reads what is there, at most `buf.len()` bytes; 0 at the end of the stream.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Sends one message.
    fn send_msg(&mut self, msg: &[u8]) -> io::Result<()>;
    /// Receives one message into `msg`; `None` at the end of the stream.
    fn recv_msg(&mut self, msg: &mut Vec<u8>) -> io::Result<Option<usize>>;
    /// Closes the write side (the peer reads the end of the stream).
    fn shutdown_write(&mut self) -> io::Result<()>;
    /// Lends `buf` as one message (zero-copy).
    fn lend_msg(&mut self, buf: Vec<u8>) -> io::Result<()>;
    /// Takes back the oldest lent buffer once the peer fetched it.
    fn reclaim(&mut self) -> io::Result<Vec<u8>>;
}

impl Conn for trespass::Stream {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        Write::write_all(self, buf)
    }
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        Read::read_exact(self, buf)
    }
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Read::read(self, buf)
    }
    fn send_msg(&mut self, msg: &[u8]) -> io::Result<()> {
        trespass::Stream::send_msg(self, msg)
    }
    fn recv_msg(&mut self, msg: &mut Vec<u8>) -> io::Result<Option<usize>> {
        trespass::Stream::recv_msg(self, msg)
    }
    fn shutdown_write(&mut self) -> io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
    fn lend_msg(&mut self, buf: Vec<u8>) -> io::Result<()> {
        Ok(trespass::Stream::lend_msg(self, buf)?)
    }
    fn reclaim(&mut self) -> io::Result<Vec<u8>> {
        trespass::Stream::reclaim(self)
    }
}

/// A trespass stream on tokio, with the current-thread runtime that drives it. Every call
/// awaits in that runtime (`block_on`), bounded by the same timeout as the blocking
/// stream's calls.
pub(crate) struct TokioConn {
    // Dropped before the runtime: a stream whose last bytes are still on their way hands
    // its lingering close to the runtime's blocking pool, which the runtime's drop waits for.
    stream: trespass::tokio::Stream,
    rt: tokio::runtime::Runtime,
    timeout: Duration,
}

impl TokioConn {
    /// Takes over `stream` (set up as the blocking calls want it: nodelay, busy poll) onto
    /// a new current-thread runtime; `busy_poll_max`, if given, fixes the adaptive spin's
    /// limit (else the tokio front end's default: adapt while the runtime is not crowded,
    /// which one stream alone on its runtime never is). Each call waits at most `timeout`.
    pub(crate) fn new(
        stream: trespass::Stream,
        busy_poll_max: Option<Duration>,
        timeout: Duration,
    ) -> io::Result<TokioConn> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // The tokio stream keeps the blocking one's busy poll.
        let mut stream = {
            let _in_runtime = rt.enter();
            trespass::tokio::Stream::from_std(stream)?
        };
        if let Some(max) = busy_poll_max {
            stream.set_busy_poll_max(max);
        }
        Ok(TokioConn {
            stream,
            rt,
            timeout,
        })
    }
}

/// Runs `f` to its end on `rt`, or fails with `TimedOut` after `limit`.
fn within<T>(
    rt: &tokio::runtime::Runtime,
    limit: Duration,
    f: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    rt.block_on(async {
        tokio::time::timeout(limit, f).await.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer did not answer within {} s", limit.as_secs()),
            ))
        })
    })
}

impl Conn for TokioConn {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        within(&self.rt, self.timeout, self.stream.write_all(buf))
    }
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        within(&self.rt, self.timeout, async {
            self.stream.read_exact(buf).await.map(drop)
        })
    }
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        within(&self.rt, self.timeout, self.stream.read(buf))
    }
    fn send_msg(&mut self, msg: &[u8]) -> io::Result<()> {
        within(&self.rt, self.timeout, self.stream.send_msg(msg))
    }
    fn recv_msg(&mut self, msg: &mut Vec<u8>) -> io::Result<Option<usize>> {
        within(&self.rt, self.timeout, self.stream.recv_msg(msg))
    }
    fn shutdown_write(&mut self) -> io::Result<()> {
        within(&self.rt, self.timeout, self.stream.shutdown())
    }
    fn lend_msg(&mut self, buf: Vec<u8>) -> io::Result<()> {
        within(&self.rt, self.timeout, async {
            Ok(self.stream.lend_msg(buf).await?)
        })
    }
    fn reclaim(&mut self) -> io::Result<Vec<u8>> {
        within(&self.rt, self.timeout, self.stream.reclaim())
    }
}

/// Buffers lent at most at once by one side of a `--lend` run.
const LEND_DEPTH: usize = 8;

/// One side's lent buffers in a `--lend` run: up to [`LEND_DEPTH`] lent at once, each
/// taken back (reclaimed) to be lent again, so a run allocates only its first few.
#[derive(Default)]
pub(crate) struct Lender {
    /// Buffers back from the peer, ready to lend again.
    free: Vec<Vec<u8>>,
    /// Lent and not yet reclaimed.
    out: usize,
}

impl Lender {
    /// Lends a buffer holding `bytes`: one back from the peer when one of that length is
    /// (its bytes are what an earlier message of the run carried: a run lends the same
    /// bytes every time), else a new one while fewer than the depth are out, else the
    /// oldest once the peer returns it.
    pub(crate) fn lend_copy(&mut self, s: &mut impl Conn, bytes: &[u8]) -> io::Result<()> {
        let buf = match self.free.pop() {
            Some(b) if b.len() == bytes.len() => b,
            _ if self.out < LEND_DEPTH => bytes.to_vec(),
            _ => {
                let b = s.reclaim()?;
                self.out -= 1;
                if b.len() == bytes.len() {
                    b
                } else {
                    bytes.to_vec()
                }
            }
        };
        self.lend(s, buf)
    }

    /// Lends `buf` as it is (first taking the oldest back when the depth is out).
    pub(crate) fn lend(&mut self, s: &mut impl Conn, buf: Vec<u8>) -> io::Result<()> {
        if self.out >= LEND_DEPTH {
            self.free.push(s.reclaim()?);
            self.out -= 1;
        }
        s.lend_msg(buf)?;
        self.out += 1;
        Ok(())
    }

    /// A buffer to receive into: one back from the peer, or an empty one.
    pub(crate) fn target(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_default()
    }

    /// Takes every lent buffer back.
    pub(crate) fn drain(&mut self, s: &mut impl Conn) -> io::Result<()> {
        while self.out > 0 {
            self.free.push(s.reclaim()?);
            self.out -= 1;
        }
        Ok(())
    }
}
