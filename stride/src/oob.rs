//! The out-of-band channel: a TCP connection over which the two sides agree on the test,
//! trade queue-pair endpoints, synchronise, and hand over results.
//!
//! Every message is framed as `STRD`, a protocol version (u16, big-endian), a payload length
//! (u32, big-endian, at most [`MAX_PAYLOAD`]) and a JSON payload. A peer that is not
//! stride-perf, speaks another protocol version, or sends garbage is refused with a message
//! that says so; every read after the connection is up waits at most the channel's timeout,
//! so a peer that dies mid-run is an error, not a hang.
//!
//! Bytes are gathered into a reassembly buffer that never holds more than one frame, and a
//! frame is decoded only once it is whole. The measured loops' look at the channel
//! ([`OobChannel::peer_spoke`]) reads only what has already arrived, so a peer that sends part
//! of a frame cannot stall them; the rest of a begun frame must come within [`FRAME_LIMIT`]
//! (the peer writes each frame at once), or the run ends with an error naming the bytes.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::params::TestParams;
use crate::preflight::PortProfile;
use crate::report::SideReport;
use sideway::peer_text::{printable, PEER_TEXT_MAX};

/// Frame magic.
pub const MAGIC: &[u8; 4] = b"STRD";
/// Protocol version; bumped whenever a message changes.
pub const VERSION: u16 = 2;
/// Largest payload accepted, to refuse garbage early.
pub const MAX_PAYLOAD: u32 = 1 << 20;
/// How long the rest of a frame may take once its first bytes came.
pub const FRAME_LIMIT: Duration = Duration::from_secs(5);
/// A frame's header: the magic, the version and the payload length.
const HEADER_LEN: usize = 10;
/// The most bytes one read asks for.
const READ_CHUNK: usize = 64 << 10;
/// The most lines of a refusal shown (the two sides agree on a dozen settings).
pub const MISMATCH_LINES_MAX: usize = 32;

/// One queue pair's address, for the peer to connect to and to target with RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpEndpoint {
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// GID, 16 bytes in network order.
    pub gid: [u8; 16],
    /// Remote key of the buffer RDMA operations target.
    pub rkey: u32,
    /// Address of that buffer.
    pub addr: u64,
    /// The sender's active MTU in bytes (the two sides use the smaller).
    pub mtu: u32,
    /// With `-c DC`, on the side the peer's operations reach: the DC target of this QP
    /// index, which every request of the peer's must name. Absent otherwise (and from
    /// versions without DC, which the handshake's agreement on `-c` keeps apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dc: Option<DcEndpoint>,
}

/// A DC target's address (`-c DC`): its DCT number and the access key that requests to it
/// must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DcEndpoint {
    /// The DCT number.
    pub dctn: u32,
    /// The DC access key.
    pub key: u64,
}

/// A message of the protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// The client's opening: its parameters.
    Hello {
        /// The client's test parameters.
        params: TestParams,
    },
    /// The server agrees.
    Agree,
    /// The server refuses: the parameters differ.
    Refuse {
        /// One line per setting that differs, from the server's point of view.
        mismatches: Vec<String>,
    },
    /// The sender's port, for the pre-flight diagnosis (protocol version 2).
    Preflight {
        /// The port's link layer, MTU and GIDs.
        profile: PortProfile,
    },
    /// The sender's queue pairs, one per QP in order.
    Endpoints {
        /// The endpoints.
        qps: Vec<QpEndpoint>,
    },
    /// The sender is ready for the next step (a barrier).
    Ready {
        /// What step the sender reached, so that both sides check they are in step.
        step: String,
    },
    /// The sender's results.
    Results {
        /// What the sender measured.
        report: SideReport,
    },
    /// The sender hit an error and stops; the receiver should stop too.
    Abort {
        /// Why.
        reason: String,
    },
}

impl Message {
    fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Agree => "agree",
            Message::Refuse { .. } => "refuse",
            Message::Preflight { .. } => "preflight",
            Message::Endpoints { .. } => "endpoints",
            Message::Ready { .. } => "ready",
            Message::Results { .. } => "results",
            Message::Abort { .. } => "abort",
        }
    }
}

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

/// The largest QP number, PSN and DCT number: they have 24 bits on the wire.
pub const MAX_24_BITS: u32 = (1 << 24) - 1;

/// The path MTUs in bytes, the only values a port's active MTU takes.
pub const PATH_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

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
        io::ErrorKind::ConnectionRefused => {
            format!("connection refused: is the server running, on port {port}? {start}")
        }
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
            "no answer within {}: the address routes nowhere or a firewall drops it; check \
             the address and -p {port}",
            show_wait(limit)
        ),
        _ => format!("{source} (is the server running, on port {port}? {start})"),
    }
}

