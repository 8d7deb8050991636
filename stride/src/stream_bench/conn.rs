//! The calls `stride-perf stream` makes on a connection, over either of trespass's front
//! ends: the blocking [`trespass::Stream`], or the tokio [`trespass::tokio::Stream`]
//! (`--tokio`), each connection's thread driving its stream through a current-thread
//! runtime of its own, the per-core mode of `docs/trespass-async.md`. The measuring code
//! is written once, generic over [`Conn`], so both front ends run the same code between
//! their calls; only the loops of the measured iterations ([`Conn::ping`], [`Conn::echo`],
//! [`Conn::pour`], [`Conn::drink`]) have an async twin for tokio, which runs each loop as
//! one future, as an application's task would, instead of entering the runtime
//! (`block_on`, a timer) for every call.

use std::cell::Cell;
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

    /// The latency test's client: `iters` round trips, each writing `buf` (stream bytes,
    /// or one message with `messages`) and reading its echo (into `back`, or `msg`),
    /// calling `stamp` before each and after the last.
    fn ping(
        &mut self,
        iters: u64,
        buf: &[u8],
        back: &mut [u8],
        msg: &mut Vec<u8>,
        messages: bool,
        stamp: &mut impl FnMut(),
    ) -> Result<(), String> {
        for i in 0..iters {
            stamp();
            put(self, buf, messages).map_err(failed(i, Doing::Writing))?;
            get(self, back, msg, messages).map_err(failed(i, Doing::ReadingEcho))?;
        }
        stamp();
        Ok(())
    }

    /// The latency test's server: `iters` times reads `buf.len()` bytes (or a message of
    /// that length, into `msg`) and writes them back.
    fn echo(
        &mut self,
        iters: u64,
        buf: &mut [u8],
        msg: &mut Vec<u8>,
        messages: bool,
    ) -> Result<(), String> {
        for i in 0..iters {
            get(self, buf, msg, messages).map_err(failed(i, Doing::Reading))?;
            let echo = if messages { &msg[..] } else { &buf[..] };
            put(self, echo, messages).map_err(failed(i, Doing::Echoing))?;
        }
        Ok(())
    }

    /// The bandwidth test's client: `iters` writes of `buf` (or messages), then the
    /// server's one-byte answer.
    fn pour(&mut self, iters: u64, buf: &[u8], messages: bool) -> Result<(), String> {
        for i in 0..iters {
            put(self, buf, messages).map_err(failed(i, Doing::Sending))?;
        }
        let mut answer = [0u8; 1];
        self.read_exact(&mut answer)
            .map_err(|e| format!("{}: {e}", Doing::LastAnswer))
    }

    /// The bandwidth test's server: reads `iters` messages of `size` bytes (stream bytes
    /// in reads of up to `buf.len()`, or messages into `msg`), then answers one byte.
    fn drink(
        &mut self,
        iters: u64,
        size: usize,
        buf: &mut [u8],
        msg: &mut Vec<u8>,
        messages: bool,
    ) -> Result<(), String> {
        if messages {
            for i in 0..iters {
                get(self, &mut buf[..size], msg, true).map_err(failed(i, Doing::Message))?;
            }
        } else {
            let mut left = size as u64 * iters;
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let got = self
                    .read(&mut buf[..want])
                    .map_err(|e| format!("reading with {left} bytes to go: {e}"))?;
                left = drank(left, got)?;
            }
        }
        self.write_all(&[1])
            .map_err(|e| format!("{}: {e}", Doing::Answering))
    }
}

/// What a measuring loop was doing when a call failed, as its error says it.
#[derive(Debug, Clone, Copy)]
enum Doing {
    Writing,
    ReadingEcho,
    Reading,
    Echoing,
    Sending,
    Message,
    LastAnswer,
    Answering,
}

impl std::fmt::Display for Doing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Doing::Writing => "writing",
            Doing::ReadingEcho => "reading the echo",
            Doing::Reading => "reading",
            Doing::Echoing => "echoing",
            Doing::Sending => "writing",
            Doing::Message => "receiving",
            Doing::LastAnswer => "reading the server's answer after the last message",
            Doing::Answering => "answering the last message",
        })
    }
}

/// The error of iteration `i` (a round trip, or a message of the bandwidth test).
fn failed(i: u64, doing: Doing) -> impl FnOnce(io::Error) -> String {
    move |e| match doing {
        Doing::Sending | Doing::Message => format!("message {i}: {doing}: {e}"),
        _ => format!("round trip {i}: {doing}: {e}"),
    }
}

/// The bytes left after a read of `got` with `left` to go; the end of the stream before
/// them is an error.
fn drank(left: u64, got: usize) -> Result<u64, String> {
    if got == 0 {
        return Err(format!(
            "the client closed the stream with {left} bytes to go"
        ));
    }
    Ok(left - got as u64)
}

/// Writes `buf` as stream bytes, or as one message.
#[inline]
fn put<C: Conn + ?Sized>(s: &mut C, buf: &[u8], messages: bool) -> io::Result<()> {
    if messages {
        s.send_msg(buf)
    } else {
        s.write_all(buf)
    }
}

