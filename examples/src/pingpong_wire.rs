//! The endpoint line that rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong`
//! and `ibv_srq_pingpong` exchange over TCP before they talk RDMA.
//!
//! Each side sends one fixed-size message: `LID:QPN:PSN:GID` formatted as
//! `%04x:%06x:%06x:%s`, where the GID is 32 hex digits in network byte order, followed by a
//! NUL, 52 bytes in all. The client sends first; the server moves its QP to RTS with the
//! client's endpoint before it answers with its own line; the client then sends `done` (with
//! its NUL, 5 bytes) and connects its own QP. [`client_exchange`] and [`server_exchange`]
//! speak exactly that, with every read bounded by a timeout so a peer that vanishes mid-way is
//! an error, not a hang.

use std::error::Error;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use sideway::Gid;

use sideway::peer_text::{printable, PEER_TEXT_MAX};

/// Size of one endpoint message on the wire, the terminating NUL included.
pub const MESSAGE_LEN: usize = 52;

/// What one side of a pingpong tells the other: enough to move a QP to RTR and to build an
/// address handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Port LID (0 on RoCE, the real LID on InfiniBand).
    pub lid: u16,
    /// Queue pair number; 24 bits.
    pub qpn: u32,
    /// Initial packet sequence number; 24 bits.
    pub psn: u32,
    /// GID of the port at the chosen GID index (zero when no GID is used).
    pub gid: Gid,
}

/// A peer's message that is not an endpoint line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    reason: String,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "malformed pingpong endpoint message from peer: {}",
            self.reason
        )
    }
}

impl std::error::Error for WireError {}

const MAX_24_BITS: u32 = 0x00ff_ffff;

impl Endpoint {
    /// Formats the endpoint as the 52-byte message; fails when QPN or PSN exceed 24 bits,
    /// which the peer could not read back.
    pub fn to_wire(&self) -> Result<[u8; MESSAGE_LEN], WireError> {
        for (name, value) in [("QPN", self.qpn), ("PSN", self.psn)] {
            if value > MAX_24_BITS {
                return Err(WireError {
                    reason: format!("{name} {value:#x} does not fit in 24 bits"),
                });
            }
        }
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            self.gid.to_wire_hex()
        );
        let mut out = [0u8; MESSAGE_LEN];
        // The format above is always 51 ASCII bytes: 4 + 1 + 6 + 1 + 6 + 1 + 32.
        out[..MESSAGE_LEN - 1].copy_from_slice(text.as_bytes());
        Ok(out)
    }

    /// Parses a peer's 52-byte message.
    pub fn from_wire(msg: &[u8]) -> Result<Self, WireError> {
        let fail = |reason: String| WireError { reason };
        if msg.len() != MESSAGE_LEN {
            return Err(fail(format!(
                "expected {MESSAGE_LEN} bytes, got {}",
                msg.len()
            )));
        }
        let text_len = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(msg.get(..text_len).unwrap_or(msg)).map_err(|_| {
            fail(format!(
                "not ASCII text: \"{}\"",
                printable(&String::from_utf8_lossy(msg), PEER_TEXT_MAX)
            ))
        })?;
        // Every piece of the peer's line that an error quotes goes through `printable`.
        let quote = |s: &str| format!("\"{}\"", printable(s, PEER_TEXT_MAX));
        let mut fields = text.split(':');
        // Exactly `width` hex digits and nothing else: rdma-core prints them zero-padded.
        let mut field = |name: &str, width: usize| -> Result<&str, WireError> {
            match fields.next() {
                Some(f) if f.len() == width && f.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(f),
                Some(f) => Err(fail(format!(
                    "{name} field {} is not {width} hex digits",
                    quote(f)
                ))),
                None => Err(fail(format!("{name} field missing in {}", quote(text)))),
            }
        };
        let lid = field("LID", 4)?;
        let qpn = field("QPN", 6)?;
        let psn = field("PSN", 6)?;
        let gid = field("GID", 32)?;
        if fields.next().is_some() {
            return Err(fail(format!("trailing fields in {}", quote(text))));
        }
        let hex = |name: &str, s: &str| {
            hex_value(s).ok_or_else(|| fail(format!("{name} {} is not hex", quote(s))))
        };
        Ok(Endpoint {
            lid: u16::try_from(hex("LID", lid)?)
                .map_err(|_| fail(format!("LID {} does not fit in 16 bits", quote(lid))))?,
            qpn: hex("QPN", qpn)?,
            psn: hex("PSN", psn)?,
            gid: Gid::from_wire_hex(gid)
                .map_err(|_| fail(format!("GID {} is not 32 hex digits", quote(gid))))?,
        })
    }
}

