//! The blocking front end: [`Listener`] and [`Stream`], shaped like `TcpListener` and
//! `TcpStream`, pumping the verbs driver from the caller's thread.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sideway::rdmacm::{CmError, CmId, EventChannel, EventType, PortSpace};

use crate::config::{first_addr, Config};
use crate::core::{ConnError, Connection};
use crate::driver::{Driver, Resources};
use crate::error::{Error, LendError};
use crate::readiness::Readiness;
use crate::wire::{Hello, Refusal, WireError, LEND_LEN};

/// Buffers one connection may have lent and not yet reclaimed: each holds a registration
/// (pinned memory) until the application takes it back with [`Stream::reclaim`].
pub const MAX_LENT: usize = 64;

/// A connection's driver and its readiness fd, shared with the keep-alive thread.
pub(crate) struct Shared {
    pub(crate) driver: Mutex<Driver>,
    pub(crate) readiness: Readiness,
    /// The owner (the tokio front end) has a task parked waiting to write: a
    /// [`TryHandle::wait_readable`] would take the wake-up it waits for, so none begins.
    pub(crate) owner_writes: AtomicBool,
}

pub(crate) fn cm(what: &'static str) -> impl FnOnce(CmError) -> Error {
    move |source| Error::Cm { what, source }
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Connects to `addr`: resolves it and its route through rdma_cm, makes the connection's
/// resources, and connects with this side's hello; the peer's hello comes back on accept.
pub(crate) fn connect(
    config: &Config,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<Stream, Error> {
    let deadline = Instant::now() + timeout;
    let timed_out = |e: CmError, what| match e {
        CmError::Timeout { .. } => Error::ConnectTimeout { addr, timeout },
        source => Error::Cm { what, source },
    };
    let (channel, id) = connect_start(addr, timeout)?;
    channel
        .wait_for(EventType::AddrResolved, Some(left(deadline)))
        .map_err(|e| timed_out(e, "resolving the address"))?;
    id.resolve_route(left(deadline).min(Duration::from_secs(5)))
        .map_err(cm("resolving the route"))?;
    channel
        .wait_for(EventType::RouteResolved, Some(left(deadline)))
        .map_err(|e| timed_out(e, "resolving the route"))?;
    let res = connect_routed(&id, config)?;
    let event = match channel.get_event(Some(left(deadline))) {
        Ok(ev) => ev,
        Err(e) => return Err(timed_out(e, "waiting for the peer to accept")),
    };
    connect_reply(event, res, config, addr)
}

/// The first step of connecting: an event channel and an id of its own, and the address
/// resolution started (`AddrResolved` comes next on the channel).
pub(crate) fn connect_start(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(Arc<EventChannel>, Arc<CmId>), Error> {
    let channel = EventChannel::new().map_err(cm("creating an rdma_cm event channel"))?;
    let id = channel
        .create_id(PortSpace::Tcp)
        .map_err(cm("creating an rdma_cm id"))?;
    id.resolve_addr(None, addr, timeout.min(Duration::from_secs(5)))
        .map_err(cm("resolving the address"))?;
    Ok((channel, id))
}

/// Once the route is resolved: the connection's resources, and the request sent with this
/// side's hello (the reply comes next on the channel).
pub(crate) fn connect_routed(id: &Arc<CmId>, config: &Config) -> Result<Resources, Error> {
    let res = Resources::new(id, config)?;
    id.connect(&res.conn_param(config))
        .map_err(cm("sending the connection request"))?;
    Ok(res)
}

/// The last step of connecting: the listener's reply, `Established` with its hello or a
/// refusal.
pub(crate) fn connect_reply(
    event: sideway::rdmacm::Event,
    res: Resources,
    config: &Config,
    addr: SocketAddr,
) -> Result<Stream, Error> {
    log::debug!(
        target: "trespass",
        "connecting to {addr}: rdma_cm event {:?} (status {})",
        event.event_type(),
        event.status()
    );
    let peer = match event.event_type() {
        EventType::Established => Hello::decode(event.private_data())
            .map_err(|source| Error::Handshake { addr, source })?,
        EventType::Rejected => {
            let data = event.private_data().to_vec();
            let status = event.status();
            return Err(match Refusal::decode(&data) {
                Ok(Refusal::BadHello) => Error::Refused {
                    addr,
                    reason: "the listener could not read this side's hello".into(),
                },
                Ok(Refusal::NoResources) => Error::Refused {
                    addr,
                    reason: "the listener is out of resources for another connection".into(),
                },
                Ok(Refusal::Unknown(code)) => Error::Refused {
                    addr,
                    reason: format!("reason code {code}"),
                },
                Err(source @ WireError::Version { .. }) => Error::Handshake { addr, source },
                Err(_) => Error::Refused {
                    addr,
                    reason: format!(
                        "nothing listens for trespass at this address and port (rdma_cm reject, status {status})"
                    ),
                },
            });
        }
        _ => {
            return Err(match event.into_result() {
                Err(source) => Error::Cm {
                    what: "connecting",
                    source,
                },
                Ok(ev) => Error::Cm {
                    what: "connecting",
                    source: CmError::UnexpectedEvent {
                        expected: EventType::Established,
                        got: ev.event_type(),
                        status: ev.status(),
                    },
                },
            })
        }
    };
    Stream::new(res, peer, config)
}

/// A connection request taken from a listener's channel: its id and the client's hello.
pub(crate) struct Request {
    id: Arc<CmId>,
    private: Vec<u8>,
}

/// Completes a connection request: reads the client's hello (refusing one it cannot read),
/// makes the connection's resources, accepts and waits (at most the connect timeout) for
/// the connection to be established.
pub(crate) fn handshake(config: &Config, local: SocketAddr, req: Request) -> Result<Stream, Error> {
    let accepted = handshake_accept(config, local, req)?;
    accepted
        .channel
        .wait_for(EventType::Established, Some(config.connect_timeout))
        .map_err(cm("waiting for the connection to be established"))?;
    accepted.established(config)
}

/// A connection request accepted, waiting for `Established` on its own channel.
pub(crate) struct Accepted {
    pub(crate) channel: Arc<EventChannel>,
    res: Resources,
    peer: Hello,
}

impl Accepted {
    /// The addresses of the connection being accepted.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn endpoints(&self) -> sideway::rdmacm::Endpoints {
        self.res.id.endpoints()
    }

    /// Once `Established` arrived: the stream.
    pub(crate) fn established(self, config: &Config) -> Result<Stream, Error> {
        Stream::new(self.res, self.peer, config)
    }
}

/// The handshake up to the accept: reads the client's hello (refusing one it cannot read),
/// moves the id to a channel of its own, makes the connection's resources and accepts.
pub(crate) fn handshake_accept(
    config: &Config,
    local: SocketAddr,
    req: Request,
) -> Result<Accepted, Error> {
    let Request { id, private } = req;
    let addr = id.peer_addr().unwrap_or(local);
    let peer = match Hello::decode(&private) {
        Ok(h) => h,
        Err(source) => {
            let _ = id.reject(&Refusal::BadHello.encode());
            return Err(Error::Handshake { addr, source });
        }
    };
    let channel = EventChannel::new().map_err(cm("creating an rdma_cm event channel"))?;
    id.migrate(&channel)
        .map_err(cm("moving the connection to its own event channel"))?;
    let res = match Resources::new(&id, config) {
        Ok(r) => r,
        Err(e) => {
            let _ = id.reject(&Refusal::NoResources.encode());
            return Err(e);
        }
    };
    id.accept(&res.conn_param(config))
        .map_err(cm("accepting"))?;
    Ok(Accepted { channel, res, peer })
}

/// Binds and listens on `addr`.
pub(crate) fn bind(config: &Config, addr: SocketAddr) -> Result<Listener, Error> {
    let channel = EventChannel::new().map_err(cm("creating an rdma_cm event channel"))?;
    let id = channel
        .create_id(PortSpace::Tcp)
        .map_err(cm("creating an rdma_cm id"))?;
    id.bind_addr(addr)
        .map_err(cm("binding the listener's address"))?;
    id.listen(i32::from(config.backlog))
        .map_err(cm("listening"))?;
    let local = id.local_addr().unwrap_or(addr);
    // In the shared-receive-queue mode a listener bound to a device's address keeps that
    // device's pool while it listens, so short connections do not make and destroy one each
    // (and a pool that cannot be made fails here, not at every accept). A wildcard address
    // has no device yet: its connections make the pool.
    let pool = match (config.shared_receive_queue, id.device_context()) {
        (Some(depth), Ok(ctx)) => Some(crate::pool::Pool::for_device(&ctx, depth)?),
        _ => None,
    };
    Ok(Listener {
        _pool: pool,
        _id: id,
        channel,
        config: config.clone(),
        nonblocking: false,
        local,
    })
}

/// A trespass server socket, like `TcpListener`: bound to an address with an RDMA device,
/// it accepts connections from [`Stream::connect`].
///
/// ```no_run
/// use std::io::{Read, Write};
/// let listener = trespass::Listener::bind("198.18.0.1:7471")?;
/// let (mut stream, peer) = listener.accept()?;
/// let mut buf = [0u8; 4096];
/// let n = stream.read(&mut buf)?;
/// stream.write_all(&buf[..n])?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Listener {
    /// The device's shared receive queue, held while listening (shared mode only). Dropped
    /// before the id (fields drop in order): librdmacm frees the device's PD of its own
    /// only when its last id goes, not when the last device list (which a context from
    /// `CmId::device_context` holds) is freed.
    _pool: Option<Arc<crate::pool::Pool>>,
    /// The listening id: dropping it stops listening.
    _id: Arc<CmId>,
    channel: Arc<EventChannel>,
    config: Config,
    nonblocking: bool,
    local: SocketAddr,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local", &self.local)
            .finish()
    }
}