/// Checks the peer's endpoints: `expected` of them, each buffer of `buffer_len` bytes ending
/// within the 64-bit address space.
pub fn check_endpoints(
    theirs: &[QpEndpoint],
    expected: usize,
    buffer_len: u64,
) -> Result<(), OobError> {
    if theirs.len() != expected {
        return Err(OobError::EndpointCount {
            sent: theirs.len(),
            expected,
        });
    }
    for (qp, ep) in theirs.iter().enumerate() {
        let over_24_bits = "over 24 bits (at most 16777215)";
        let mut fields = vec![("QP number", ep.qpn), ("PSN", ep.psn)];
        if let Some(dc) = ep.dc {
            fields.push(("DCT number", dc.dctn));
        }
        for (field, value) in fields {
            if value > MAX_24_BITS {
                return Err(OobError::EndpointField {
                    qp,
                    field,
                    value,
                    rule: over_24_bits,
                });
            }
        }
        if !PATH_MTUS.contains(&ep.mtu) {
            return Err(OobError::EndpointField {
                qp,
                field: "MTU",
                value: ep.mtu,
                rule: "which is not a path MTU (256, 512, 1024, 2048 or 4096)",
            });
        }
        if ep.addr.checked_add(buffer_len).is_none() {
            return Err(OobError::EndpointAddress {
                qp,
                addr: ep.addr,
                len: buffer_len,
            });
        }
    }
    Ok(())
}

/// The error for the server's refusal lines, which say "here" for the server and "peer"
/// for the client: turned round for either side's reader, made printable (a client's refusal
/// came from the server) and cut to [`MISMATCH_LINES_MAX`] lines.
pub fn mismatch_error(lines: &[String]) -> OobError {
    let mut shown: Vec<String> = lines
        .iter()
        .take(MISMATCH_LINES_MAX)
        .map(|m| {
            printable(
                &m.replace("here ", "server ").replace("peer ", "client "),
                PEER_TEXT_MAX,
            )
        })
        .collect();
    if lines.len() > MISMATCH_LINES_MAX {
        shown.push(format!(
            "... and {} more lines not shown",
            lines.len() - MISMATCH_LINES_MAX
        ));
    }
    OobError::Mismatch(shown)
}

/// A connected out-of-band channel.
#[derive(Debug)]
pub struct OobChannel {
    stream: TcpStream,
    timeout: Duration,
    /// The peer's address, for error messages.
    peer: String,
    /// A message [`OobChannel::peer_spoke`] read ahead, handed out by the next `recv`.
    pending: Option<Message>,
    /// The bytes of the next frame received so far: never more than one frame.
    partial: FrameBuffer,
    /// When the first of them came.
    partial_since: Option<Instant>,
    /// How long the rest of a begun frame may take: [`FRAME_LIMIT`] (shorter in tests).
    frame_limit: Duration,
    /// The read timeout the socket has now.
    read_wait: Duration,
}

/// How many more bytes the frame at the start of `buf` needs (0: it is whole); an error as
/// soon as its header shows it is not a frame of ours.
fn frame_needs(buf: &[u8]) -> Result<usize, OobError> {
    if buf.iter().zip(MAGIC).any(|(got, want)| got != want) {
        let head = buf.get(..MAGIC.len()).unwrap_or(buf);
        return Err(OobError::Garbage(format!(
            "the first bytes were \"{}\", not the stride-perf frame magic",
            printable(&String::from_utf8_lossy(head), PEER_TEXT_MAX)
        )));
    }
    let Some(&[_, _, _, _, v0, v1, l0, l1, l2, l3]) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(HEADER_LEN - buf.len());
    };
    let version = u16::from_be_bytes([v0, v1]);
    if version != VERSION {
        return Err(OobError::Version { peer: version });
    }
    let len = u32::from_be_bytes([l0, l1, l2, l3]);
    if len > MAX_PAYLOAD {
        return Err(OobError::Garbage(format!(
            "a {len}-byte message is too large"
        )));
    }
    // len <= MAX_PAYLOAD: the sum fits any usize.
    Ok((HEADER_LEN + len as usize).saturating_sub(buf.len()))
}

/// The frame a message travels in: the header, then the message as JSON.
pub fn encode_frame(msg: &Message) -> Result<Vec<u8>, OobError> {
    let payload = serde_json::to_vec(msg).map_err(|e| OobError::Io {
        what: "encoding a message".into(),
        source: io::Error::other(e),
    })?;
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= MAX_PAYLOAD)
        .ok_or_else(|| OobError::Garbage("a message of ours is too large".into()))?;
    let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&VERSION.to_be_bytes());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// The peer's byte stream cut back into frames: gathers the bytes of one frame at a time,
/// never more (a read asks for at most what the frame still needs), and decodes the frame
/// once it is whole. [`OobChannel`] reads through it; it holds no socket, so anything that
/// implements [`Read`] can feed it.
#[derive(Debug, Default)]
pub struct FrameBuffer {
    bytes: Vec<u8>,
}

impl FrameBuffer {
    /// An empty buffer, waiting for the first byte of a frame.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many more bytes the frame being gathered needs (0: it is whole, call
    /// [`FrameBuffer::take`]); an error as soon as the bytes show that it is not a frame of
    /// ours (wrong magic or version, a payload over [`MAX_PAYLOAD`]).
    pub fn needs(&self) -> Result<usize, OobError> {
        frame_needs(&self.bytes)
    }

    /// One read from `source` of at most `want` bytes (pass [`FrameBuffer::needs`]),
    /// appended to the frame; returns what the read returned.
    pub fn read_from(&mut self, source: &mut impl Read, want: usize) -> io::Result<usize> {
        let old = self.bytes.len();
        self.bytes.resize(old + want.min(READ_CHUNK), 0);
        let read = source.read(&mut self.bytes[old..]);
        let got = *read.as_ref().unwrap_or(&0);
        self.bytes.truncate(old + got);
        read
    }