/// The value of `s`, when every byte of it is a hex digit `[0-9a-fA-F]` (and it fits in
/// 32 bits). Not `from_str_radix`: that also takes a leading `+`.
fn hex_value(s: &str) -> Option<u32> {
    s.bytes().try_fold(0u32, |value, b| {
        let digit = char::from(b).to_digit(16)?;
        value.checked_mul(16)?.checked_add(digit)
    })
}

/// The closing word the client sends, NUL included, as rdma-core's programs send it.
pub const DONE: &[u8; 5] = b"done\0";

/// Why the endpoint exchange over TCP failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The client could not reach the server.
    Connect {
        /// `host:port`.
        addr: String,
        /// How long the connect could wait.
        timeout: Duration,
        /// What the connect said.
        source: io::Error,
    },
    /// The server could not listen.
    Listen {
        /// The TCP port.
        port: u16,
        /// What bind or listen said.
        source: io::Error,
    },
    /// Reading or writing the socket failed, or the peer went silent past the timeout.
    Io {
        /// What was being done.
        what: &'static str,
        /// The peer's address, when connected.
        peer: Option<SocketAddr>,
        /// How long each step could wait.
        timeout: Duration,
        /// The error.
        source: io::Error,
    },
    /// The peer's message is not an endpoint line.
    Wire(WireError),
    /// The client's closing word was not `done`.
    BadDone,
    /// Moving the QP to RTS with the peer's endpoint failed.
    QpConnect(Box<dyn Error + Send + Sync>),
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeError::Connect {
                addr,
                timeout,
                source,
            } => {
                write!(f, "TCP connect to the server at {addr}: ")?;
                match source.kind() {
                    io::ErrorKind::ConnectionRefused => write!(
                        f,
                        "connection refused: is the server running, and on this port (-p)?"
                    ),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => write!(
                        f,
                        "no answer within {} s: the address routes nowhere or a firewall drops \
                         it; check the address and -p, or raise --stall-timeout",
                        timeout.as_secs()
                    ),
                    _ => write!(f, "{source} (is the server running, and on this port?)"),
                }
            }
            ExchangeError::Listen { port, source } => {
                write!(f, "could not listen on TCP port {port}: {source}")
            }
            ExchangeError::Io {
                what,
                peer,
                timeout,
                source,
            } => {
                f.write_str(what)?;
                if let Some(peer) = peer {
                    write!(f, " ({peer})")?;
                }
                match source.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => write!(
                        f,
                        ": nothing within {} s: is the peer the same pingpong program (with \
                         the same -p), and still running? raise --stall-timeout if it is slow",
                        timeout.as_secs()
                    ),
                    io::ErrorKind::UnexpectedEof => {
                        f.write_str(": the peer closed the connection (see its output)")
                    }
                    _ => write!(f, ": {source}"),
                }
            }
            ExchangeError::Wire(e) => e.fmt(f),
            ExchangeError::BadDone => {
                f.write_str("the client's closing message was not \"done\": not a pingpong client?")
            }
            ExchangeError::QpConnect(e) => {
                write!(f, "could not connect the QP to the peer's endpoint: {e}")
            }
        }
    }
}

impl Error for ExchangeError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ExchangeError::Connect { source, .. }
            | ExchangeError::Listen { source, .. }
            | ExchangeError::Io { source, .. } => Some(source),
            ExchangeError::Wire(e) => Some(e),
            ExchangeError::QpConnect(e) => Some(e.as_ref()),
            ExchangeError::BadDone => None,
        }
    }
}