/// Reads exactly `buf.len()` stream bytes, or one message of exactly that length (into
/// `msg`).
#[inline]
fn get<C: Conn + ?Sized>(
    s: &mut C,
    buf: &mut [u8],
    msg: &mut Vec<u8>,
    messages: bool,
) -> io::Result<()> {
    if messages {
        message_of(s.recv_msg(msg)?, buf.len())
    } else {
        s.read_exact(buf)
    }
}

/// A received message's length (`None`: the end of the stream) against the `want`ed one.
pub(crate) fn message_of(got: Option<usize>, want: usize) -> io::Result<()> {
    match got {
        Some(n) if n == want => Ok(()),
        Some(n) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message of {n} bytes where {want} were expected"),
        )),
        None => Err(io::ErrorKind::UnexpectedEof.into()),
    }
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

/// Runs the measuring loop `f` to its end on `rt` as one future, or fails when a whole
/// `limit` passes without `progress` (its iterations so far) moving: the per-call bound of
/// [`within`] without a timer per call.
fn loop_within(
    rt: &tokio::runtime::Runtime,
    limit: Duration,
    progress: &Cell<u64>,
    f: impl Future<Output = Result<(), String>>,
) -> Result<(), String> {
    rt.block_on(async {
        let mut f = std::pin::pin!(f);
        let mut seen = progress.get();
        loop {
            match tokio::time::timeout(limit, f.as_mut()).await {
                Ok(r) => return r,
                Err(_) if progress.get() == seen => {
                    return Err(format!(
                        "iteration {seen}: the peer did not answer within {limit:?}"
                    ))
                }
                Err(_) => seen = progress.get(),
            }
        }
    })
}

/// [`put`] on tokio.
async fn put_async(s: &mut trespass::tokio::Stream, buf: &[u8], messages: bool) -> io::Result<()> {
    if messages {
        s.send_msg(buf).await
    } else {
        s.write_all(buf).await
    }
}