impl Listener {
    /// Listens on `addr` with the default [`Config`] (port 0: rdma_cm picks one; see
    /// [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    ///
    /// `AddrNotAvailable`-like errors when the address has no RDMA device, `AddrInUse` when
    /// another listener has the port.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Listener> {
        Config::default().bind(addr)
    }

    /// The address listened on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// In non-blocking mode [`accept`](Self::accept) returns `WouldBlock` when no request
    /// is waiting (the handshake of one that is still takes up to the connect timeout).
    pub fn set_nonblocking(&mut self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking = nonblocking;
        Ok(())
    }

    /// Accepts the next connection. A request whose hello this side cannot read (another
    /// version, not trespass) is refused with a reason the client reports, and accept goes
    /// on waiting; so is one whose resources cannot be made.
    ///
    /// # Errors
    ///
    /// `WouldBlock` in non-blocking mode; rdma_cm failures of the listener itself.
    pub fn accept(&self) -> io::Result<(Stream, SocketAddr)> {
        loop {
            let request = if self.nonblocking {
                match self.try_request()? {
                    Some(r) => r,
                    None => return Err(io::ErrorKind::WouldBlock.into()),
                }
            } else {
                let event = self
                    .channel
                    .get_event(None)
                    .map_err(cm("waiting for a connection request"))?;
                if event.event_type() != EventType::ConnectRequest {
                    continue;
                }
                let request = Request {
                    id: Arc::clone(event.id()),
                    private: event.private_data().to_vec(),
                };
                drop(event);
                request
            };
            match handshake(&self.config, self.local, request) {
                Ok(stream) => {
                    let peer = stream.peer_addr()?;
                    return Ok((stream, peer));
                }
                Err(e) => {
                    log::warn!(target: "trespass", "refused a connection on {}: {e}", self.local);
                }
            }
        }
    }

    /// The next connection request, without waiting (`None` when none is waiting); events
    /// that are not requests are passed over.
    pub(crate) fn try_request(&self) -> io::Result<Option<Request>> {
        loop {
            match self.channel.try_get_event() {
                Ok(Some(event)) => {
                    if event.event_type() != EventType::ConnectRequest {
                        continue;
                    }
                    return Ok(Some(Request {
                        id: Arc::clone(event.id()),
                        private: event.private_data().to_vec(),
                    }));
                }
                Ok(None) => return Ok(None),
                Err(e) => return Err(cm("waiting for a connection request")(e).into()),
            }
        }
    }

    /// The configuration accepted connections get.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// An iterator over accepted connections, like `TcpListener::incoming`.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<Stream>> + '_ {
        std::iter::repeat_with(move || self.accept().map(|(s, _)| s))
    }
}

impl AsFd for Listener {
    /// The rdma_cm event channel's fd: readable when a connection request is waiting.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.channel.as_raw_fd()
    }
}

/// A trespass connection, like `TcpStream`: a byte stream ([`Read`], [`Write`]) and, on the
/// same connection, messages with boundaries ([`send_msg`](Self::send_msg),
/// [`recv_msg`](Self::recv_msg)).
///
/// Dropping it closes the connection gracefully: the write side is shut down and the drop
/// waits (at most the configured linger) until every byte written is in the peer's memory.
pub struct Stream {
    shared: Arc<Shared>,
    nonblocking: bool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    read_shut: bool,
    linger: Duration,
    /// A message being received in pieces.
    partial: Vec<u8>,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    peer_max_message: u32,
    max_message: u32,
    send_buffer: u32,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

fn io_err(e: Error) -> io::Error {
    e.into()
}

impl Stream {
    fn new(res: Resources, peer: Hello, config: &Config) -> Result<Stream, Error> {
        let (driver, readiness) = res.into_driver(peer, config)?;
        let local = driver.local;
        let remote = driver.remote;
        let shared = Arc::new(Shared {
            driver: Mutex::new(driver),
            readiness,
            owner_writes: AtomicBool::new(false),
        });
        // Every connection, keep-alive on or not: the peer's may be on, and its probes must
        // be answered while this application is busy elsewhere.
        crate::keeper::register(&shared);
        Ok(Stream {
            shared,
            nonblocking: false,
            read_timeout: None,
            write_timeout: None,
            read_shut: false,
            linger: config.linger,
            partial: Vec::new(),
            local,
            remote,
            peer_max_message: peer.max_message,
            max_message: config.max_message,
            send_buffer: config.send_buffer,
        })
    }

