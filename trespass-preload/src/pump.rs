//! The pump: one thread per process, running a single-threaded tokio runtime, that moves
//! bytes between each carried connection's trespass stream and the kernel socket the
//! program holds in its place, and accepts RDMA connections for the program's listeners.
//!
//! The program's fd stays a real kernel socket (one end of a socket pair on the connecting
//! side, a loopback TCP connection on the accepting side), so every call on it (read, write,
//! poll, select, epoll in any mode and in several sets, fcntl, dup, fork, sendfile, splice)
//! has the kernel's own meaning. The cost is a copy through the kernel on each side, which
//! the program's data calls skip when they can (`direct`): the pump counts the bytes it
//! holds between its read and its write under the direct path's lock, so that they never
//! overtake the pump's.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;

use crate::direct::{self, Direct, Way};
use crate::pending::{Attempt, Handoff};
use crate::stats::{count, Event};
use crate::table;

/// Buffer size of each direction of a carried connection.
const COPY_BUF: usize = 64 * 1024;

/// Carried connections whose pump task has not finished (counted from the moment the
/// connection is handed to the pump): the drain at exit waits until none is left.
static CARRYING: AtomicUsize = AtomicUsize::new(0);

/// One of [`CARRYING`], for as long as it lives.
pub(crate) struct Carrying(());

impl Carrying {
    pub(crate) fn new() -> Carrying {
        CARRYING.fetch_add(1, Ordering::SeqCst);
        Carrying(())
    }
}

