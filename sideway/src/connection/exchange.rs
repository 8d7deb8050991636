//! The TCP exchange of endpoints that rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong`,
//! `ibv_ud_pingpong` and `ibv_srq_pingpong` speak before they talk RDMA, so a program on
//! this crate can meet them (or itself).
//!
//! The client connects and sends its endpoint line(s) ([`Endpoint::to_pingpong_line`]); the
//! server reads as many, connects its QP(s) to them, answers with its own, and the client
//! sends `done` (with its NUL, 5 bytes). One line per QP: `ibv_srq_pingpong` sends one for
//! each of its QPs. Every step (a line read, the `done`, each write) is bounded by a
//! timeout as a whole, not per read, so a peer that vanishes mid-way, or drips its line a
//! byte at a time, is an error in bounded time, not a hang.
//!
//! ```no_run
//! use std::time::Duration;
//! use sideway::connection::exchange;
//! # fn demo(qp: &sideway::queue_pair::QueuePair, opts: &sideway::queue_pair::ConnectOptions) -> Result<(), Box<dyn std::error::Error>> {
//! let local = qp.local_endpoint(opts)?;
//! // The client's side:
//! let remote = exchange::client_exchange("198.18.0.1", 18515, &local, Duration::from_secs(10))?;
//! qp.connect(opts, &remote)?;
//! # Ok(()) }
//! ```

use std::error::Error;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::endpoint::{EndpointError, PINGPONG_LINE_LEN};
use crate::verbs::queue_pair::Endpoint;

/// The closing word the client sends, NUL included, as rdma-core's programs send it.
pub const DONE: &[u8; 5] = b"done\0";

/// Why the endpoint exchange over TCP failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The client could not reach the server.
    #[error("TCP connect to the server at {addr}: {}", connect_text(source, *timeout))]
    Connect {
        /// `host:port`.
        addr: String,
        /// How long the connect could wait.
        timeout: Duration,
        /// What the connect said.
        source: io::Error,
    },
    /// The server could not listen.
    #[error("could not listen on TCP port {port}: {source}")]
    Listen {
        /// The TCP port.
        port: u16,
        /// What bind or listen said.
        source: io::Error,
    },
    /// Reading or writing the socket failed, or the peer went silent past the timeout.
    #[error("{what}{}: {}", peer.map(|p| format!(" ({p})")).unwrap_or_default(), io_text(source, *timeout))]
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
    #[error("the peer's endpoint line: {0}")]
    Endpoint(#[from] EndpointError),
    /// The client's closing word was not `done`.
    #[error("the client's closing message was not \"done\": not a pingpong client?")]
    BadDone,
    /// Connecting the QP(s) to the peer's endpoints failed (the server's `connect` step).
    #[error("could not connect the QP to the peer's endpoint: {0}")]
    QpConnect(Box<dyn Error + Send + Sync>),
}

fn connect_text(source: &io::Error, timeout: Duration) -> String {
    match source.kind() {
        io::ErrorKind::ConnectionRefused => {
            "connection refused: is the server running, and on this port?".to_owned()
        }
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
            "no answer within {} s: the address routes nowhere or a firewall drops it",
            timeout.as_secs()
        ),
        _ => format!("{source} (is the server running, and on this port?)"),
    }
}

fn io_text(source: &io::Error, timeout: Duration) -> String {
    match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "the step did not complete within {} s (nothing, or only part of it, arrived): is \
             the peer the same kind of program, on the same port, and still running?",
            timeout.as_secs()
        ),
        io::ErrorKind::UnexpectedEof => "the peer closed the connection (see its output)".into(),
        _ => source.to_string(),
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

/// Fills `buf` from `stream` within `timeout` for the whole of it, not for each read: a peer
/// that drips a line a byte at a time cannot stretch a step past its bound. Leaves the
/// stream's read timeout at whatever the last read needed.
fn read_exact_within(stream: &mut TcpStream, buf: &mut [u8], timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    let len = buf.len();
    // The step's end, whether this loop or the socket's read timeout (EAGAIN on Linux) sees
    // it first: one error kind either way.
    let late = |filled: usize| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{filled} of {len} bytes arrived in time"),
        )
    };
    let mut filled = 0;
    while filled < len {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late(filled));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(late(filled));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_endpoint(
    stream: &mut TcpStream,
    timeout: Duration,
    what: &'static str,
) -> Result<Endpoint, ExchangeError> {
    let mut msg = [0u8; PINGPONG_LINE_LEN];
    read_exact_within(stream, &mut msg, timeout).map_err(io_err(stream, timeout, what))?;
    Ok(Endpoint::from_pingpong_line(&msg)?)
}