    /// Connects to `addr` with the default [`Config`].
    ///
    /// # Errors
    ///
    /// `ConnectionRefused` when nothing listens for trespass there (or the listener speaks
    /// another protocol version: the message says which), `AddrNotAvailable` when no RDMA
    /// device reaches the address, `TimedOut` after the configured connect timeout (10 s).
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<Stream> {
        Config::default().connect(addr)
    }

    /// Connects with a timeout for the whole setup (resolution, route, handshake).
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect); `InvalidInput` for a zero timeout.
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<Stream> {
        if timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot connect with a zero timeout",
            ));
        }
        let config = Config::default();
        Ok(connect(&config, first_addr(addr)?, timeout)?)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.remote
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no peer address"))
    }

    /// This side's address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.local
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no local address"))
    }

    fn lock(&self) -> MutexGuard<'_, Driver> {
        // A panic while pumping leaves the core consistent enough to report its state; the
        // core itself never panics on peer input.
        self.shared.driver.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shuts down the read side, the write side, or both, with TCP's meaning: after
    /// `Write` the peer reads every byte written and then end of stream; after `Read` reads
    /// return `Ok(0)` and what arrives is discarded (the peer is never blocked by it).
    ///
    /// # Errors
    ///
    /// None today; kept for `TcpStream`'s shape.
    pub fn shutdown(&mut self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.read_shut = true;
            self.partial.clear();
            let mut d = self.lock();
            d.conn.shutdown_read();
            d.flush_posts();
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            self.lock().shutdown_write();
        }
        Ok(())
    }

    /// In non-blocking mode reads and writes return `WouldBlock` instead of waiting; wait
    /// for the fd ([`AsFd`]) to turn readable, then call again.
    pub fn set_nonblocking(&mut self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking = nonblocking;
        Ok(())
    }

    /// A limit for each blocking read (`None`: none). A read that passes it fails with
    /// `TimedOut`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a zero duration, as `TcpStream`.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.read_timeout = nonzero_timeout(timeout, "read")?;
        Ok(())
    }

    /// A limit for each blocking write (`None`: none).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a zero duration.
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.write_timeout = nonzero_timeout(timeout, "write")?;
        Ok(())
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> Option<Duration> {
        self.read_timeout
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> Option<Duration> {
        self.write_timeout
    }

    /// With `nodelay` on (the default) each write goes out at once; off, small writes are
    /// held until 16 KiB are pending, a message is sent, [`flush`](Write::flush) is called,
    /// or this side blocks in a read.
    pub fn set_nodelay(&mut self, nodelay: bool) -> io::Result<()> {
        let mut d = self.lock();
        d.conn.set_nodelay(nodelay);
        d.flush_posts();
        Ok(())
    }

    /// Whether `nodelay` is on.
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(self.lock().conn.nodelay())
    }

    /// How long blocking calls spin before sleeping (the configured busy poll).
    pub fn set_busy_poll(&mut self, d: Duration) {
        self.lock().set_busy_poll(d);
    }

    /// The connection's spin policy (the busy poll, its limit and what it learned).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn spin(&self) -> crate::spin::Spin {
        self.lock().spin()
    }

    /// Whether a read wait beginning now waits for an answer (see `Driver::awaits_answer`):
    /// each call starts a new count, as each blocking read wait does.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn awaits_answer(&self) -> bool {
        self.lock().awaits_answer()
    }

    fn deadline(&self, timeout: Option<Duration>) -> Option<Instant> {
        timeout.map(|t| Instant::now() + t)
    }

    fn would_block(&self, d: &mut Driver) -> io::Error {
        d.prepare_sleep(&self.shared.readiness);
        io::ErrorKind::WouldBlock.into()
    }

    /// [`would_block`](Self::would_block) for a read, which leaves the completion channel
    /// to a thread waiting for bytes in this stream's place, if there is one.
    fn would_block_reading(&self, d: &mut Driver) -> io::Error {
        d.prepare_sleep_reading(&self.shared.readiness);
        io::ErrorKind::WouldBlock.into()
    }

    /// Waits until `ready`, or fails with `TimedOut` once `deadline` passed (the `which`
    /// timeout, `timeout`, set it); `answer` as [`Driver::wait_until`]'s.
    fn wait(
        &self,
        d: &mut Driver,
        deadline: Option<Instant>,
        answer: bool,
        which: &'static str,
        timeout: Option<Duration>,
        ready: impl Fn(&Connection) -> bool,
    ) -> io::Result<()> {
        if d.wait_until(&self.shared.readiness, deadline, answer, ready)
            .map_err(io_err)?
        {
            return Ok(());
        }
        Err(io_err(Error::Timeout {
            which,
            timeout: timeout.unwrap_or_default(),
        }))
    }

    /// Nothing is readable yet: in non-blocking mode `WouldBlock` (after arming the fd)
    /// unless something turned up meanwhile; else waits for bytes, a message or the end
    /// (posting bytes held back by coalescing first, since the peer may be waiting for
    /// them). `Ok` means: look again.
    fn wait_readable(&self, d: &mut Driver, deadline: Option<Instant>) -> io::Result<()> {
        if self.nonblocking {
            let e = self.would_block_reading(d);
            if d.conn.has_unread() || read_end(d).is_some() {
                return Ok(());
            }
            return Err(e);
        }
        if !d.conn.nodelay() {
            d.conn.flush();
        }
        // A read after this side wrote waits for an answer: the adaptive spin's whole limit.
        let answer = d.awaits_answer();
        self.wait(d, deadline, answer, "read", self.read_timeout, |c| {
            c.has_unread() || c.is_eof()
        })
    }

    /// The send buffer is full: in non-blocking mode `WouldBlock` (after arming the fd)
    /// unless room turned up meanwhile; else waits for room. `Ok` means: look again.
    fn wait_writable(&self, d: &mut Driver, deadline: Option<Instant>) -> io::Result<()> {
        if self.nonblocking {
            let e = self.would_block(d);
            if d.conn.is_writable() {
                return Ok(());
            }
            return Err(e);
        }
        self.wait(d, deadline, false, "write", self.write_timeout, |c| {
            c.is_writable()
        })
    }

    /// Sends `msg` as one message: the peer's [`recv_msg`](Self::recv_msg) returns exactly
    /// these bytes. A message larger than the peer's ring is carried in pieces.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `msg` is larger than the peer accepts, or (non-blocking) larger
    /// than the send buffer; `WouldBlock` (non-blocking) when the send buffer cannot take
    /// all of it now; the connection's error.
    pub fn send_msg(&mut self, msg: &[u8]) -> io::Result<()> {
        if msg.len() as u64 > u64::from(self.peer_max_message) {
            return Err(io_err(Error::InvalidInput(format!(
                "a message of {} bytes is larger than the peer accepts ({} bytes)",
                msg.len(),
                self.peer_max_message
            ))));
        }
        let deadline = self.deadline(self.write_timeout);
        let nonblocking = self.nonblocking;
        if nonblocking && msg.len() as u64 > u64::from(self.send_buffer) {
            return Err(io_err(Error::InvalidInput(format!(
                "a message of {} bytes cannot be sent without blocking through a send buffer of {} bytes; raise Config::send_buffer or use blocking mode",
                msg.len(),
                self.send_buffer
            ))));
        }
        let mut d = self.lock();
        if nonblocking {
            d.pump_fast(Instant::now());
            write_check(&d)?;
            if d.conn.send_free() < msg.len() as u64 || !d.conn.is_writable() {
                // The room frees as the writes in flight complete: make sure the newest
                // asks for its completion, or nothing would wake the caller.
                d.conn.request_signal();
                d.flush_posts();
                return Err(self.would_block(&mut d));
            }
        }
        write_check(&d)?;
        while !d.conn.is_writable() {
            self.wait(&mut d, deadline, false, "write", self.write_timeout, |c| {
                c.is_writable()
            })?;
            write_check(&d)?;
        }
        d.conn.begin_message().map_err(|e| io_err(e.into()))?;
        let mut sent = 0;
        loop {
            write_check(&d)?;
            let (offset, room) = d.conn.send_window();
            if room > 0 || (msg.len() == sent && d.conn.is_writable()) {
                let n = (msg.len() - sent).min(room as usize);
                if n > 0 {
                    d.staging_mut()
                        .write_at(offset as usize, &msg[sent..sent + n])
                        .map_err(|e| io_err(Error::verbs("copying into the send buffer", e)))?;
                }
                sent += n;
                let last = sent == msg.len();
                d.conn
                    .commit_send(n as u32, last)
                    .map_err(|e| io_err(e.into()))?;
                d.flush_posts();
                if last {
                    return Ok(());
                }
                continue;
            }
            if let Err(e) = self.wait(&mut d, deadline, false, "write", self.write_timeout, |c| {
                c.is_writable()
            }) {
                if e.kind() == io::ErrorKind::TimedOut {
                    // The message is open in the send buffer and cannot be finished or
                    // taken back: the connection cannot carry anything further.
                    d.conn.on_local_error(format!(
                        "send_msg timed out after {sent} of {} bytes; the message cannot be completed",
                        msg.len()
                    ));
                }
                return Err(e);
            }
        }
    }

    /// Receives the next message into `buf` (cleared first; its capacity is reused) and
    /// returns its length, or `None` at end of stream (the peer shut its write side down
    /// and every message before was read).
    ///
    /// # Errors
    ///
    /// `WouldBlock` (non-blocking) while no whole message is there, `TimedOut` after the
    /// read timeout, the connection's error.
    pub fn recv_msg(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<usize>> {
        let deadline = self.deadline(self.read_timeout);
        buf.clear();
        if self.read_shut {
            return Ok(None);
        }
        // Nothing of a message is held yet: the message goes into the caller's allocation
        // (a lent region is fetched straight into it).
        let caller_alloc = self.partial.is_empty();
        if caller_alloc {
            std::mem::swap(buf, &mut self.partial);
        }
        let mut partial = std::mem::take(&mut self.partial);
        let result = self.recv_msg_into(&mut partial, deadline);
        match result {
            Ok(Some(n)) => {
                std::mem::swap(buf, &mut partial);
                partial.clear();
                self.partial = partial;
                Ok(Some(n))
            }
            other => {
                if caller_alloc && partial.is_empty() {
                    // Nothing held: the caller keeps its allocation for the next call.
                    std::mem::swap(buf, &mut partial);
                }
                self.partial = partial;
                other
            }
        }
    }

    fn recv_msg_into(
        &mut self,
        partial: &mut Vec<u8>,
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        let mut d = self.lock();
        loop {
            let w = d.conn.recv_window();
            if partial.is_empty() && (w.lent || d.conn.fetching().is_some()) {
                self.fetch_lent(&mut d, partial, deadline)?;
                d.flush_posts();
                return Ok(Some(partial.len()));
            }
            if w.len > 0 || w.ends_message {
                let at = partial.len();
                if (at + w.len as usize) as u64 > u64::from(self.max_message) {
                    // Stream bytes before a message (the peer mixed the two) count too: no
                    // peer makes this side hold more than it advertised.
                    let e = ConnError::Protocol(format!(
                        "a message of more than {} bytes (stream bytes before it included)",
                        self.max_message
                    ));
                    d.conn.on_peer_fault(format!(
                        "a message of more than {} bytes (stream bytes before it included)",
                        self.max_message
                    ));
                    return Err(io_err(Error::Connection(e)));
                }
                partial.resize(at + w.len as usize, 0);
                d.ring()
                    .read_at(w.offset as usize, &mut partial[at..])
                    .map_err(|e| io_err(Error::verbs("copying from the receive ring", e)))?;
                d.conn.consume_message(w.len, w.ends_message);
                if w.ends_message {
                    d.flush_posts();
                    return Ok(Some(partial.len()));
                }
                continue;
            }
            if let Some(r) = read_end(&d) {
                return r.map(|()| None);
            }
            if d.pump_fast(Instant::now()) {
                continue;
            }
            self.wait_readable(&mut d, deadline)?;
        }
    }

    /// The message at the head of the stream is a lent region (or its fetch runs): fetch it,
    /// beginning with `target`'s allocation when no fetch runs yet, and leave its bytes in
    /// `target`. In non-blocking mode `WouldBlock` while the READs are on their way (the
    /// fetch goes on; a later call finishes it).
    fn fetch_lent(
        &self,
        d: &mut Driver,
        target: &mut Vec<u8>,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        if d.conn.fetching().is_none() {
            d.begin_fetch(std::mem::take(target)).map_err(io_err)?;
        }
        loop {
            if let Some(v) = d.take_fetched().map_err(io_err)? {
                *target = v;
                return Ok(());
            }
            if let Some(e) = d.conn.error().or(d.conn.broken()) {
                return Err(io_err(Error::Connection(e.clone())));
            }
            if d.pump_fast(Instant::now()) {
                continue;
            }
            if self.nonblocking {
                let e = self.would_block(d);
                if d.conn.fetch_done() {
                    continue;
                }
                return Err(e);
            }
            self.wait(d, deadline, false, "read", self.read_timeout, |c| {
                c.fetch_done()
            })?;
        }
    }

    /// Lends `buf` to the peer as one message, without copying it: the peer's
    /// [`recv_msg`](Self::recv_msg) (or `read`) receives exactly its bytes, fetched with
    /// RDMA READ straight from `buf`'s memory into its own buffer. The call returns once the
    /// message is on its way; the buffer comes back through [`reclaim`](Self::reclaim)
    /// after the peer fetched it, and only then: until that moment the peer may read it,
    /// and afterwards the key it was given opens nothing (the buffer's registration, made
    /// for this transfer alone, is gone).
    ///
    /// Worth it for large messages (hundreds of KiB and up): registering and deregistering
    /// the buffer costs system calls that a copy of a small message does not. The peer
    /// must be a trespass with lending (every trespass since the protocol gained it; both
    /// hellos say so).
    ///
    /// # Errors
    ///
    /// A [`LendError`] with the buffer: `InvalidInput` for an empty buffer, one larger than
    /// the peer accepts, or when [`MAX_LENT`] buffers are lent and not reclaimed;
    /// `Unsupported` when the peer does not take lent buffers; `WouldBlock` (non-blocking)
    /// when the send buffer has no room for the descriptor; `TimedOut` after the write
    /// timeout; the connection's error.
    pub fn lend_msg(&mut self, buf: Vec<u8>) -> Result<(), LendError> {
        if buf.is_empty() {
            return Err(LendError::new(
                Error::InvalidInput(
                    "an empty buffer cannot be lent; send_msg(&[]) sends an empty message".into(),
                ),
                Some(buf),
            ));
        }
        if buf.len() as u64 > u64::from(self.peer_max_message) {
            let e = Error::InvalidInput(format!(
                "a message of {} bytes is larger than the peer accepts ({} bytes)",
                buf.len(),
                self.peer_max_message
            ));
            return Err(LendError::new(e, Some(buf)));
        }
        let deadline = self.deadline(self.write_timeout);
        let mut d = self.lock();
        if !d.conn.can_lend() {
            let e = Error::Unsupported(
                "the peer does not take lent buffers (an older trespass, or a device without RDMA READ); use send_msg",
            );
            return Err(LendError::new(e, Some(buf)));
        }
        let lent = d.lent_count();
        if lent >= MAX_LENT {
            let e = Error::InvalidInput(format!(
                "{lent} buffers are lent on this connection and not reclaimed (at most {MAX_LENT}); call reclaim first"
            ));
            return Err(LendError::new(e, Some(buf)));
        }
        // Room for the whole descriptor, before anything is done.
        loop {
            d.pump_fast(Instant::now());
            if let Err(e) = write_check(&d) {
                return Err(LendError::new(e, Some(buf)));
            }
            if lend_room(&d.conn) {
                break;
            }
            d.conn.request_signal();
            d.flush_posts();
            if self.nonblocking {
                let e = self.would_block(&mut d);
                if lend_room(&d.conn) {
                    continue;
                }
                return Err(LendError::new(e, Some(buf)));
            }
            if let Err(e) = self.wait(
                &mut d,
                deadline,
                false,
                "write",
                self.write_timeout,
                lend_room,
            ) {
                return Err(LendError::new(e, Some(buf)));
            }
        }
        let desc = match d.lend(buf) {
            Ok(desc) => desc.encode(),
            Err(failed) => {
                let (e, buf) = *failed;
                return Err(LendError::new(e, Some(buf)));
            }
        };
        if let Err(e) = d.conn.begin_lend() {
            // Checked above; should it happen, the buffer is in the lent queue for good.
            return Err(LendError::new(Error::Connection(e), None));
        }
        let mut sent = 0;
        while sent < LEND_LEN {
            let (offset, room) = d.conn.send_window();
            let n = (LEND_LEN - sent).min(room as usize);
            if n == 0 {
                // The room was counted before the lend began.
                d.conn
                    .on_local_error("no room for a lent buffer's descriptor".into());
                return Err(LendError::new(write_check(&d).unwrap_err(), None));
            }
            if let Err(e) = d
                .staging_mut()
                .write_at(offset as usize, &desc[sent..sent + n])
            {
                d.conn.on_local_error(format!("copying a descriptor: {e}"));
                return Err(LendError::new(
                    Error::verbs("copying a descriptor", e),
                    None,
                ));
            }
            sent += n;
            if let Err(e) = d.conn.commit_send(n as u32, sent == LEND_LEN) {
                return Err(LendError::new(Error::Connection(e), None));
            }
        }
        d.flush_posts();
        Ok(())
    }

    /// Takes back the oldest buffer lent with [`lend_msg`](Self::lend_msg), waiting until
    /// the peer fetched it (its bytes unchanged, its length as lent). Buffers come back in
    /// the order they were lent.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when no buffer is lent; `WouldBlock` (non-blocking) while the peer
    /// has not returned it; `TimedOut` after the write timeout; the connection's error:
    /// a buffer the peer never returned stays with the connection (registered, so the
    /// peer's key still opens it, until the connection is dropped; then it is freed).
    pub fn reclaim(&mut self) -> io::Result<Vec<u8>> {
        let deadline = self.deadline(self.write_timeout);
        let mut d = self.lock();
        loop {
            if let Some(v) = d.reclaimed.pop_front() {
                return Ok(v);
            }
            if d.lent_count() == 0 {
                return Err(io_err(Error::InvalidInput(
                    "no buffer is lent on this connection".into(),
                )));
            }
            if let Some(e) = d.conn.error().or(d.conn.broken()) {
                return Err(io_err(Error::Connection(e.clone())));
            }
            if d.pump_fast(Instant::now()) {
                continue;
            }
            if self.nonblocking {
                let e = self.would_block(&mut d);
                if !d.reclaimed.is_empty() {
                    continue;
                }
                return Err(e);
            }
            let seen = d.conn.returned_total();
            self.wait(&mut d, deadline, false, "write", self.write_timeout, |c| {
                c.returned_total() > seen
            })?;
        }
    }

    /// Buffers lent with [`lend_msg`](Self::lend_msg) and not yet taken back with
    /// [`reclaim`](Self::reclaim).
    pub fn lent(&self) -> usize {
        self.lock().lent_count()
    }

    /// Bytes waiting to be read, without reading them (may be less than will arrive).
    pub fn has_unread(&self) -> bool {
        self.lock().conn.has_unread()
    }

    /// A handle through which other threads can read and write this connection's byte
    /// stream without waiting: see [`TryHandle`].
    pub fn try_handle(&self) -> TryHandle {
        TryHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Pumps the connection for at most `d` (busy polling, no sleep) until it can be read
    /// (`read`) or written, or has failed. True when it can; false when the time ran out.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn spin_until_ready(&self, d: Duration, want: Want) -> bool {
        if d.is_zero() {
            return false;
        }
        let mut drv = self.lock();
        let start = Instant::now();
        let end = start + d;
        drv.pump_fast(start);
        loop {
            if ready_for(&drv, want) {
                return true;
            }
            if !drv.spin_for_progress(end) {
                return false;
            }
        }
    }

    /// Whether the owner (the tokio front end) has a task parked waiting to write (see
    /// [`TryHandle::wait_readable`]).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn set_owner_writes(&self, parked: bool) {
        self.shared.owner_writes.store(parked, Ordering::Release);
    }

    /// Stream bytes unread in the ring (and in a message `recv_msg` had begun), without
    /// pumping.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn unread_len(&self) -> usize {
        let d = self.lock();
        let mut n = self.partial.len() as u64;
        let w = d.conn.recv_window();
        n += u64::from(w.len);
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// True when a read (`read`) or a write would not block now: bytes or the end are
    /// there, or room in the send buffer, or the connection failed.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn is_ready(&self, want: Want) -> bool {
        ready_for(&self.lock(), want)
    }

    /// True when dropping the stream will not linger: the FIN completed, or the connection
    /// failed (nothing more can complete).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn close_is_quick(&self) -> bool {
        let mut drv = self.lock();
        drv.pump_fast(Instant::now());
        let c = &drv.conn;
        c.fin_done() || c.error().is_some() || c.broken().is_some()
    }
}