impl Drop for Carrying {
    fn drop(&mut self) {
        CARRYING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the pump is asked to do.
pub(crate) enum Job {
    /// Carry `stream` to and from `app`, the pump's end of the program's socket.
    Carry {
        stream: trespass::Stream,
        app: OwnedFd,
        counted: Carrying,
        /// The program's direct path to `stream`, if it has one.
        direct: Option<Arc<Direct>>,
    },
    /// Accept RDMA connections on `listener` and hand each to the program's TCP listener at
    /// `reach` (a loopback connection, which the program's accept returns).
    Listen {
        id: u64,
        listener: trespass::Listener,
        reach: SocketAddr,
    },
    /// The program closed listener `id`.
    StopListen { id: u64 },
    /// Try an RDMA connection to `target` for a non-blocking connect (see `pending`).
    Connect {
        target: SocketAddr,
        timeout: Duration,
        attempt: Arc<Attempt>,
    },
    /// Finish a non-blocking connect whose answer came as it returned `EINPROGRESS`.
    Finish {
        handoff: Handoff,
        result: io::Result<trespass::Stream>,
    },
}

/// This process's pump thread, by the process that started it.
pub(crate) struct Pump {
    pid: u32,
    jobs: mpsc::UnboundedSender<Job>,
    /// Set when the process exits: connections whose outgoing bytes are all gone stop
    /// waiting for incoming ones.
    exiting: watch::Sender<bool>,
}

static PUMP: Mutex<Option<Pump>> = Mutex::new(None);

/// The pump's lock, for the fork handlers (see `crate::fork`).
pub(crate) fn lock() -> MutexGuard<'static, Option<Pump>> {
    PUMP.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hands `job` to this process's pump, starting it on first use (and again in a forked
/// child, which has no threads of its parent's).
pub(crate) fn send(job: Job) -> io::Result<()> {
    let mut pump = lock();
    running(&mut pump)?
        .jobs
        .send(job)
        .map_err(|_| io::Error::other("the trespass-preload pump thread has stopped"))
}

/// Starts this process's pump if it has none yet.
pub(crate) fn ensure() -> io::Result<()> {
    let mut pump = lock();
    running(&mut pump).map(drop)
}

fn running(pump: &mut Option<Pump>) -> io::Result<&Pump> {
    let pid = std::process::id();
    if pump.as_ref().is_none_or(|p| p.pid != pid) {
        // A parent's pump in a child is only memory: forget it rather than drop what may
        // hold locks of threads that do not exist here.
        if let Some(old) = pump.take() {
            std::mem::forget(old);
        }
        *pump = Some(start(pid)?);
    }
    Ok(pump.as_ref().expect("just made"))
}

/// At exit (after the program's carried fds were half-closed): lets every connection send
/// what the program wrote and its end of stream, and waits, at most `bound`, until the pump
/// has carried it all and the streams have closed after their last bytes. Without this the
/// bytes still in the pump when the process ends would be lost, where the kernel would have
/// delivered a TCP socket's. Nothing to do in a process without a pump of its own.
pub(crate) fn drain_at_exit(bound: Duration) {
    {
        let pump = lock();
        let Some(p) = pump.as_ref().filter(|p| p.pid == std::process::id()) else {
            return;
        };
        let _ = p.exiting.send(true);
    }
    let deadline = Instant::now() + bound;
    while CARRYING.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether this process has a pump of its own (a forked child has none until it carries a
/// connection itself).
pub(crate) fn mine() -> bool {
    lock().as_ref().is_some_and(|p| p.pid == std::process::id())
}

/// Tells this process's pump, if it has one, to stop listener `id`; starts nothing.
pub(crate) fn stop_listening(id: u64) {
    let pump = lock();
    if let Some(p) = pump.as_ref().filter(|p| p.pid == std::process::id()) {
        let _ = p.jobs.send(Job::StopListen { id });
    }
}

fn start(pid: u32) -> io::Result<Pump> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("trespass-preload")
        // The runtime's threads (its blocking pool runs the RDMA handshakes) call socket
        // functions of their own: those go straight to the C library. And they leave the
        // program's signals to the program's threads.
        .on_thread_start(|| {
            crate::internal::set(true);
            trespass::leave_signals_to_the_application();
        })
        .build()?;
    let (tx, rx) = mpsc::unbounded_channel();
    let (exiting, exit_seen) = watch::channel(false);
    std::thread::Builder::new()
        .name("trespass-preload".into())
        .spawn(move || {
            crate::internal::set(true);
            trespass::leave_signals_to_the_application();
            rt.block_on(serve(rx, exit_seen));
        })?;
    Ok(Pump {
        pid,
        jobs: tx,
        exiting,
    })
}

async fn serve(mut jobs: mpsc::UnboundedReceiver<Job>, exiting: watch::Receiver<bool>) {
    let mut listeners: HashMap<u64, AbortHandle> = HashMap::new();
    while let Some(job) = jobs.recv().await {
        match job {
            Job::Carry {
                stream,
                app,
                counted,
                direct,
            } => {
                let exiting = exiting.clone();
                tokio::spawn(async move {
                    let r = start_carrying(stream, app, exiting, direct).await;
                    drop(counted);
                    if let Err(e) = r {
                        crate::log(format_args!("a carried connection ended: {e}"));
                    }
                });
            }
            Job::Listen {
                id,
                listener,
                reach,
            } => {
                let task = tokio::spawn(listen(listener, reach, exiting.clone()));
                listeners.insert(id, task.abort_handle());
            }
            Job::StopListen { id } => {
                if let Some(task) = listeners.remove(&id) {
                    task.abort();
                }
            }
            Job::Connect {
                target,
                timeout,
                attempt,
            } => {
                let exiting = exiting.clone();
                tokio::spawn(async move {
                    let result = tokio::task::spawn_blocking(move || {
                        trespass::Stream::connect_timeout(&target, timeout)
                    })
                    .await
                    .unwrap_or_else(|e| Err(io::Error::other(e)));
                    if let Some((handoff, result)) = attempt.answer(result) {
                        finish(handoff, result, exiting).await;
                    }
                });
            }
            Job::Finish { handoff, result } => {
                tokio::spawn(finish(handoff, result, exiting.clone()));
            }
        }
    }
}

/// Finishes a connect that returned `EINPROGRESS`: over RDMA if the attempt succeeded, else
/// over TCP from the program's own socket, carried through the socket pair all the same (the
/// program's fd cannot change under its epoll sets); or fails it (`SO_ERROR`).
async fn finish(h: Handoff, result: io::Result<trespass::Stream>, exiting: watch::Receiver<bool>) {
    // Counted for the drain at exit from when there is a connection to carry: a connect
    // still in progress has nothing of the program's to deliver.
    let r = match result {
        Ok(stream) => {
            let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
                return h.fail(libc::ECONNABORTED);
            };
            count(Event::ConnectRdma);
            crate::log(format_args!("{}: over RDMA (after EINPROGRESS)", h.peer));
            let handle = crate::config().direct.then(|| stream.try_handle());
            let (theirs, direct) = h.connected(local, peer, handle);
            let _counted = Carrying::new();
            start_carrying(stream, theirs.into(), exiting, direct).await
        }
        Err(e) => {
            crate::pending::note_failure(h.peer, h.target, &e);
            match tcp(&h).await {
                Ok(tcp) => {
                    let (local, peer) = (tcp.local_addr().unwrap_or(h.peer), h.peer);
                    let (theirs, _) = h.connected(local, peer, None);
                    let _counted = Carrying::new();
                    match SockIo::new(theirs.into()) {
                        Ok(app) => carry(tcp, app, exiting, None, None).await.0,
                        Err(e) => Err(e),
                    }
                }
                Err(e) => {
                    crate::log(format_args!("{}: the TCP connect failed too: {e}", h.peer));
                    h.fail(e.raw_os_error().unwrap_or(libc::ECONNREFUSED));
                    Ok(())
                }
            }
        }
    };
    if let Err(e) = r {
        crate::log(format_args!("a carried connection ended: {e}"));
    }
}

/// The TCP connect of a pending connect's own socket (as the program made it, bound or not).
async fn tcp(h: &Handoff) -> io::Result<tokio::net::TcpStream> {
    let socket = std::net::TcpStream::from(h.socket.try_clone()?);
    socket.set_nonblocking(true)?;
    let socket = tokio::net::TcpSocket::from_std_stream(socket);
    let tcp = socket.connect(h.peer).await?;
    // The pump writes what it reads as it reads it: Nagle's delay would only add to that.
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// The connecting side's connection, from the blocking stream and the pump's end of the
/// program's socket pair.
async fn start_carrying(
    stream: trespass::Stream,
    app: OwnedFd,
    exiting: watch::Receiver<bool>,
    direct: Option<Arc<Direct>>,
) -> io::Result<()> {
    // Whatever ends the carrying, the program's calls stop using the stream first.
    let _finish = Finish(direct.clone());
    let mut rdma = trespass::tokio::Stream::from_std(stream)?;
    spin(&mut rdma);
    let app = SockIo::new(app)?;
    let (r, rdma) = carry(rdma, app, exiting, None, direct.as_deref()).await;
    drop(_finish);
    close(rdma).await;
    r
}

/// Ends a direct path (see [`Direct::finish`]) when dropped.
struct Finish(Option<Arc<Direct>>);

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            d.finish();
        }
    }
}