/// [`get`] on tokio.
async fn get_async(
    s: &mut trespass::tokio::Stream,
    buf: &mut [u8],
    msg: &mut Vec<u8>,
    messages: bool,
) -> io::Result<()> {
    if messages {
        message_of(s.recv_msg(msg).await?, buf.len())
    } else {
        s.read_exact(buf).await.map(drop)
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

    fn ping(
        &mut self,
        iters: u64,
        buf: &[u8],
        back: &mut [u8],
        msg: &mut Vec<u8>,
        messages: bool,
        stamp: &mut impl FnMut(),
    ) -> Result<(), String> {
        let progress = Cell::new(0);
        let s = &mut self.stream;
        loop_within(&self.rt, self.timeout, &progress, async {
            for i in 0..iters {
                stamp();
                put_async(s, buf, messages)
                    .await
                    .map_err(failed(i, Doing::Writing))?;
                get_async(s, back, msg, messages)
                    .await
                    .map_err(failed(i, Doing::ReadingEcho))?;
                progress.set(i + 1);
            }
            stamp();
            Ok(())
        })
    }

    fn echo(
        &mut self,
        iters: u64,
        buf: &mut [u8],
        msg: &mut Vec<u8>,
        messages: bool,
    ) -> Result<(), String> {
        let progress = Cell::new(0);
        let s = &mut self.stream;
        loop_within(&self.rt, self.timeout, &progress, async {
            for i in 0..iters {
                get_async(s, buf, msg, messages)
                    .await
                    .map_err(failed(i, Doing::Reading))?;
                let echo = if messages { &msg[..] } else { &buf[..] };
                put_async(s, echo, messages)
                    .await
                    .map_err(failed(i, Doing::Echoing))?;
                progress.set(i + 1);
            }
            Ok(())
        })
    }

    fn pour(&mut self, iters: u64, buf: &[u8], messages: bool) -> Result<(), String> {
        let progress = Cell::new(0);
        let s = &mut self.stream;
        loop_within(&self.rt, self.timeout, &progress, async {
            for i in 0..iters {
                put_async(s, buf, messages)
                    .await
                    .map_err(failed(i, Doing::Sending))?;
                progress.set(i + 1);
            }
            let mut answer = [0u8; 1];
            s.read_exact(&mut answer)
                .await
                .map(drop)
                .map_err(|e| format!("{}: {e}", Doing::LastAnswer))
        })
    }

    fn drink(
        &mut self,
        iters: u64,
        size: usize,
        buf: &mut [u8],
        msg: &mut Vec<u8>,
        messages: bool,
    ) -> Result<(), String> {
        let progress = Cell::new(0);
        let s = &mut self.stream;
        loop_within(&self.rt, self.timeout, &progress, async {
            if messages {
                for i in 0..iters {
                    get_async(s, &mut buf[..size], msg, true)
                        .await
                        .map_err(failed(i, Doing::Message))?;
                    progress.set(i + 1);
                }
            } else {
                let mut left = size as u64 * iters;
                while left > 0 {
                    let want = left.min(buf.len() as u64) as usize;
                    let got = s
                        .read(&mut buf[..want])
                        .await
                        .map_err(|e| format!("reading with {left} bytes to go: {e}"))?;
                    left = drank(left, got)?;
                    progress.set(progress.get() + 1);
                }
            }
            s.write_all(&[1])
                .await
                .map_err(|e| format!("{}: {e}", Doing::Answering))
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A connection whose peer echoes: what is written comes back to be read, stream
    /// bytes and messages alike; `close_after` bytes end the stream.
    #[derive(Default)]
    struct Echo {
        bytes: VecDeque<u8>,
        msgs: VecDeque<Vec<u8>>,
        calls: usize,
        end_after: Option<usize>,
    }

    impl Conn for Echo {
        fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
            self.calls += 1;
            self.bytes.extend(buf);
            Ok(())
        }
        fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
            self.calls += 1;
            if self.bytes.len() < buf.len() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            for b in buf.iter_mut() {
                *b = self.bytes.pop_front().unwrap();
            }
            Ok(())
        }
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.calls += 1;
            let n = buf.len().min(self.bytes.len());
            let n = self.end_after.map_or(n, |e| n.min(e));
            for b in &mut buf[..n] {
                *b = self.bytes.pop_front().unwrap();
            }
            if let Some(e) = self.end_after.as_mut() {
                *e -= n;
            }
            Ok(n)
        }
        fn send_msg(&mut self, msg: &[u8]) -> io::Result<()> {
            self.calls += 1;
            self.msgs.push_back(msg.to_vec());
            Ok(())
        }
        fn recv_msg(&mut self, msg: &mut Vec<u8>) -> io::Result<Option<usize>> {
            self.calls += 1;
            Ok(self.msgs.pop_front().map(|m| {
                *msg = m;
                msg.len()
            }))
        }
        fn shutdown_write(&mut self) -> io::Result<()> {
            Ok(())
        }
        fn lend_msg(&mut self, _: Vec<u8>) -> io::Result<()> {
            unreachable!("the loops do not lend")
        }
        fn reclaim(&mut self) -> io::Result<Vec<u8>> {
            unreachable!("the loops do not lend")
        }
    }

    #[test]
    fn a_ping_stamps_before_each_round_trip_and_after_the_last() {
        for messages in [false, true] {
            let mut c = Echo::default();
            let mut stamps = 0;
            let mut back = [0u8; 8];
            c.ping(
                5,
                b"abcdefgh",
                &mut back,
                &mut Vec::new(),
                messages,
                &mut || stamps += 1,
            )
            .unwrap();
            assert_eq!(stamps, 6);
            assert_eq!(c.calls, 10, "a write and a read per round trip");
            if !messages {
                assert_eq!(&back, b"abcdefgh");
            }
        }
    }

    #[test]
    fn the_loops_say_which_iteration_failed_and_how() {
        // The echo is a message of the wrong length.
        let mut c = Echo::default();
        c.msgs.push_back(vec![1; 3]);
        let e = c.echo(2, &mut [0u8; 4], &mut Vec::new(), true).unwrap_err();
        assert!(
            e.starts_with("round trip 0: reading: a message of 3 bytes"),
            "{e}"
        );
        // The stream ends before all the bytes came.
        let mut c = Echo::default();
        c.bytes.extend([0u8; 10]);
        c.end_after = Some(10);
        let e = c
            .drink(4, 4, &mut [0u8; 64], &mut Vec::new(), false)
            .unwrap_err();
        assert_eq!(e, "the client closed the stream with 6 bytes to go");
        // The server never answers the last message.
        let mut c = Echo::default();
        let e = c.pour(3, b"xy", true).unwrap_err();
        assert!(
            e.starts_with("reading the server's answer after the last message"),
            "{e}"
        );
    }

    #[test]
    fn a_drink_reads_every_byte_then_answers() {
        let mut c = Echo::default();
        c.bytes.extend([7u8; 1000]);
        c.drink(10, 100, &mut [0u8; 64], &mut Vec::new(), false)
            .unwrap();
        assert_eq!(
            c.bytes,
            [1u8],
            "the one-byte answer, after every byte was read"
        );
    }

    #[test]
    fn a_loop_fails_only_when_a_whole_limit_passes_without_progress() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let limit = Duration::from_millis(40);
        // Progress every 25 ms for 200 ms: five limits long, never one without progress.
        let progress = Cell::new(0);
        loop_within(&rt, limit, &progress, async {
            for i in 0..8 {
                tokio::time::sleep(Duration::from_millis(25)).await;
                progress.set(i + 1);
            }
            Ok(())
        })
        .unwrap();
        // Stuck after three iterations.
        let progress = Cell::new(0);
        let e = loop_within(&rt, limit, &progress, async {
            for i in 0..3 {
                progress.set(i + 1);
            }
            std::future::pending::<()>().await;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(e, "iteration 3: the peer did not answer within 40ms");
    }
}