/// `timeout`, unless it is zero (refused, as `TcpStream` refuses it).
fn nonzero_timeout(timeout: Option<Duration>, which: &str) -> io::Result<Option<Duration>> {
    if timeout == Some(Duration::ZERO) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a zero {which} timeout; use None for no limit"),
        ));
    }
    Ok(timeout)
}

/// True when a read (`read`) or a write on `c` would not block: bytes or the end are there,
/// or room in the send buffer, or the connection failed.
fn ready_for(d: &Driver, want: Want) -> bool {
    let c = &d.conn;
    let ready = match want {
        Want::Read => c.has_unread() || c.is_eof(),
        Want::Write => c.is_writable(),
        Want::Lend => lend_room(c),
        Want::Reclaim => !d.reclaimed.is_empty() || d.lent_count() == 0,
    };
    ready || c.error().is_some() || c.broken().is_some()
}

/// Room for a lent buffer's whole descriptor in the send buffer.
fn lend_room(c: &Connection) -> bool {
    c.is_writable() && c.send_free() >= LEND_LEN as u64
}

/// What a caller of [`Stream::spin_until_ready`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "tokio"), allow(dead_code))]
pub(crate) enum Want {
    /// Bytes, a message or the end (`read`, `recv_msg`).
    Read,
    /// Room in the send buffer (`write`, `send_msg`).
    Write,
    /// Room for a lent buffer's descriptor (`lend_msg`).
    Lend,
    /// A lent buffer back, or none lent (`reclaim`).
    Reclaim,
}

