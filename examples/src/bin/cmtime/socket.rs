//! `-S`: plain TCP connections, timed as a baseline.

use super::*;

/// A TCP socket of `addr`'s family, not connected yet (`socket(2)`): the socket test times
/// creating it apart from connecting it, as rdma-core's cmtime does.
pub(super) fn tcp_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket(2) takes plain integers and returns a new descriptor or -1.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2); nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connects `sock` to `addr` (`connect(2)`, blocking), retrying when a signal interrupts it.
pub(super) fn tcp_connect(sock: &OwnedFd, addr: &SocketAddr) -> io::Result<()> {
    let call = |sa: *const libc::sockaddr, len: usize| loop {
        // SAFETY: sock is an open socket; sa points to a sockaddr of `len` bytes that lives
        // across the call, which only reads it. len is a sockaddr_in or _in6 size.
        let ret = unsafe { libc::connect(sock.as_raw_fd(), sa, len as libc::socklen_t) };
        if ret == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            call(
                (&sin as *const libc::sockaddr_in).cast(),
                std::mem::size_of_val(&sin),
            )
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            call(
                (&sin6 as *const libc::sockaddr_in6).cast(),
                std::mem::size_of_val(&sin6),
            )
        }
    }
}

/// `-S` on the client: creates `-c` TCP sockets, connects them to the server's port and
/// closes them, timing each step, and prints the table.
pub(super) fn socket_client(args: &Args, host: &str) -> Result<(), CliError> {
    say("Client baseline socket setup")?;
    let dst = socket_addr(host, args.port)?;
    let n = args.connections as usize;
    let mut whole = Times::default();
    let mut conns: Vec<(Times, Option<OwnedFd>)> =
        (0..n).map(|_| (Times::default(), None)).collect();
    let full = Instant::now();
    say("Creating sockets")?;
    let start = Instant::now();
    on_workers(args.threads, &mut conns, |(times, sock)| {
        let made = times
            .time(Step::CreateId, || tcp_socket(&dst))
            .map_err(|e| CliError::run(format!("creating a TCP socket: {e}")))?;
        *sock = Some(made);
        Ok(())
    })?;
    whole.set(Step::CreateId, start, Instant::now());
    say("Connecting sockets")?;
    let start = Instant::now();
    on_workers(args.threads, &mut conns, |(times, sock)| {
        let Some(sock) = sock else {
            return Err(CliError::run("internal error: a socket was not created"));
        };
        times
            .time(Step::CmConnect, || tcp_connect(sock, &dst))
            .map_err(|e| {
                CliError::run(match e.kind() {
                    ErrorKind::ConnectionRefused => format!(
                        "TCP connect to the cmtime server at {dst}: connection refused: is \
                         cmtime -S running there as the server, with -p {}?",
                        dst.port()
                    ),
                    _ => format!("TCP connect to the cmtime server at {dst}: {e}"),
                })
            })
    })?;
    let end = Instant::now();
    whole.set(Step::CmConnect, start, end);
    whole.set(Step::FullConnect, full, end);
    say("Closing sockets")?;
    let start = Instant::now();
    let times: Vec<Times> = conns.into_iter().map(|(times, _)| times).collect();
    whole.set(Step::DestroyId, start, Instant::now());
    say("Client baseline socket results:")?;
    say(table(false, args.threads, &times, &whole).trim_end())
}

/// `-S` on the server: accepts `-c` TCP connections on the port, then closes them, timing
/// both, and prints the table.
pub(super) fn socket_server(args: &Args) -> Result<(), CliError> {
    say("Server baseline socket setup")?;
    let bind = match args.bind.as_deref() {
        Some(host) => socket_addr(host, args.port)?,
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.port),
    };
    let tcp = TcpListener::bind(bind)
        .map_err(|e| CliError::run(format!("cannot listen on TCP {bind}: {e}")))?;
    say("Accept sockets")?;
    let n = args.connections as usize;
    let mut socks = Vec::with_capacity(n);
    let mut first = None;
    // Waiting for the client has no limit: that is what a server does.
    for _ in 0..n {
        let (sock, _) = tcp
            .accept()
            .map_err(|e| CliError::run(format!("accepting a TCP connection: {e}")))?;
        first.get_or_insert_with(Instant::now);
        socks.push(sock);
    }
    let mut whole = Times::default();
    let end = Instant::now();
    whole.set(Step::FullConnect, first.unwrap_or(end), end);
    say("Closing sockets")?;
    let start = Instant::now();
    drop(socks);
    whole.set(Step::DestroyId, start, Instant::now());
    drop(tcp);
    say("Server baseline socket results:")?;
    let times = vec![Times::default(); n];
    say(table(false, args.threads, &times, &whole).trim_end())
}