    /// Decodes the whole frame gathered and empties the buffer for the next one, whether or
    /// not the frame decodes. A peer's `Abort` comes back as [`OobError::PeerAborted`].
    pub fn take(&mut self) -> Result<Message, OobError> {
        let decoded = serde_json::from_slice(self.bytes.get(HEADER_LEN..).unwrap_or_default());
        self.bytes.clear();
        // serde's messages quote what they could not decode, which is the peer's text.
        let msg: Message = decoded.map_err(|e| {
            OobError::Garbage(format!(
                "undecodable message: {}",
                printable(&e.to_string(), PEER_TEXT_MAX)
            ))
        })?;
        if let Message::Abort { reason } = msg {
            return Err(OobError::PeerAborted(printable(&reason, PEER_TEXT_MAX)));
        }
        Ok(msg)
    }

    /// How many bytes of the frame have come.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True when no byte of a frame has come.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes of the frame so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl OobChannel {
    /// Connects to a server (client side), waiting at most `timeout` for the connection.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Self, OobError> {
        let addr = format!("{host}:{port}");
        let fail = |source| OobError::Connect {
            addr: addr.clone(),
            port,
            limit: timeout,
            source,
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address");
        for sockaddr in (host, port).to_socket_addrs().map_err(fail)? {
            match TcpStream::connect_timeout(&sockaddr, timeout) {
                Ok(stream) => return Self::wrap(stream, timeout),
                Err(e) => last = e,
            }
        }
        Err(fail(last))
    }

    /// Listens on `port` and waits for one client (server side); the wait itself has no
    /// limit, like perftest's server, but every exchange after it does.
    pub fn accept(port: u16, timeout: Duration) -> Result<Self, OobError> {
        let listener = TcpListener::bind(("::", port))
            .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
            .map_err(|source| OobError::Listen { port, source })?;
        let (stream, _) = listener.accept().map_err(|source| OobError::Io {
            what: "waiting for a client".into(),
            source,
        })?;
        Self::wrap(stream, timeout)
    }

    /// A channel over a connection made elsewhere (a cluster's pair, whose client has
    /// already introduced itself on it); every read waits at most `timeout`.
    pub fn from_stream(stream: TcpStream, timeout: Duration) -> Result<Self, OobError> {
        Self::wrap(stream, timeout)
    }