/// Fails when nothing more can be written.
fn write_check(d: &Driver) -> io::Result<()> {
    if let Some(e) = d.conn.error() {
        return Err(io_err(Error::Connection(e.clone())));
    }
    if let Some(e) = d.conn.broken() {
        return Err(io_err(Error::Connection(e.clone())));
    }
    if d.conn.write_shut() {
        return Err(io_err(Error::WriteClosed("shut down for writing")));
    }
    Ok(())
}

/// Copies the stream bytes in the ring into `buf` (skipping the empty records of ended
/// messages), up to a region the peer lent, and posts what reading them freed. Returns how
/// many; 0 when none are there, or the next are a lent region's ([`at_lent`]).
fn read_ring(d: &mut Driver, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let w = d.conn.recv_window();
        if w.lent || d.conn.fetching().is_some() {
            break;
        }
        if w.len == 0 {
            if w.ends_message {
                d.conn.consume(0);
                continue;
            }
            break;
        }
        let take = (buf.len() - n).min(w.len as usize);
        d.ring()
            .read_at(w.offset as usize, &mut buf[n..n + take])
            .map_err(|e| io_err(Error::verbs("copying from the receive ring", e)))?;
        d.conn.consume(take as u32);
        n += take;
    }
    if n > 0 {
        d.flush_posts();
    }
    Ok(n)
}