fn set_timeouts(stream: &TcpStream, timeout: Duration) -> Result<(), ExchangeError> {
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(io_err(stream, timeout, "setting socket timeouts"))
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
    set_timeouts(&stream, timeout)?;
    for ep in local {
        let line = ep.to_pingpong_line()?;
        stream.write_all(&line).map_err(io_err(
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

/// The server's side with one line per queue pair, as `ibv_srq_pingpong` speaks it: listens
/// on `port`, then [`server_exchange_on`].
pub fn server_exchange_many(
    port: u16,
    local: &[Endpoint],
    timeout: Duration,
    connect: impl FnOnce(&[Endpoint]) -> Result<(), Box<dyn Error + Send + Sync>>,
) -> Result<Vec<Endpoint>, ExchangeError> {
    let listener = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|source| ExchangeError::Listen { port, source })?;
    server_exchange_on(&listener, local, timeout, connect)
}

/// The server's side on a listener of the caller's: waits for one client (as long as it
/// takes), reads as many lines as `local` has, calls `connect` with them, sends `local`,
/// and reads the client's `done`.
pub fn server_exchange_on(
    listener: &TcpListener,
    local: &[Endpoint],
    timeout: Duration,
    connect: impl FnOnce(&[Endpoint]) -> Result<(), Box<dyn Error + Send + Sync>>,
) -> Result<Vec<Endpoint>, ExchangeError> {
    let (mut stream, _) = listener.accept().map_err(|source| ExchangeError::Io {
        what: "waiting for a client",
        peer: None,
        timeout,
        source,
    })?;
    set_timeouts(&stream, timeout)?;
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
        let line = ep.to_pingpong_line()?;
        stream.write_all(&line).map_err(io_err(
            &stream,
            timeout,
            "sending our endpoint line to the client",
        ))?;
    }
    let mut done = [0u8; DONE.len()];
    read_exact_within(&mut stream, &mut done, timeout).map_err(io_err(
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

    fn ep(qp_num: u32) -> Endpoint {
        Endpoint {
            lid: 0,
            qp_num,
            psn: 0x42,
            gid: "::ffff:127.0.0.1".parse().unwrap(),
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket, which Miri isolates")]
    fn client_and_server_trade_lines_on_loopback() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let t = Duration::from_secs(10);
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                server_exchange_on(&listener, &[ep(2), ep(3)], t, |remote| {
                    assert_eq!(remote, [ep(10), ep(11)]);
                    Ok(())
                })
            });
            let got = client_exchange_many("127.0.0.1", port, &[ep(10), ep(11)], t).unwrap();
            assert_eq!(got, [ep(2), ep(3)]);
            assert_eq!(server.join().unwrap().unwrap(), [ep(10), ep(11)]);
        });
    }

    /// The timeout bounds a step, not each read: a client that drips a valid line a byte at a
    /// time (each read in time, the line never) is cut off once the step's time is up.
    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket, which Miri isolates")]
    fn a_peer_dripping_its_line_is_cut_off_at_the_steps_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let step = Duration::from_secs(1);
        std::thread::scope(|s| {
            let dripper = s.spawn(move || {
                let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
                let line = ep(10).to_pingpong_line().unwrap();
                // 200 ms a byte: each read of the server's gets a byte well within the
                // step's bound, the whole line would take over 10 s.
                for b in line.iter() {
                    if c.write_all(std::slice::from_ref(b)).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
            let started = Instant::now();
            let e = server_exchange_on(&listener, &[ep(2)], step, |_| Ok(())).unwrap_err();
            let took = started.elapsed();
            assert!(
                matches!(&e, ExchangeError::Io { source, .. } if source.kind() == io::ErrorKind::TimedOut),
                "{e:?}"
            );
            assert!(e.to_string().contains("did not complete within"), "{e}");
            assert!(
                took < step * 4,
                "cut off after {took:?}, the step is {step:?}"
            );
            drop(dripper);
        });
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket, which Miri isolates")]
    fn a_refused_connect_says_so() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = client_exchange("127.0.0.1", port, &ep(1), Duration::from_secs(2)).unwrap_err();
        assert!(e.to_string().contains("refused"), "{e}");
    }
}