/// The error of step `what` on `stream`, for `map_err`.
fn io_err(
    stream: &TcpStream,
    timeout: Duration,
    what: &'static str,
) -> impl FnOnce(io::Error) -> ExchangeError {
    let peer = stream.peer_addr().ok();
    move |source| ExchangeError::Io {
        what,
        peer,
        timeout,
        source,
    }
}

fn read_endpoint(
    stream: &mut TcpStream,
    timeout: Duration,
    what: &'static str,
) -> Result<Endpoint, ExchangeError> {
    let mut msg = [0u8; MESSAGE_LEN];
    stream
        .read_exact(&mut msg)
        .map_err(io_err(stream, timeout, what))?;
    Endpoint::from_wire(&msg).map_err(ExchangeError::Wire)
}

/// The client's side: connects to `host:port`, sends `local`, reads the server's endpoint,
/// sends `done`. Each step waits at most `timeout`.
pub fn client_exchange(
    host: &str,
    port: u16,
    local: &Endpoint,
    timeout: Duration,
) -> Result<Endpoint, ExchangeError> {
    let mut remote = client_exchange_many(host, port, std::slice::from_ref(local), timeout)?;
    // One line was sent, so exactly one was read.
    Ok(remote.remove(0))
}

/// The client's side with one line per queue pair, as `ibv_srq_pingpong` speaks it:
/// connects to `host:port`, sends every line of `local`, reads as many from the server,
/// sends `done`. Each step waits at most `timeout`.
pub fn client_exchange_many(
    host: &str,
    port: u16,
    local: &[Endpoint],
    timeout: Duration,
) -> Result<Vec<Endpoint>, ExchangeError> {
    let addr = format!("{host}:{port}");
    let connect_err = |source| ExchangeError::Connect {
        addr: addr.clone(),
        timeout,
        source,
    };
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address");
    let mut stream = None;
    for sockaddr in (host, port).to_socket_addrs().map_err(connect_err)? {
        match TcpStream::connect_timeout(&sockaddr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut stream = stream.ok_or_else(|| connect_err(last))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(io_err(&stream, timeout, "setting socket timeouts"))?;
    for ep in local {
        let wire = ep.to_wire().map_err(ExchangeError::Wire)?;
        stream.write_all(&wire).map_err(io_err(
            &stream,
            timeout,
            "sending our endpoint line to the server",
        ))?;
    }
    let remote = local
        .iter()
        .map(|_| {
            read_endpoint(
                &mut stream,
                timeout,
                "waiting for the server's endpoint line",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    stream
        .write_all(DONE)
        .map_err(io_err(&stream, timeout, "sending \"done\" to the server"))?;
    Ok(remote)
}

/// The server's side: listens on `port` (all addresses), waits for one client (as long as it
/// takes), reads its endpoint, calls `connect` with it (move the QP to RTS there), sends
/// `local`, and reads the client's `done`. Once a client is connected, each step waits at
/// most `timeout`.
pub fn server_exchange(
    port: u16,
    local: &Endpoint,
    timeout: Duration,
    connect: impl FnOnce(&Endpoint) -> Result<(), Box<dyn Error + Send + Sync>>,
) -> Result<Endpoint, ExchangeError> {
    let mut remote = server_exchange_many(
        port,
        std::slice::from_ref(local),
        timeout,
        |remote: &[Endpoint]| connect(&remote[0]),
    )?;
    // One line was read, so exactly one is there.
    Ok(remote.remove(0))
}

/// The server's side with one line per queue pair, as `ibv_srq_pingpong` speaks it: reads
/// as many lines as `local` has, calls `connect` with them, sends `local`, and reads the
/// client's `done`.
pub fn server_exchange_many(
    port: u16,
    local: &[Endpoint],
    timeout: Duration,
    connect: impl FnOnce(&[Endpoint]) -> Result<(), Box<dyn Error + Send + Sync>>,
) -> Result<Vec<Endpoint>, ExchangeError> {
    let listener = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|source| ExchangeError::Listen { port, source })?;
    let (mut stream, _) = listener.accept().map_err(|source| ExchangeError::Io {
        what: "waiting for a client",
        peer: None,
        timeout,
        source,
    })?;
    drop(listener);
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(io_err(&stream, timeout, "setting socket timeouts"))?;
    let remote = local
        .iter()
        .map(|_| {
            read_endpoint(
                &mut stream,
                timeout,
                "waiting for the client's endpoint line",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    connect(&remote).map_err(ExchangeError::QpConnect)?;
    for ep in local {
        let wire = ep.to_wire().map_err(ExchangeError::Wire)?;
        stream.write_all(&wire).map_err(io_err(
            &stream,
            timeout,
            "sending our endpoint line to the client",
        ))?;
    }
    let mut done = [0u8; DONE.len()];
    stream.read_exact(&mut done).map_err(io_err(
        &stream,
        timeout,
        "waiting for the client's \"done\"",
    ))?;
    if &done != DONE {
        return Err(ExchangeError::BadDone);
    }
    Ok(remote)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Endpoint {
        Endpoint {
            lid: 0x0001,
            qpn: 0x000011,
            psn: 0xabcdef,
            gid: "::ffff:198.18.0.1".parse().unwrap(),
        }
    }

    #[test]
    fn formats_like_rdma_core() {
        let wire = sample().to_wire().unwrap();
        assert_eq!(
            &wire[..51],
            b"0001:000011:abcdef:00000000000000000000ffffc6120001"
        );
        assert_eq!(wire[51], 0);
    }

    #[test]
    fn round_trips() {
        let wire = sample().to_wire().unwrap();
        assert_eq!(Endpoint::from_wire(&wire), Ok(sample()));
    }

    #[test]
    fn refuses_values_wider_than_24_bits() {
        let mut ep = sample();
        ep.qpn = 0x0100_0000;
        assert!(ep.to_wire().unwrap_err().to_string().contains("QPN"));
    }

    #[test]
    fn rejects_garbage_from_peer() {
        let good = sample().to_wire().unwrap();
        assert!(Endpoint::from_wire(&good[..51]).is_err(), "short message");
        assert!(
            Endpoint::from_wire(&[0xff; MESSAGE_LEN]).is_err(),
            "binary junk"
        );
        let mut bad = good;
        bad[4] = b'-';
        assert!(Endpoint::from_wire(&bad).is_err(), "missing separator");
        let mut bad = good;
        bad[7] = b'z';
        let err = Endpoint::from_wire(&bad).unwrap_err().to_string();
        assert!(err.contains("QPN"), "{err}");
        let mut done = [0u8; MESSAGE_LEN];
        done[..4].copy_from_slice(b"done");
        assert!(
            Endpoint::from_wire(&done).is_err(),
            "the closing word is not an endpoint"
        );
    }

    #[test]
    fn hex_fields_take_exactly_their_digits() {
        let good = sample().to_wire().unwrap();
        // Each field's first two digits (LID, QPN, PSN, GID) turned into a sign or a space.
        for (at, name) in [(0, "LID"), (5, "QPN"), (12, "PSN"), (19, "GID")] {
            for junk in [b"+f", b"-f", b" f", b"0x", b"f ", b"\t1"] {
                let mut bad = good;
                bad[at..at + 2].copy_from_slice(junk);
                let err = Endpoint::from_wire(&bad)
                    .map(|ep| format!("accepted as {ep:?}"))
                    .unwrap_or_else(|e| e.to_string());
                assert!(
                    err.contains(&format!("{name} field \"")) && err.contains("hex digits"),
                    "{:?}: {err}",
                    std::str::from_utf8(&bad[..51])
                );
            }
        }
        // Upper- and lower-case digits are both hex.
        let mut upper = good;
        upper[12..18].copy_from_slice(b"ABCDEF");
        assert_eq!(Endpoint::from_wire(&upper), Ok(sample()));
        let mut lid = good;
        lid[..4].copy_from_slice(b"fFfF");
        assert_eq!(Endpoint::from_wire(&lid).unwrap().lid, 0xffff);
        assert_eq!(hex_value("+fff"), None);
        assert_eq!(hex_value("ffffffff"), Some(u32::MAX));
        assert_eq!(hex_value("100000000"), None);
    }

    #[test]
    fn errors_quote_the_peer_printable() {
        let good = sample().to_wire().unwrap();
        let mut bad = good;
        bad[19..23].copy_from_slice(b"\x1b[2J");
        let err = Endpoint::from_wire(&bad).unwrap_err().to_string();
        assert!(err.contains(r#"GID field "\x1b[2J0000"#), "{err}");
        let mut bad = good;
        bad[0..2].copy_from_slice(b"\xc2\x9b");
        let err = Endpoint::from_wire(&bad).unwrap_err().to_string();
        assert!(
            err.contains(r#"LID field "\u{9b}01" is not 4 hex digits"#),
            "{err}"
        );
        assert!(!err.chars().any(char::is_control), "{err:?}");
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn other() -> Endpoint {
        Endpoint {
            lid: 2,
            qpn: 0x22,
            psn: 0x123,
            gid: Gid::ZERO,
        }
    }

    #[test]
    fn client_and_server_exchange_over_loopback() {
        let port = free_port();
        let server = std::thread::spawn(move || {
            let mut seen = None;
            let remote = server_exchange(port, &other(), Duration::from_secs(5), |ep| {
                seen = Some(*ep);
                Ok(())
            })
            .unwrap();
            (remote, seen)
        });
        let mut tries = 0;
        let got = loop {
            match client_exchange("127.0.0.1", port, &sample(), Duration::from_secs(5)) {
                Ok(ep) => break ep,
                Err(ExchangeError::Connect { .. }) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(got, other());
        let (remote, seen) = server.join().unwrap();
        assert_eq!(remote, sample());
        assert_eq!(
            seen,
            Some(sample()),
            "the server connects before it answers"
        );
    }

    #[test]
    fn many_lines_each_way_in_order() {
        let port = free_port();
        let mine: Vec<Endpoint> = (0..256).map(|i| Endpoint { qpn: i, ..other() }).collect();
        let theirs: Vec<Endpoint> = (0..256)
            .map(|i| Endpoint {
                qpn: 0x1000 + i,
                ..sample()
            })
            .collect();
        let served = mine.clone();
        let server = std::thread::spawn(move || {
            server_exchange_many(port, &served, Duration::from_secs(5), |got| {
                assert_eq!(got.len(), 256);
                Ok(())
            })
            .unwrap()
        });
        let mut tries = 0;
        let got = loop {
            match client_exchange_many("127.0.0.1", port, &theirs, Duration::from_secs(5)) {
                Ok(ep) => break ep,
                Err(ExchangeError::Connect { .. }) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(got, mine);
        assert_eq!(server.join().unwrap(), theirs);
    }

    #[test]
    fn no_server_is_a_clear_error() {
        let port = free_port();
        let started = std::time::Instant::now();
        let err = client_exchange("127.0.0.1", port, &sample(), Duration::from_secs(2))
            .unwrap_err()
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            err,
            format!(
                "TCP connect to the server at 127.0.0.1:{port}: connection refused: is the \
                 server running, and on this port (-p)?"
            )
        );
    }

    #[test]
    fn silent_or_garbage_peers_end_in_errors() {
        // A "server" that accepts, sends junk and closes.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let junk = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; MESSAGE_LEN];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&[b'x'; MESSAGE_LEN]).unwrap();
        });
        let err = client_exchange("127.0.0.1", port, &sample(), Duration::from_secs(2))
            .unwrap_err()
            .to_string();
        assert!(err.contains("malformed"), "{err}");
        junk.join().unwrap();

        // A "server" that accepts and says nothing: the client gives up after the timeout.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            drop(s);
        });
        let started = std::time::Instant::now();
        let err = client_exchange("127.0.0.1", port, &sample(), Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(1) && waited < Duration::from_millis(1400),
            "{waited:?}"
        );
        assert_eq!(
            err,
            format!(
                "waiting for the server's endpoint line (127.0.0.1:{port}): nothing within 1 s: \
                 is the peer the same pingpong program (with the same -p), and still running? \
                 raise --stall-timeout if it is slow"
            )
        );
        silent.join().unwrap();
    }
}