/// Whether the next bytes are a region the peer lent (fetched with an RDMA READ), or one
/// is being fetched.
fn at_lent(d: &Driver) -> bool {
    d.conn.recv_window().lent || d.conn.fetching().is_some()
}

/// Copies as much of `buf` as the send buffer has room for, commits it and posts; `None`
/// when there is no room. The caller checked the connection can be written.
fn write_staging(d: &mut Driver, buf: &[u8]) -> io::Result<Option<usize>> {
    let (offset, room) = d.conn.send_window();
    if room == 0 {
        return Ok(None);
    }
    let n = buf.len().min(room as usize);
    d.staging_mut()
        .write_at(offset as usize, &buf[..n])
        .map_err(|e| io_err(Error::verbs("copying into the send buffer", e)))?;
    d.conn
        .commit_send(n as u32, false)
        .map_err(|e| io_err(e.into()))?;
    d.flush_posts();
    Ok(Some(n))
}

/// Copies as much of `bufs` as the send window has room for into the send buffer and
/// commits it, without posting: the bytes copied.
fn stage_vectored(d: &mut Driver, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    let mut done = 0;
    for b in bufs {
        let mut off = 0;
        while off < b.len() {
            let (offset, room) = d.conn.send_window();
            if room == 0 {
                return Ok(done);
            }
            let n = (b.len() - off).min(room as usize);
            let staged = d
                .staging_mut()
                .write_at(offset as usize, &b[off..off + n])
                .map_err(|e| io_err(Error::verbs("copying into the send buffer", e)))
                .and_then(|()| {
                    d.conn
                        .commit_send(n as u32, false)
                        .map_err(|e| io_err(e.into()))
                });
            match staged {
                Ok(()) => {}
                // What was committed before goes out: say so, not the error (the next call
                // sees it), or the caller would write those bytes again.
                Err(_) if done > 0 => return Ok(done),
                Err(e) => return Err(e),
            }
            off += n;
            done += n;
        }
    }
    Ok(done)
}

/// When nothing is unread: `Some(Ok)` at end of stream, `Some(Err)` when the connection
/// failed, `None` while more may come.
fn read_end(d: &Driver) -> Option<io::Result<()>> {
    if let Some(e) = d.conn.error() {
        return Some(Err(io_err(Error::Connection(e.clone()))));
    }
    if d.conn.is_eof() {
        return Some(Ok(()));
    }
    if let Some(e) = d.conn.broken() {
        return Some(Err(io_err(Error::Connection(e.clone()))));
    }
    None
}

/// A second way into a [`Stream`]'s connection, for threads other than the one that waits
/// on it: [`try_read`](Self::try_read) and [`try_write`](Self::try_write) take what is there
/// now (bytes in the receive ring, room in the send buffer, after one look at the completion
/// queue) and never wait, never arm the readiness fd and never consume its events. So a
/// stream's owner (a blocking caller, or its tokio front end, which waits on the readiness
/// fd) is never robbed of the wake-up it waits for; at worst it wakes, finds the bytes taken,
/// and waits again. Every call is atomic with the owner's: both take the connection's lock.
///
/// What the handle does not see is the owner's own state: a message
/// [`recv_msg`](Stream::recv_msg) has begun, and a [`shutdown`](Stream::shutdown) of the
/// read side (the write side's is the connection's, and seen). Bytes of a region the peer
/// lent (which are fetched with an RDMA READ, a wait) are left to the owner too: the handle
/// says `WouldBlock` before them. It keeps the connection's resources alive while it
/// lives, but does not keep the connection open: dropping the [`Stream`] closes it, after
/// which the handle's calls fail.
#[derive(Clone)]
pub struct TryHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TryHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TryHandle").finish_non_exhaustive()
    }
}

impl AsFd for TryHandle {
    /// The stream's readiness fd (as [`Stream`]'s): readable when something arrived. A
    /// thread that waits on it shares the wake-up with the owner, who may take the bytes
    /// first; only the owner's waits drain it.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.readiness.as_fd()
    }
}

