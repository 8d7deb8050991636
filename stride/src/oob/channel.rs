//! The connection: connecting, accepting, and sending and receiving messages with time
//! limits, including the measured loops' look at the channel that never waits.

use std::io::{self, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::error::OobError;
use super::frame::{encode_frame, FrameBuffer};
use super::message::{Message, FRAME_LIMIT};

/// A connected out-of-band channel.
#[derive(Debug)]
pub struct OobChannel {
    pub(super) stream: TcpStream,
    timeout: Duration,
    /// The peer's address, for error messages.
    pub(super) peer: String,
    /// A message [`OobChannel::peer_spoke`] read ahead, handed out by the next `recv`.
    pending: Option<Message>,
    /// The bytes of the next frame received so far: never more than one frame.
    partial: FrameBuffer,
    /// When the first of them came.
    partial_since: Option<Instant>,
    /// How long the rest of a begun frame may take: [`FRAME_LIMIT`] (shorter in tests).
    pub(super) frame_limit: Duration,
    /// The read timeout the socket has now.
    read_wait: Duration,
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

    /// Wraps a connected socket: no delay, and every read and write waits at most
    /// `timeout`.
    pub(super) fn wrap(stream: TcpStream, timeout: Duration) -> Result<Self, OobError> {
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

    /// Tells the peer this side stops with an error (best effort).
    pub fn abort(&mut self, reason: &str) {
        let _ = self.send(&Message::Abort {
            reason: reason.into(),
        });
    }
}