    fn wrap(stream: TcpStream, timeout: Duration) -> Result<Self, OobError> {
        let set = |r: io::Result<()>| {
            r.map_err(|source| OobError::Io {
                what: "setting up the connection".into(),
                source,
            })
        };
        set(stream.set_nodelay(true))?;
        set(stream.set_read_timeout(Some(timeout)))?;
        set(stream.set_write_timeout(Some(timeout)))?;
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "(address unknown)".to_owned(), |a| a.to_string());
        Ok(OobChannel {
            stream,
            timeout,
            peer,
            pending: None,
            partial: FrameBuffer::new(),
            partial_since: None,
            frame_limit: FRAME_LIMIT,
            read_wait: timeout,
        })
    }

    /// Changes how long a read may wait (a long measurement on the peer needs longer).
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), OobError> {
        self.timeout = timeout;
        self.set_read_wait(timeout)
    }

    /// Sets the socket's read timeout, when it differs from what it is.
    fn set_read_wait(&mut self, wait: Duration) -> Result<(), OobError> {
        if wait == self.read_wait {
            return Ok(());
        }
        self.stream
            .set_read_timeout(Some(wait))
            .map_err(|source| OobError::Io {
                what: "setting the timeout".into(),
                source,
            })?;
        self.read_wait = wait;
        Ok(())
    }

    /// Reads at most `want` bytes (one read) onto the end of the frame being gathered.
    fn read_some(&mut self, want: usize) -> io::Result<usize> {
        let was_empty = self.partial.is_empty();
        let read = self.partial.read_from(&mut self.stream, want);
        if was_empty && !self.partial.is_empty() {
            self.partial_since = Some(Instant::now());
        }
        read
    }

    /// Decodes the whole frame gathered, and starts gathering the next.
    fn take_frame(&mut self) -> Result<Message, OobError> {
        self.partial_since = None;
        self.partial.take()
    }

    /// The error for a frame begun and not finished within the frame limit.
    fn partial_error(&self) -> OobError {
        let head: Vec<String> = self
            .partial
            .as_bytes()
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect();
        OobError::PartialFrame {
            peer: self.peer.clone(),
            got: self.partial.len(),
            head: head.join(" "),
            limit: self.frame_limit,
        }
    }

    /// The error for a peer that closed the connection, mid-frame or not.
    fn closed(&self, what: &str) -> OobError {
        match self.partial.len() {
            0 => OobError::Closed { what: what.into() },
            n => OobError::Closed {
                what: format!("{what} ({n} bytes of a message had come)"),
            },
        }
    }

    /// Without waiting: reads what the peer has sent, up to the end of the next frame, and
    /// decodes that frame into `pending` once it is whole (when `pending` is free; else the
    /// whole frame waits in the buffer for a later `recv`).
    fn read_available(&mut self, what: &str) -> Result<(), OobError> {
        loop {
            let need = self.partial.needs()?;
            if need == 0 {
                if self.pending.is_some() {
                    return Ok(());
                }
                let msg = self.take_frame()?;
                self.pending = Some(msg);
                continue;
            }
            match self.read_some(need) {
                Ok(0) => return Err(self.closed(what)),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_error(what, e)),
            }
        }
        match self.partial_since {
            Some(since) if since.elapsed() >= self.frame_limit => Err(self.partial_error()),
            _ => Ok(()),
        }
    }

    fn io_error(&self, what: &str, e: io::Error) -> OobError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => OobError::Timeout {
                what: what.into(),
                peer: self.peer.clone(),
                limit: self.timeout,
            },
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe => OobError::Closed { what: what.into() },
            _ => OobError::Io {
                what: what.into(),
                source: e,
            },
        }
    }

    /// Sends one message.
    pub fn send(&mut self, msg: &Message) -> Result<(), OobError> {
        let frame = encode_frame(msg)?;
        let what = format!("sending the {} message", msg.name());
        self.stream
            .write_all(&frame)
            .map_err(|e| self.io_error(&what, e))
    }

    /// The channel's socket, for poll(2): readable when the peer sent something (or
    /// closed), which [`OobChannel::peer_spoke`] then reads.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.stream.as_fd()
    }

    /// Checks, without waiting, whether the peer has said something or gone away: `Ok(true)`
    /// when a whole message is waiting (kept for the next [`OobChannel::recv`]), `Ok(false)`
    /// when the peer is quiet or the message it began is not whole yet, an error when it
    /// closed the connection, aborted, sent garbage, or left a message unfinished past
    /// [`FRAME_LIMIT`]. Measured loops call this now and then, so that a peer that died is
    /// noticed instead of waited for; it never blocks.
    pub fn peer_spoke(&mut self) -> Result<bool, OobError> {
        let what = "watching the peer during the run";
        self.stream
            .set_nonblocking(true)
            .map_err(|e| self.io_error(what, e))?;
        let read = self.read_available(what);
        self.stream
            .set_nonblocking(false)
            .map_err(|e| self.io_error(what, e))?;
        read?;
        Ok(self.pending.is_some())
    }

    /// Receives one message; `expecting` names it for error messages. Waits at most the
    /// channel's timeout for a message to begin, and then at most [`FRAME_LIMIT`] from its
    /// first byte for the rest.
    pub fn recv(&mut self, expecting: &str) -> Result<Message, OobError> {
        if let Some(msg) = self.pending.take() {
            return Ok(msg);
        }
        let what = format!("waiting for the peer's {expecting}");
        loop {
            let need = self.partial.needs()?;
            if need == 0 {
                return self.take_frame();
            }
            let wait = match self.partial_since {
                None => self.timeout,
                Some(since) => {
                    let left = self.frame_limit.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        return Err(self.partial_error());
                    }
                    left.min(self.timeout)
                }
            };
            self.set_read_wait(wait)?;
            match self.read_some(need) {
                Ok(0) => return Err(self.closed(&what)),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) && !self.partial.is_empty() =>
                {
                    return Err(self.partial_error())
                }
                Err(e) => return Err(self.io_error(&what, e)),
            }
        }
    }

    /// Client side of the opening: sends the parameters, returns when the server agrees.
    pub fn client_handshake(&mut self, params: &TestParams) -> Result<(), OobError> {
        self.send(&Message::Hello {
            params: params.clone(),
        })?;
        match self.recv("agreement to the test parameters")? {
            Message::Agree => Ok(()),
            Message::Refuse { mismatches } => Err(mismatch_error(&mismatches)),
            other => Err(OobError::Unexpected {
                expected: "agree",
                got: other.name(),
            }),
        }
    }

    /// Server side of the opening: checks the client's parameters against ours; refuses
    /// (telling the client why) when they differ.
    pub fn server_handshake(&mut self, params: &TestParams) -> Result<(), OobError> {
        let theirs = match self.recv("test parameters")? {
            Message::Hello { params } => params,
            other => {
                return Err(OobError::Unexpected {
                    expected: "hello",
                    got: other.name(),
                })
            }
        };
        let mismatches = params.mismatches(&theirs);
        if mismatches.is_empty() {
            return self.send(&Message::Agree);
        }
        // Best effort: the refusal is for the client's benefit; our error says it all.
        let _ = self.send(&Message::Refuse {
            mismatches: mismatches.clone(),
        });
        Err(mismatch_error(&mismatches))
    }

    /// Trades endpoints: sends ours, returns the peer's, checked: one per QP of ours (the two
    /// sides agreed on `-q`), and each buffer, `buffer_len` bytes long on both sides, within
    /// the address space, so that no address computed from them can overflow.
    pub fn exchange_endpoints(
        &mut self,
        ours: &[QpEndpoint],
        buffer_len: u64,
    ) -> Result<Vec<QpEndpoint>, OobError> {
        self.send(&Message::Endpoints { qps: ours.to_vec() })?;
        let theirs = match self.recv("queue pair endpoints")? {
            Message::Endpoints { qps } => qps,
            other => {
                return Err(OobError::Unexpected {
                    expected: "endpoints",
                    got: other.name(),
                })
            }
        };
        check_endpoints(&theirs, ours.len(), buffer_len)?;
        Ok(theirs)
    }

    /// Trades port profiles for the pre-flight diagnosis: sends ours, returns the peer's
    /// with its text made printable and its role set to the one opposite ours (the peer
    /// does not get to name it).
    pub fn exchange_profiles(&mut self, ours: &PortProfile) -> Result<PortProfile, OobError> {
        self.send(&Message::Preflight {
            profile: ours.clone(),
        })?;
        let theirs = match self.recv("port description")? {
            Message::Preflight { profile } => profile,
            other => {
                return Err(OobError::Unexpected {
                    expected: "preflight",
                    got: other.name(),
                })
            }
        };
        Ok(theirs.from_peer(&ours.role))
    }

    /// A barrier: both sides send `step` and wait for the other's, which must match.
    pub fn barrier(&mut self, step: &str) -> Result<(), OobError> {
        self.send_ready(step)?;
        self.expect_ready(step)
    }

    /// The first half of a barrier: tells the peer this side reached `step`.
    pub fn send_ready(&mut self, step: &str) -> Result<(), OobError> {
        self.send(&Message::Ready { step: step.into() })
    }

    /// The second half of a barrier: waits for the peer's `step`, which must match.
    pub fn expect_ready(&mut self, step: &str) -> Result<(), OobError> {
        match self.recv(step)? {
            Message::Ready { step: theirs } if theirs == step => Ok(()),
            Message::Ready { step: theirs } => Err(OobError::Garbage(format!(
                "out of step: we reached \"{step}\", the peer \"{}\"",
                printable(&theirs, PEER_TEXT_MAX)
            ))),
            other => Err(OobError::Unexpected {
                expected: "ready",
                got: other.name(),
            }),
        }
    }

    /// Trades this side's results for the peer's.
    pub fn exchange_results(&mut self, ours: &SideReport) -> Result<SideReport, OobError> {
        self.send(&Message::Results {
            report: ours.for_peer(),
        })?;
        match self.recv("results")? {
            Message::Results { report } => {
                report
                    .check_numbers()
                    .map_err(|source| OobError::PeerNumber {
                        peer: self.peer.clone(),
                        source,
                    })?;
                Ok(report.printable())
            }
            other => Err(OobError::Unexpected {
                expected: "results",
                got: other.name(),
            }),
        }
    }

    /// Tells the peer this side stops with an error (best effort).
    pub fn abort(&mut self, reason: &str) {
        let _ = self.send(&Message::Abort {
            reason: reason.into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn params(args: &[&str]) -> TestParams {
        crate::params::from_args(args).unwrap()
    }

    /// A connected pair over loopback.
    fn pair() -> (OobChannel, OobChannel) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let t = Duration::from_secs(5);
        let client = thread::spawn(move || OobChannel::connect("127.0.0.1", port, t).unwrap());
        let (s, _) = listener.accept().unwrap();
        (client.join().unwrap(), OobChannel::wrap(s, t).unwrap())
    }

    #[test]
    fn a_peers_results_with_a_number_no_run_measures_are_refused() {
        let report = |avg: f64| SideReport {
            role: "server".into(),
            device: "rxe0".into(),
            gid_index: 0,
            buffer: None,
            memory_regions: None,
            clock: None,
            posting: None,
            polling: None,
            results: vec![crate::report::SizeResult::Bandwidth(
                crate::bandwidth::BandwidthResult {
                    bytes: 65536,
                    iterations: 5000,
                    peak_bytes_per_sec: None,
                    avg_bytes_per_sec: avg,
                    msg_rate_mpps: 0.016,
                    intervals: None,
                    cpu_util_percent: None,
                },
            )],
            intervals: vec![],
        };
        for (avg, want) in [
            (1e300, "of 1e300, more than"),
            (-2.0, "of -2.0, which is negative"),
        ] {
            let (mut c, mut s) = pair();
            let ours = report(1e9);
            let peer = thread::spawn(move || s.exchange_results(&report(avg)).map(|_| ()));
            let e = c.exchange_results(&ours).unwrap_err().to_string();
            assert!(
                e.starts_with("the peer at 127.0.0.1:")
                    && e.contains(&format!(
                        "sent results with the 65536-byte row's average bandwidth (bytes/s) {want}"
                    )),
                "{e}"
            );
            // The honest side's numbers pass.
            peer.join().unwrap().unwrap();
        }
    }

    #[test]
    fn a_peer_that_leaves_before_its_port_description_is_named_once() {
        let ours = PortProfile {
            role: "client".into(),
            device: "rxe0".into(),
            port: 1,
            link: crate::preflight::LinkKind::Ethernet,
            active_mtu: 1024,
            gid: None,
            gid_from_x: false,
            table: vec![],
        };
        let (mut c, mut s) = pair();
        // The peer takes ours and leaves without sending its own.
        let peer = thread::spawn(move || drop(s.recv("port description")));
        let e = c.exchange_profiles(&ours).unwrap_err().to_string();
        peer.join().unwrap();
        assert!(
            e.starts_with("waiting for the peer's port description"),
            "{e}"
        );
        assert!(!e.contains("the peer's the peer's"), "{e}");
    }

    #[test]
    fn no_server_is_refused_at_once_with_the_step_and_address() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let started = std::time::Instant::now();
        let e = OobChannel::connect("127.0.0.1", port, Duration::from_secs(15))
            .unwrap_err()
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            e,
            format!(
                "TCP connect to the stride-perf server at 127.0.0.1:{port}: connection refused: \
                 is the server running, on port {port}? start it first with the same options \
                 and no address"
            )
        );
        let timed_out = OobError::Connect {
            addr: format!("127.0.0.1:{port}"),
            port,
            limit: Duration::from_secs(15),
            source: io::ErrorKind::TimedOut.into(),
        };
        let text = timed_out.to_string();
        let want = format!(
            ": no answer within 15 s: the address routes nowhere or a firewall drops it; \
             check the address and -p {port}"
        );
        assert!(text.ends_with(&want), "{text}");
    }

    #[test]
    fn agreeing_sides_trade_endpoints_and_meet_at_barriers() {
        let (mut c, mut s) = pair();
        let p = params(&["write", "bw"]);
        let pc = p.clone();
        let ep = QpEndpoint {
            lid: 0,
            qpn: 17,
            psn: 5,
            gid: [1; 16],
            rkey: 9,
            addr: 0x1000,
            mtu: 1024,
            dc: None,
        };
        let client = thread::spawn(move || {
            c.client_handshake(&pc).unwrap();
            let theirs = c.exchange_endpoints(&[ep], 128).unwrap();
            c.barrier("start").unwrap();
            theirs
        });
        s.server_handshake(&p).unwrap();
        let theirs = s
            .exchange_endpoints(&[QpEndpoint { qpn: 18, ..ep }], 128)
            .unwrap();
        s.barrier("start").unwrap();
        assert_eq!(theirs, [ep]);
        assert_eq!(client.join().unwrap()[0].qpn, 18);
    }

    #[test]
    fn different_sizes_are_refused_on_both_sides() {
        let (mut c, mut s) = pair();
        let client = thread::spawn(move || {
            c.client_handshake(&params(&["write", "bw", "-s", "4096"]))
                .unwrap_err()
                .to_string()
        });
        let server_err = s
            .server_handshake(&params(&["write", "bw", "-s", "65536"]))
            .unwrap_err()
            .to_string();
        let client_err = client.join().unwrap();
        for e in [&server_err, &client_err] {
            assert!(
                e.contains("message size (-s/-a): server [65536], client [4096]"),
                "{e}"
            );
        }
    }

    #[test]
    fn garbage_version_and_silence_are_errors() {
        let (mut c, mut s) = pair();
        c.stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let e = s.recv("hello").unwrap_err().to_string();
        assert!(e.contains("not stride-perf"), "{e}");

        let (mut c, mut s) = pair();
        let mut frame = MAGIC.to_vec();
        frame.extend_from_slice(&99u16.to_be_bytes());
        frame.extend_from_slice(&2u32.to_be_bytes());
        frame.extend_from_slice(b"{}");
        c.stream.write_all(&frame).unwrap();
        let e = s.recv("hello").unwrap_err().to_string();
        assert!(e.contains("version 99"), "{e}");

        let (c, mut s) = pair();
        s.set_timeout(Duration::from_millis(200)).unwrap();
        let e = s.recv("results").unwrap_err().to_string();
        let peer = c.stream.local_addr().unwrap();
        assert_eq!(
            e,
            format!(
                "waiting for the peer's results (peer {peer}): no answer within 200 ms (did it \
                 die or hang? see its output)"
            )
        );
        drop(c);
        let e = s.recv("results").unwrap_err().to_string();
        assert!(e.contains("closed the connection"), "{e}");
    }

    #[test]
    fn peer_spoke_reads_ahead_and_notices_a_closed_peer() {
        let (mut c, mut s) = pair();
        assert!(!s.peer_spoke().unwrap());
        c.send(&Message::Ready {
            step: "done".into(),
        })
        .unwrap();
        // The frame may take a moment to arrive over loopback.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !s.peer_spoke().unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "the message never came"
            );
            thread::sleep(Duration::from_millis(5));
        }
        assert!(s.peer_spoke().unwrap(), "the message stays pending");
        // A peer that spoke and then died is noticed too: the message stays readable.
        let (c2, mut s2) = pair();
        let mut c2 = c2;
        c2.send(&Message::Ready {
            step: "done".into(),
        })
        .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !s2.peer_spoke().unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "the message never came"
            );
            thread::sleep(Duration::from_millis(5));
        }
        drop(c2);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let closed = loop {
            match s2.peer_spoke() {
                Err(e) => break e.to_string(),
                Ok(spoke) => assert!(spoke),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the close was never seen"
            );
            thread::sleep(Duration::from_millis(5));
        };
        assert!(closed.contains("closed the connection"), "{closed}");
        assert!(matches!(s2.recv("done"), Ok(Message::Ready { .. })));
        assert_eq!(
            s.recv("done").unwrap(),
            Message::Ready {
                step: "done".into()
            }
        );
        drop(c);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match s.peer_spoke() {
                Err(e) => {
                    assert!(e.to_string().contains("closed the connection"), "{e}");
                    break;
                }
                Ok(spoke) => assert!(!spoke),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the close was never seen"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn endpoint(qpn: u32, addr: u64) -> QpEndpoint {
        QpEndpoint {
            lid: 0,
            qpn,
            psn: 1,
            gid: [0; 16],
            rkey: 7,
            addr,
            mtu: 1024,
            dc: None,
        }
    }

    /// What `exchange_endpoints` on this side says when the peer sends `theirs`.
    fn trade(ours: Vec<QpEndpoint>, theirs: Vec<QpEndpoint>, len: u64) -> Result<usize, String> {
        let (mut c, mut s) = pair();
        let peer = thread::spawn(move || {
            // The peer sends its list whatever ours says.
            let _ = s.recv("endpoints");
            s.send(&Message::Endpoints { qps: theirs }).unwrap();
        });
        let got = c.exchange_endpoints(&ours, len);
        peer.join().unwrap();
        got.map(|v| v.len()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_peer_with_too_few_or_too_many_endpoints_is_refused() {
        let four: Vec<_> = (0..4).map(|q| endpoint(q, 0x1000)).collect();
        let e = trade(four.clone(), four[..1].to_vec(), 128).unwrap_err();
        assert!(
            e.contains("the peer sent 1 QP endpoints, but this run has 4 QPs (-q 4)"),
            "{e}"
        );
        let e = trade(four[..2].to_vec(), Vec::new(), 128).unwrap_err();
        assert!(e.contains("the peer sent 0 QP endpoints"), "{e}");
        let e = trade(four[..1].to_vec(), four.clone(), 128).unwrap_err();
        assert!(
            e.contains("sent 4 QP endpoints, but this run has 1 QPs"),
            "{e}"
        );
        assert_eq!(trade(four.clone(), four, 128), Ok(4));
    }

    #[test]
    fn a_peer_buffer_past_the_address_space_is_refused() {
        let ours = vec![endpoint(1, 0x1000), endpoint(2, 0x1000)];
        let theirs = vec![endpoint(3, 0x1000), endpoint(4, u64::MAX - 100)];
        let e = trade(ours.clone(), theirs, 128).unwrap_err();
        assert!(
            e.contains("QP 1 advertised a 128-byte buffer at address 0xffffffffffffff9b"),
            "{e}"
        );
        // The largest address whose end (address + length) still fits in 64 bits is fine.
        let theirs = vec![endpoint(3, 0x1000), endpoint(4, u64::MAX - 127)];
        assert!(trade(ours.clone(), theirs, 128).is_err());
        let theirs = vec![endpoint(3, 0x1000), endpoint(4, u64::MAX - 128)];
        assert_eq!(trade(ours, theirs, 128), Ok(2));
    }

    #[test]
    fn a_peer_number_no_qp_may_have_is_refused_as_the_peers() {
        let ours = vec![endpoint(1, 0x1000), endpoint(2, 0x1000)];
        let ok = vec![endpoint(3, 0x1000), endpoint(MAX_24_BITS, 0x1000)];
        assert_eq!(trade(ours.clone(), ok.clone(), 128), Ok(2));
        let with = |f: &dyn Fn(&mut QpEndpoint)| {
            let mut theirs = ok.clone();
            f(&mut theirs[1]);
            trade(ours.clone(), theirs, 128).unwrap_err()
        };
        let e = with(&|ep| ep.qpn = u32::MAX);
        assert!(
            e.contains("the peer's QP 1 sent QP number 4294967295 (0xffffffff), over 24 bits"),
            "{e}"
        );
        let e = with(&|ep| ep.qpn = 1 << 24);
        assert!(
            e.contains("QP number 16777216 (0x1000000), over 24 bits"),
            "{e}"
        );
        let e = with(&|ep| ep.psn = 1 << 24);
        assert!(e.contains("the peer's QP 1 sent PSN 16777216"), "{e}");
        let e = with(&|ep| {
            ep.dc = Some(DcEndpoint {
                dctn: u32::MAX,
                key: 1,
            })
        });
        assert!(e.contains("sent DCT number 4294967295"), "{e}");
        let e = with(&|ep| ep.mtu = 0);
        assert!(
            e.contains("the peer's QP 1 sent MTU 0 (0x0), which is not a path MTU"),
            "{e}"
        );
        let e = with(&|ep| ep.mtu = 1500);
        assert!(e.contains("sent MTU 1500"), "{e}");
        for mtu in PATH_MTUS {
            let mut theirs = ok.clone();
            theirs[0].mtu = mtu;
            assert_eq!(trade(ours.clone(), theirs, 128), Ok(2), "MTU {mtu}");
        }
    }

    /// Calls `peer_spoke` every few milliseconds until it fails, checking that no call
    /// blocks and that it says nothing was spoken; returns the error.
    fn spoke_until_error(s: &mut OobChannel) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let call = Instant::now();
            let spoke = s.peer_spoke();
            let took = call.elapsed();
            assert!(
                took < Duration::from_millis(100),
                "peer_spoke blocked for {took:?}"
            );
            match spoke {
                Ok(spoke) => assert!(!spoke, "no whole message was sent"),
                Err(e) => return e.to_string(),
            }
            assert!(
                Instant::now() < deadline,
                "the stray bytes were never reported"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_stray_byte_does_not_block_the_measured_loop() {
        // A byte that may begin a frame, then nothing: the loop goes on until the rest is
        // overdue, then stops with an error that shows the byte.
        let (mut c, mut s) = pair();
        s.frame_limit = Duration::from_millis(300);
        let start = Instant::now();
        c.stream.write_all(b"S").unwrap();
        let e = spoke_until_error(&mut s);
        assert!(start.elapsed() >= Duration::from_millis(300), "{e}");
        assert!(
            e.contains("sent 1 bytes of a message (starting 53) and not the rest within 300ms"),
            "{e}"
        );
        assert!(e.contains("the peer at 127.0.0.1:"), "{e}");

        // A byte that cannot begin a frame is refused at once.
        let (mut c, mut s) = pair();
        c.stream.write_all(b"x").unwrap();
        let e = spoke_until_error(&mut s);
        assert!(e.contains("not stride-perf"), "{e}");

        // Half a header and half a payload, each finished later, are waited for.
        let (mut c, mut s) = pair();
        let mut frame = MAGIC.to_vec();
        frame.extend_from_slice(&VERSION.to_be_bytes());
        let payload = serde_json::to_vec(&Message::Ready {
            step: "done 8".into(),
        })
        .unwrap();
        frame.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        frame.extend_from_slice(&payload);
        for piece in [&frame[..3], &frame[3..14], &frame[14..]] {
            assert!(!s.peer_spoke().unwrap());
            c.stream.write_all(piece).unwrap();
            thread::sleep(Duration::from_millis(20));
        }
        assert!(s.peer_spoke().unwrap());
        assert_eq!(
            s.recv("done").unwrap(),
            Message::Ready {
                step: "done 8".into()
            }
        );
    }

    #[test]
    fn recv_waits_for_the_rest_of_a_frame_only_so_long() {
        let (mut c, mut s) = pair();
        s.frame_limit = Duration::from_millis(300);
        c.stream.write_all(b"STR").unwrap();
        let start = Instant::now();
        // The channel's timeout is 5 s: the begun frame gets only the frame limit.
        let e = s.recv("results").unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_secs(2), "{e}");
        assert!(
            e.contains("sent 3 bytes of a message (starting 53 54 52)"),
            "{e}"
        );

        // A peer that closes mid-frame says so.
        let (mut c, mut s) = pair();
        c.stream.write_all(b"STRD").unwrap();
        drop(c);
        let e = s.recv("results").unwrap_err().to_string();
        assert!(e.contains("closed the connection"), "{e}");
        assert!(e.contains("4 bytes of a message had come"), "{e}");
    }

    /// Whether `text` would reach a terminal with no control character in it.
    fn is_printable(text: &str) -> bool {
        !text
            .chars()
            .any(|c| c.is_control() || ('\u{80}'..='\u{9f}').contains(&c))
    }

    #[test]
    fn peer_text_reaches_the_terminal_printable_and_cut() {
        let evil = format!(
            "\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}1A{}",
            "x".repeat(100_000)
        );
        let (mut c, mut s) = pair();
        c.abort(&evil);
        let e = s.recv("endpoints").unwrap_err().to_string();
        assert!(is_printable(&e), "{e:?}");
        assert!(
            e.starts_with("the peer stopped: \\x1b]0;owned\\x07\\x1b[2J\\u{9b}1Axxx"),
            "{e}"
        );
        assert!(e.len() < 1000, "{} bytes", e.len());
        let cut = evil.chars().count() - PEER_TEXT_MAX;
        assert!(
            e.ends_with(&format!("({cut} more characters not shown)")),
            "{e}"
        );

        // A refusal's lines, a step name, and what the decoder quotes.
        let (mut c, mut s) = pair();
        let client = thread::spawn(move || {
            c.client_handshake(&params(&["write", "bw"]))
                .unwrap_err()
                .to_string()
        });
        let _ = s.recv("hello");
        // 100 lines of 2,000 characters fit one message.
        let mut mismatches = vec![evil.chars().take(2000).collect::<String>(); 100];
        mismatches.push("last".into());
        s.send(&Message::Refuse { mismatches }).unwrap();
        let e = client.join().unwrap();
        assert!(is_printable(&e.replace('\n', "")), "{e:?}");
        assert!(e.contains("... and 69 more lines not shown"), "{e}");
        assert!(e.len() < 40_000, "{} bytes", e.len());

        let (mut c, mut s) = pair();
        let peer = thread::spawn(move || {
            let _ = c.recv("start");
            c.send(&Message::Ready { step: evil }).unwrap();
        });
        let e = s.barrier("start").unwrap_err().to_string();
        peer.join().unwrap();
        assert!(is_printable(&e), "{e:?}");
        assert!(e.contains("the peer \"\\x1b]0;owned"), "{e}");

        let (mut c, mut s) = pair();
        let payload = br#"{"type":"\u001b[2J\u009b31m"}"#;
        let mut frame = MAGIC.to_vec();
        frame.extend_from_slice(&VERSION.to_be_bytes());
        frame.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        frame.extend_from_slice(payload);
        c.stream.write_all(&frame).unwrap();
        let e = s.recv("hello").unwrap_err().to_string();
        assert!(is_printable(&e), "{e:?}");
        assert!(e.contains("\\x1b[2J"), "{e}");
    }

    #[test]
    fn aborts_and_missing_servers_are_reported() {
        let (mut c, mut s) = pair();
        c.abort("device lost");
        let e = s.recv("endpoints").unwrap_err().to_string();
        assert_eq!(e, "the peer stopped: device lost");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = OobChannel::connect("127.0.0.1", port, Duration::from_secs(2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is the server running"), "{e}");
    }
}