impl TryHandle {
    fn lock(&self) -> MutexGuard<'_, Driver> {
        self.shared.driver.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the stream bytes that are there now into `buf`.
    ///
    /// # Errors
    ///
    /// `WouldBlock` when no byte is there (or the next are a lent region's); the
    /// connection's error when it failed. End of stream is `Ok(0)`, as for [`Read`].
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut d = self.lock();
        let mut pumped = false;
        loop {
            let n = read_ring(&mut d, buf)?;
            if n > 0 {
                return Ok(n);
            }
            if at_lent(&d) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if let Some(r) = read_end(&d) {
                return r.map(|()| 0);
            }
            if pumped || !d.pump_fast(Instant::now()) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            pumped = true;
        }
    }

    /// Waits for bytes (or the end, or a failure) in the owner's place, for at most
    /// `timeout`, or until `also` turns readable.
    ///
    /// A thread that waits on the [readiness fd](AsFd) shares every wake-up with the owner:
    /// both wake, one finds the bytes. This wait takes the completion channel instead: while
    /// it lasts, completions wake this thread and not the owner, which is what a reader that
    /// stands in for the owner wants (one thread woken per arrival, not two). It is for an
    /// owner that does not hold the connection while it waits (the [tokio front
    /// end](crate::tokio::Stream)): an owner that goes to sleep meanwhile takes the channel
    /// back at once (the wait then ends as [`ReadWaited::Declined`]), and one with a task
    /// waiting to write is never robbed of the credits it waits for (the wait declines
    /// before it begins).
    ///
    /// What it returns says how the wait ended; read with [`try_read`](Self::try_read)
    /// while holding it. Dropping it hands whatever is still unread, and the end of the
    /// connection, back to the owner (its readiness fd turns readable), so bytes this wait
    /// took in are never stranded where only a reader that does not come would see them.
    ///
    /// ```no_run
    /// use std::io::ErrorKind;
    /// use std::os::fd::AsFd;
    /// use std::time::Duration;
    ///
    /// # fn demo(handle: &trespass::TryHandle, other: &std::net::TcpStream) -> std::io::Result<usize> {
    /// let mut buf = [0u8; 4096];
    /// // The last wait lives until the read after it is done: dropping it hands what that
    /// // read leaves to the owner.
    /// let mut _wait = None;
    /// loop {
    ///     match handle.try_read(&mut buf) {
    ///         Err(e) if e.kind() == ErrorKind::WouldBlock => {}
    ///         done => return done,
    ///     }
    ///     _wait = None;
    ///     let wait = handle.wait_readable(other.as_fd(), Duration::from_millis(20))?;
    ///     if wait.outcome() == trespass::ReadWaited::Declined {
    ///         // Wait on `handle.as_fd()` (shared with the owner) instead.
    ///     }
    ///     _wait = Some(wait);
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A failed `poll`. Signals end the wait as [`ReadWaited::Interrupted`].
    pub fn wait_readable(&self, also: BorrowedFd<'_>, timeout: Duration) -> io::Result<ReadWait> {
        let deadline = Instant::now() + timeout;
        let mut wait = ReadWait {
            handle: self.clone(),
            outcome: ReadWaited::Declined,
        };
        if ready_for(&self.lock(), Want::Read) {
            wait.outcome = ReadWaited::Ready;
            return Ok(wait);
        }
        let Some(mut standing) = self.stand_in() else {
            return Ok(wait);
        };
        let result = loop {
            match standing.arm() {
                Standing::Revoked => break Ok(ReadWaited::Declined),
                Standing::Ready => break Ok(ReadWaited::Ready),
                Standing::Waiting => {}
            }
            let now = Instant::now();
            if now >= deadline {
                break Ok(ReadWaited::TimedOut);
            }
            let polled = crate::readiness::poll_two(
                standing.as_fd().as_raw_fd(),
                also.as_raw_fd(),
                deadline - now,
            );
            match polled {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    break Ok(ReadWaited::Interrupted)
                }
                Err(e) => break Err(e),
                Ok((cq_ready, also_ready)) => {
                    if standing.woke(cq_ready) == Standing::Ready {
                        break Ok(ReadWaited::Ready);
                    }
                    if also_ready {
                        break Ok(ReadWaited::Also);
                    }
                }
            }
        };
        drop(standing);
        wait.outcome = result?;
        Ok(wait)
    }

    /// Begins a wait in the owner's place that the caller drives with its own `poll`, for
    /// a caller that waits on several streams (or on many fds) at once: what
    /// [`wait_readable`](Self::wait_readable) does for one stream and one other fd.
    ///
    /// While the returned [`StandIn`] lives, this stream's completions wake whoever polls
    /// [its fd](StandIn::as_fd) (for `POLLIN`) and not the owner. Before each sleep call
    /// [`arm`](StandIn::arm), after it [`woke`](StandIn::woke); drop it when the wait is
    /// over, which gives the stream back to the owner. Unlike [`ReadWait`], dropping it
    /// does not hand unread bytes to the owner: a caller that reports them to a reader
    /// calls [`hand_back`](Self::hand_back) once that reader had its chance (after its
    /// read, or when it turned elsewhere), so that bytes are never stranded.
    ///
    /// `None` when the wait cannot begin: another thread is waiting in the owner's place,
    /// the owner is waiting to write, or receives complete on the shared pool. Wait on the
    /// [readiness fd](AsFd) then.
    pub fn stand_in(&self) -> Option<StandIn> {
        let mut d = self.lock();
        if self.shared.owner_writes.load(Ordering::Acquire)
            || !d.begin_tenure(&self.shared.readiness)
        {
            return None;
        }
        Some(StandIn {
            handle: self.clone(),
        })
    }

    /// Whether [`try_read`](Self::try_read) would return bytes now (not the end, not a
    /// failure: those the owner carries).
    pub fn has_bytes(&self) -> bool {
        let d = self.lock();
        d.conn.has_unread() && !at_lent(&d)
    }

    /// Gives what a reader left to the owner: when bytes, the end or a failure are there,
    /// the owner's [readiness fd](AsFd) turns readable, so it carries them on. What
    /// dropping a [`ReadWait`] does; for callers of [`stand_in`](Self::stand_in).
    pub fn hand_back(&self) {
        let d = self.lock();
        if ready_for(&d, Want::Read) {
            self.shared.readiness.notify();
        }
    }

    /// Writes as much of `bufs`, in order, as the send buffer has room for now, and posts
    /// it at once: bytes that arrive in several buffers leave as one write where they fit,
    /// as a `writev` on a TCP socket leaves as one segment.
    ///
    /// # Errors
    ///
    /// As [`try_write`](Self::try_write).
    pub fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        self.try_staging(|d| {
            let n = stage_vectored(d, bufs)?;
            if n == 0 {
                return Ok(None);
            }
            d.flush_posts();
            Ok(Some(n))
        })
    }

    /// The writes' loop: `stage` copies what fits (`None`: no room); with no room, one pump
    /// (completions may free some) and one more try, else `WouldBlock`.
    fn try_staging(
        &self,
        mut stage: impl FnMut(&mut Driver) -> io::Result<Option<usize>>,
    ) -> io::Result<usize> {
        let mut d = self.lock();
        let mut pumped = false;
        loop {
            write_check(&d)?;
            if let Some(n) = stage(&mut d)? {
                return Ok(n);
            }
            if pumped || !d.pump_fast(Instant::now()) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            pumped = true;
        }
    }

    /// Writes as much of `buf` as the send buffer has room for now.
    ///
    /// # Errors
    ///
    /// `WouldBlock` when there is no room; the connection's error when it failed or was
    /// shut down for writing.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.try_staging(|d| write_staging(d, buf))
    }
}