/// A reader whose reads happen under the direct path's lock and count what they read as
/// held (until a [`Release`] writes it on): the program's direct calls never pass bytes
/// that came before theirs.
struct Held<'a, R> {
    inner: R,
    direct: Option<&'a Direct>,
    way: Way,
}

impl<R: AsyncRead + Unpin> AsyncRead for Held<'_, R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(d) = this.direct else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        let mut s = d.lock();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            s.took(this.way, buf.filled().len() - before);
        }
        r
    }
}

/// A writer that counts what it wrote as no longer held (see [`Held`]).
struct Release<'a, W> {
    inner: W,
    direct: Option<&'a Direct>,
    way: Way,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Release<'_, W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let (Some(d), Poll::Ready(Ok(n))) = (this.direct, &r) {
            let mut s = d.lock();
            let h = s.held(this.way);
            *h = h.saturating_sub(*n);
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Closes a carried stream after its last bytes (at most the linger), on the blocking pool.
async fn close(rdma: trespass::tokio::Stream) {
    let stream = rdma.into_std();
    let _ = tokio::task::spawn_blocking(move || drop(stream)).await;
}

/// Moves bytes both ways until both have ended: an end of stream on one side is a
/// half-close of the other (TCP's meaning), an error on either ends both. Once the process
/// is exiting, a connection whose outgoing half has ended stops waiting for incoming bytes.
/// Returns the far side for the caller to close: a trespass stream closes after its last
/// bytes (see [`close`]), and the drain at exit counts on the caller waiting for that.
/// `unaccepted`, on the accepting side, is the pump's loopback connection's source address:
/// a connection the program never accepted has nothing of the program's to send, and is not
/// waited for at exit.
async fn carry<F: AsyncRead + AsyncWrite + Unpin>(
    rdma: F,
    app: SockIo,
    mut exiting: watch::Receiver<bool>,
    unaccepted: Option<SocketAddr>,
    direct: Option<&Direct>,
) -> (io::Result<()>, F) {
    let (mut rdma_rd, mut rdma_wr) = tokio::io::split(rdma);
    let (mut app_rd, mut app_wr) = tokio::io::split(app);
    let result = {
        let outgoing = one_way(&mut app_rd, &mut rdma_wr, direct, Way::Out);
        let incoming = one_way(&mut rdma_rd, &mut app_wr, direct, Way::In);
        tokio::pin!(outgoing, incoming);
        let (mut out_done, mut in_done) = (false, false);
        loop {
            tokio::select! {
                r = &mut outgoing, if !out_done => match r {
                    Ok(()) => out_done = true,
                    Err(e) => break Err(e),
                },
                r = &mut incoming, if !in_done => match r {
                    Ok(()) => in_done = true,
                    Err(e) => break Err(e),
                },
                _ = exiting.wait_for(|e| *e), if !in_done
                    && (out_done || unaccepted.is_some_and(table::has_marker)) => break Ok(()),
            }
            if out_done && in_done {
                break Ok(());
            }
        }
    };
    (result, rdma_rd.unsplit(rdma_wr))
}