/// How a [`TryHandle::wait_readable`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadWaited {
    /// Bytes, the end or a failure are there: [`TryHandle::try_read`] says which.
    Ready,
    /// The other fd turned readable (or hung up, or failed).
    Also,
    /// The timeout passed.
    TimedOut,
    /// A signal interrupted the wait.
    Interrupted,
    /// The wait did not take the channel, or gave it back to the owner before anything
    /// arrived: another thread is waiting in the owner's place, the owner is waiting to
    /// write or went to sleep, or receives complete on the shared pool. Wait on the
    /// readiness fd instead.
    Declined,
}

/// The end of a [`TryHandle::wait_readable`]: how it ended, and, when dropped, the
/// unread bytes and the end of the connection handed back to the owner.
#[derive(Debug)]
#[must_use = "read while holding it: dropping it hands the unread bytes to the owner"]
pub struct ReadWait {
    handle: TryHandle,
    outcome: ReadWaited,
}

impl ReadWait {
    /// How the wait ended.
    pub fn outcome(&self) -> ReadWaited {
        self.outcome
    }
}

impl Drop for ReadWait {
    fn drop(&mut self) {
        self.handle.hand_back();
    }
}

/// A wait in a stream owner's place, driven by the caller's own `poll`: see
/// [`TryHandle::stand_in`].
#[derive(Debug)]
#[must_use = "dropping it gives the stream back to the owner at once"]
pub struct StandIn {
    handle: TryHandle,
}

/// Where a [`StandIn`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Standing {
    /// Bytes, the end or a failure are there: [`TryHandle::try_read`] says which.
    Ready,
    /// Nothing yet: poll [`StandIn::as_fd`].
    Waiting,
    /// The owner took the stream back (it went to sleep): its completions wake the owner
    /// again, who carries what comes. Stop polling this stream's fd.
    Revoked,
}

impl StandIn {
    /// Before a sleep: arms the completion queue and looks once more (a completion that came
    /// before the arming raises no event).
    pub fn arm(&mut self) -> Standing {
        let mut d = self.handle.lock();
        if d.tenure_revoked() {
            return Standing::Revoked;
        }
        d.tenure_arm();
        if ready_for(&d, Want::Read) {
            Standing::Ready
        } else {
            Standing::Waiting
        }
    }

    /// Where it stands now, without a system call: for a caller that keeps a stand-in
    /// across several of its own waits and arms it only after an event (an armed completion
    /// queue raises one event for the first completion that carries bytes or the end; until
    /// then there is nothing new to look for). Bytes that came before the last arming, and
    /// were not read since, show as [`Standing::Ready`]; a stream the owner took back as
    /// [`Standing::Revoked`].
    pub fn standing(&self) -> Standing {
        standing(&self.handle.lock())
    }

    /// After a sleep: takes the completion event if the sleep saw one on [this
    /// fd](Self::as_fd) (`event`), and looks.
    pub fn woke(&mut self, event: bool) -> Standing {
        let mut d = self.handle.lock();
        d.tenure_woke(event);
        standing(&d)
    }
}

/// Where a stand-in on `d` stands: bytes (or the end, or a failure) first, then whether the
/// owner took the stream back.
fn standing(d: &Driver) -> Standing {
    if ready_for(d, Want::Read) {
        Standing::Ready
    } else if d.tenure_revoked() {
        Standing::Revoked
    } else {
        Standing::Waiting
    }
}

impl AsFd for StandIn {
    /// The stream's completion channel: readable (`POLLIN`) when a completion came.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.handle.shared.readiness.cq_borrowed()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let mut d = self.handle.lock();
        let owner_writes = self.handle.shared.owner_writes.load(Ordering::Acquire);
        d.end_tenure(&self.handle.shared.readiness, owner_writes);
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.read_shut {
            return Ok(0);
        }
        if !self.partial.is_empty() {
            // Bytes of a message that recv_msg had begun: a stream read takes them first.
            let n = buf.len().min(self.partial.len());
            buf[..n].copy_from_slice(&self.partial[..n]);
            self.partial.drain(..n);
            return Ok(n);
        }
        let deadline = self.deadline(self.read_timeout);
        let mut d = self.lock();
        loop {
            let n = read_ring(&mut d, buf)?;
            if n > 0 {
                return Ok(n);
            }
            if at_lent(&d) {
                // A lent region: fetched whole (into the held-message buffer, which is
                // empty here), then read from there like a message recv_msg began.
                let mut partial = Vec::new();
                self.fetch_lent(&mut d, &mut partial, deadline)?;
                d.flush_posts();
                drop(d);
                self.partial = partial;
                let n = buf.len().min(self.partial.len());
                buf[..n].copy_from_slice(&self.partial[..n]);
                self.partial.drain(..n);
                return Ok(n);
            }
            if let Some(r) = read_end(&d) {
                return r.map(|()| 0);
            }
            if d.pump_fast(Instant::now()) {
                continue;
            }
            self.wait_readable(&mut d, deadline)?;
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = self.deadline(self.write_timeout);
        let mut d = self.lock();
        loop {
            write_check(&d)?;
            if let Some(n) = write_staging(&mut d, buf)? {
                return Ok(n);
            }
            if d.pump_fast(Instant::now()) {
                continue;
            }
            self.wait_writable(&mut d, deadline)?;
        }
    }

    /// Posts every byte held back by coalescing (`nodelay` off). Like `TcpStream::flush`
    /// it does not wait for the peer.
    fn flush(&mut self) -> io::Result<()> {
        let mut d = self.lock();
        d.conn.flush();
        d.flush_posts();
        if let Some(e) = d.conn.error() {
            return Err(io_err(Error::Connection(e.clone())));
        }
        Ok(())
    }
}

impl AsFd for Stream {
    /// An epoll fd over the connection's completion channel and rdma_cm channel: readable
    /// when a completion (data, credits, a close) or a connection event arrived. Use it
    /// after `WouldBlock`: calls arm it before returning `WouldBlock`.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.readiness.as_fd()
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.readiness.as_fd().as_raw_fd()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let linger = self.linger;
        let mut d = self.lock();
        d.close(&self.shared.readiness, linger);
    }
}

impl From<ConnError> for io::Error {
    fn from(e: ConnError) -> io::Error {
        Error::Connection(e).into()
    }
}