/// One direction of [`carry`]: copies `from` to `to` until `from` ends, then shuts `to`'s
/// write side down; the bytes between the two count as held in direction `way` of the
/// direct path, if there is one (see [`Held`]).
async fn one_way<R, W>(from: R, to: W, direct: Option<&Direct>, way: Way) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let from = Held {
        inner: from,
        direct,
        way,
    };
    let mut to = Release {
        inner: to,
        direct,
        way,
    };
    let mut from = BufReader::with_capacity(COPY_BUF, from);
    tokio::io::copy_buf(&mut from, &mut to).await?;
    to.shutdown().await
}

/// The pump's busy poll, fixed (no adaptation beyond it): see `Config::busy_poll`.
fn spin(stream: &mut trespass::tokio::Stream) {
    let d = crate::config().busy_poll;
    stream.set_busy_poll(d);
    stream.set_busy_poll_max(d);
}

async fn listen(listener: trespass::Listener, reach: SocketAddr, exiting: watch::Receiver<bool>) {
    let listener = match trespass::tokio::Listener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            crate::log(format_args!("cannot listen for RDMA on the pump: {e}"));
            return;
        }
    };
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let counted = Carrying::new();
                let exiting = exiting.clone();
                tokio::spawn(async move {
                    let r = hand_over(stream, peer, reach, exiting).await;
                    drop(counted);
                    if let Err(e) = r {
                        crate::log(format_args!("an RDMA connection from {peer} ended: {e}"));
                    }
                });
            }
            Err(e) => {
                crate::log(format_args!("accepting an RDMA connection failed: {e}"));
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

/// Connects to the program's listener over loopback and carries `stream` through that
/// connection. The connection's source address is recorded before it connects, so that the
/// program's accept, however soon it runs, finds the RDMA peer's address for it.
async fn hand_over(
    stream: trespass::tokio::Stream,
    peer: SocketAddr,
    reach: SocketAddr,
    exiting: watch::Receiver<bool>,
) -> io::Result<()> {
    let local = stream.local_addr().unwrap_or(reach);
    let socket = match reach {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_nodelay(true)?;
    socket.bind(SocketAddr::new(reach.ip(), 0))?;
    let source = socket.local_addr()?;
    // The program's accept may return the connection as soon as it is made: its direct path
    // and its addresses are there before.
    let direct = if crate::config().direct {
        let end = socket.as_fd().try_clone_to_owned()?;
        let d = Direct::new(stream.try_handle(), &end)?;
        direct::add_unaccepted(source, Arc::clone(&d));
        Some(d)
    } else {
        None
    };
    let _finish = Finish(direct.clone());
    table::add_marker(source, peer, local);
    let tcp = match socket.connect(reach).await {
        Ok(tcp) => tcp,
        Err(e) => {
            table::take_marker(source);
            direct::take_unaccepted(source);
            return Err(e);
        }
    };
    let fd: OwnedFd = tcp.into_std()?.into();
    let app = SockIo::new(fd)?;
    let mut rdma = stream;
    spin(&mut rdma);
    let (r, rdma) = carry(rdma, app, exiting, Some(source), direct.as_deref()).await;
    drop(_finish);
    close(rdma).await;
    // The program may never have accepted it.
    table::take_marker(source);
    direct::take_unaccepted(source);
    r
}

/// A connected socket for tokio whose writes never raise SIGPIPE (a program that closes its
/// end must not be killed by the pump writing to it) and whose shutdown is a half-close.
struct SockIo {
    fd: AsyncFd<OwnedFd>,
}

impl SockIo {
    fn new(fd: OwnedFd) -> io::Result<SockIo> {
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl on an fd this function owns; F_GETFL takes no argument.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above; F_SETFL takes an int of flags.
        if unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: an OwnedFd is open and always returns the same number; the AsyncFd owns
        // it, so nothing closes or replaces it while it is registered.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
        Ok(SockIo { fd })
    }
}

impl AsyncRead for SockIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let r = guard.try_io(|fd| {
                // SAFETY: `unfilled` is writable for its length.
                let n = unsafe {
                    libc::recv(
                        fd.as_raw_fd(),
                        unfilled.as_mut_ptr().cast(),
                        unfilled.len(),
                        0,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match r {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for SockIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            let r = guard.try_io(|fd| {
                // SAFETY: `buf` is readable for its length; MSG_NOSIGNAL turns a closed
                // peer into EPIPE instead of a signal.
                let n = unsafe {
                    libc::send(
                        fd.as_raw_fd(),
                        buf.as_ptr().cast(),
                        buf.len(),
                        libc::MSG_NOSIGNAL,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match r {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // SAFETY: shutdown on the fd this value owns.
        let r = unsafe { libc::shutdown(self.fd.get_ref().as_raw_fd(), libc::SHUT_WR) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // The program closed its end already: nothing is left to tell.
            if e.raw_os_error() != Some(libc::ENOTCONN) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(()))
    }
}
