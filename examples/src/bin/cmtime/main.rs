//! `cmtime`: times every step of setting up and tearing down many rdma_cm connections,
//! with the flags of rdma-core's `cmtime` and its way of keeping client and server in step,
//! so either side may be theirs.
//!
//! The run has three rounds: a warm-up and a timed round with a QP per connection (created
//! by the program and moved through its states with `rdma_init_qp_attr`), then a timed
//! round without QPs (the connections name QP numbers from `-q` on). A TCP connection to
//! the server's port keeps the sides in step: at the start of a round, once all its
//! connections are established and once all are disconnected, the client sends the number
//! of that step (0, 12 or 14; one byte), and the server sends it back when its own side of
//! the step is done. After each timed round both sides print a table: per step, the time
//! from the first connection's start to the last one's end (total) and its share per
//! connection (avg/iter), the sum of the connections' own times and its mean (us/conn), and
//! the longest and shortest, all in microseconds.
//!
//! `-m US` simulates the QPs of the timed round with them (no QP is made; creating it and
//! each modify is a sleep of US microseconds, and the connections name QP numbers from `-q`
//! on), `-n THREADS` runs the per-connection steps that rdma-core's cmtime hands to its
//! worker threads on that many threads (address and route resolution requests, QP creation,
//! the move to Init, disconnecting, and what follows an rdma_cm event: the client's RTR, RTS
//! and establish after the server's reply, the server's accept of a request and its answer
//! to a disconnect; the socket test's socket creation and connect), and `-S` times plain TCP
//! connections instead of rdma_cm ones, as a baseline: the server accepts `-c` connections
//! on the port, the client creates and connects them, both close them, and each prints one
//! table; no step bytes are exchanged then. Where rdma-core's cmtime queues each event's work
//! as it comes, this one reads the events that are waiting, hands their work to the threads
//! (each connection's in order, on one thread) and reads on once that is done.

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use sideway::completion_queue::CompletionQueue;
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::QueuePair;
use sideway::rdmacm::{
    CmError, CmId, ConnParam, Event, EventChannel, EventType, PortSpace, QpTargetState,
};
use sideway_examples::cli::{exit_status, log_to_stderr, select_devices, CliError};
use sideway_examples::cm_connection::socket_addr;
use sideway_examples::cmtime_wire::{check_announced, check_answer, Step, STEPS};
mod client;
mod conns;
mod server;
mod socket;
mod table;
use client::*;
use conns::*;
use server::*;
use socket::*;
use table::*;

/// Times the steps of rdma_cm connection setup and teardown over many connections.
#[derive(Debug, Parser)]
#[command(name = "cmtime")]
struct Args {
    /// Run as the client, connecting to this server (a name or an address); without it,
    /// run as the server
    #[arg(short = 's', long = "server", value_name = "ADDRESS")]
    server: Option<String>,

    /// The local address to bind to (the server listens on it; default: every address)
    #[arg(short = 'b', long = "bind", value_name = "ADDRESS")]
    bind: Option<String>,

    /// Connections per round
    #[arg(short = 'c', long = "connections", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    connections: u32,

    /// The server's port (rdma_cm, and TCP for keeping the sides in step)
    #[arg(short = 'p', long = "port", default_value_t = 7471)]
    port: u16,

    /// The first QP number the round without QPs names (it uses this and the next
    /// connections - 1); give client and server on one host different ones
    #[arg(short = 'q', long = "base-qpn", value_name = "QPN", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..0xff_ffff))]
    base_qpn: u32,

    /// Retries of an address or route resolution that failed
    #[arg(short = 'r', long = "retries", default_value_t = 2)]
    retries: u32,

    /// Milliseconds an address or route resolution may take; the client's TCP connection to
    /// the server and the server's first answer on it may take as long
    #[arg(short = 't', long = "timeout", value_name = "MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u32).range(1..))]
    timeout_ms: u32,

    /// Simulate the QPs of the timed round: no QP is made, creating one and each modify is a
    /// sleep of this many microseconds, and the connections name QP numbers from -q on
    #[arg(short = 'm', long = "mimic-qp-delay", value_name = "US")]
    mimic_qp_delay: Option<u32>,

    /// Threads that run the per-connection steps (resolution requests, QP creation and
    /// modifies, connect, accept and disconnect handling; the socket test's creates and
    /// connects)
    #[arg(short = 'n', long = "threads", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: u32,

    /// Time TCP socket connections instead of rdma_cm ones, as a baseline (both sides give
    /// it, with the same -c and -p)
    #[arg(short = 'S', long = "sockets")]
    sockets: bool,
}

/// How long the connections of a round may take for one asynchronous step (connecting,
/// disconnecting), and the server to answer in the TCP exchange once it has answered once.
const STEP_LIMIT: Duration = Duration::from_secs(60);

/// The three rounds of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    Warmup,
    WithQps,
    WithoutQps,
}

const ROUNDS: [Round; 3] = [Round::Warmup, Round::WithQps, Round::WithoutQps];

/// What stands for a connection's QP in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Qps {
    /// A QP made and modified for real.
    Real,
    /// None; creating it and each modify is a sleep this long (zero in the round without
    /// QPs), and the connection names a QP number from -q on.
    Simulated(Duration),
}

impl Qps {
    fn real(self) -> bool {
        self == Qps::Real
    }

    /// What the QP's creation or modify costs when simulated.
    fn stand_in(self) {
        if let Qps::Simulated(d) = self {
            if !d.is_zero() {
                std::thread::sleep(d);
            }
        }
    }
}

impl Round {
    fn qps(self, args: &Args) -> Qps {
        match (self, args.mimic_qp_delay) {
            (Round::Warmup, _) | (Round::WithQps, None) => Qps::Real,
            (Round::WithQps, Some(us)) => Qps::Simulated(Duration::from_micros(u64::from(us))),
            (Round::WithoutQps, _) => Qps::Simulated(Duration::ZERO),
        }
    }

    fn title(self, client: bool, args: &Args) -> String {
        let n = args.connections;
        let (side, verb) = if client {
            ("Client", "Connect")
        } else {
            ("Server", "Accept")
        };
        match (self, args.mimic_qp_delay) {
            (Round::Warmup, _) => format!("{side} warmup"),
            (Round::WithQps, None) => format!("{verb} ({n}) QPs test"),
            (Round::WithQps, Some(us)) => {
                format!("{verb} ({n}) simulated QPs test (delay {us} us)")
            }
            (Round::WithoutQps, _) => format!("{verb} ({n}) test - no QPs"),
        }
    }
}

fn say(line: &str) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

fn run(args: &Args) -> Result<(), CliError> {
    // Without a device, say so (and how to get one) before rdma_cm says something vaguer.
    select_devices(None)?;
    match (args.server.as_deref(), args.sockets) {
        (Some(host), false) => client(args, host),
        (None, false) => server(args),
        (Some(host), true) => socket_client(args, host),
        (None, true) => socket_server(args),
    }
}

fn main() -> ExitCode {
    log_to_stderr("cmtime");
    let args = Args::parse();
    exit_status("cmtime", run(&args))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback port nothing listens on (bound, then closed).
    fn closed_port() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    #[test]
    fn no_server_is_refused_at_once_with_the_address() {
        let dst = closed_port();
        let started = Instant::now();
        let err = ClientSync::connect(dst, Duration::from_secs(2))
            .err()
            .expect("nothing listens there")
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            err,
            format!(
                "TCP connect to the cmtime server at {dst}: connection refused: is cmtime \
                 running there as the server, with -p {}?",
                dst.port()
            )
        );
    }

    #[test]
    fn a_silent_server_is_given_up_on_after_the_timeout_flag() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dst = listener.local_addr().unwrap();
        let silent = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_secs(2));
            drop(s);
        });
        let started = Instant::now();
        let mut sync = ClientSync::connect(dst, Duration::from_millis(300)).unwrap();
        let err = sync.step(Step::FullConnect).unwrap_err().to_string();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_millis(1500),
            "{waited:?}"
        );
        assert_eq!(
            err,
            format!(
                "waiting for the cmtime server at {dst} to agree to step 0: no answer within \
                 300 ms: is it a cmtime server, and still running?"
            )
        );
        silent.join().unwrap();
    }

    #[test]
    fn sync_bytes_are_rdma_core_step_numbers() {
        assert_eq!(Step::FullConnect as u8, 0);
        assert_eq!(Step::CmConnect as u8, 12);
        assert_eq!(Step::Disconnect as u8, 14);
        for (i, (step, _)) in STEPS.iter().enumerate() {
            assert_eq!(*step as usize, i, "{step:?} is out of order");
        }
    }

    #[test]
    fn rows_sum_spans_and_measure_the_whole_step() {
        let t0 = Instant::now();
        let us = |n| t0 + Duration::from_micros(n);
        let mut a = Times::default();
        a.set(Step::CreateId, us(0), us(10));
        a.set(Step::CmConnect, us(100), us(400));
        let mut b = Times::default();
        b.set(Step::CreateId, us(10), us(40));
        b.set(Step::CmConnect, us(110), us(210));
        let rows = rows(&[a, b], &Times::default());
        let create = rows[Step::CreateId as usize];
        assert_eq!(
            create,
            Row {
                total: 40,
                sum: 40,
                max: 30,
                min: 10
            }
        );
        let connect = rows[Step::CmConnect as usize];
        assert_eq!((connect.total, connect.sum), (300, 400));
        assert_eq!((connect.max, connect.min), (300, 100));
        assert_eq!(rows[Step::RtrQp as usize], Row::default(), "never timed");
    }

    #[test]
    fn the_table_is_laid_out_like_rdma_cores() {
        let t0 = Instant::now();
        let mut a = Times::default();
        a.set(Step::ResolveAddr, t0, t0 + Duration::from_micros(1742));
        let text = table(true, 1, &[a], &Times::default());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3 + STEPS.len());
        assert_eq!(lines[0], "qp_conn                 1");
        assert_eq!(lines[1], "threads                 1");
        assert_eq!(
            lines[2],
            "step             avg/iter  total(us)    us/conn    sum(us)    max(us)    min(us)"
        );
        assert_eq!(
            lines[3 + Step::ResolveAddr as usize],
            "resolve addr         1742       1742       1742       1742       1742       1742"
        );
        assert!(table(false, 1, &[], &Times::default()).starts_with("cm_conn                 0\n"));
    }

    #[test]
    fn a_whole_span_sets_the_total_and_threads_their_row() {
        let t0 = Instant::now();
        let mut whole = Times::default();
        whole.set(Step::FullConnect, t0, t0 + Duration::from_micros(500));
        let text = table(false, 4, &[Times::default(), Times::default()], &whole);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "cm_conn                 2");
        assert_eq!(lines[1], "threads                 4");
        assert_eq!(
            lines[3],
            "full connect          250        500          0          0          0          0"
        );
    }

    fn args(extra: &[&str]) -> Args {
        Args::try_parse_from(["cmtime"].iter().chain(extra)).unwrap()
    }

    #[test]
    fn mimic_simulates_the_timed_round_only() {
        let plain = args(&[]);
        assert_eq!(plain.threads, 1);
        assert!(!plain.sockets);
        assert_eq!(Round::WithQps.qps(&plain), Qps::Real);
        assert_eq!(Round::WithQps.title(true, &plain), "Connect (100) QPs test");
        let m = args(&["-m", "250", "-c", "7"]);
        assert_eq!(Round::Warmup.qps(&m), Qps::Real);
        assert_eq!(
            Round::WithQps.qps(&m),
            Qps::Simulated(Duration::from_micros(250))
        );
        assert_eq!(Round::WithoutQps.qps(&m), Qps::Simulated(Duration::ZERO));
        assert_eq!(
            Round::WithQps.title(true, &m),
            "Connect (7) simulated QPs test (delay 250 us)"
        );
        assert_eq!(
            Round::WithQps.title(false, &m),
            "Accept (7) simulated QPs test (delay 250 us)"
        );
        assert_eq!(
            Round::WithoutQps.title(false, &m),
            "Accept (7) test - no QPs"
        );
        let started = Instant::now();
        Round::WithQps.qps(&m).stand_in();
        assert!(started.elapsed() >= Duration::from_micros(250));
        assert!(Args::try_parse_from(["cmtime", "-n", "0"]).is_err());
    }

    #[test]
    fn workers_take_every_item_once_and_stop_at_a_failure() {
        for threads in [1, 3] {
            let mut items = vec![0u32; 50];
            on_workers(threads, &mut items, |x| {
                *x += 1;
                Ok(())
            })
            .unwrap();
            assert!(
                items.iter().all(|&x| x == 1),
                "{threads} threads: {items:?}"
            );
            let err = on_workers(threads, 0..50u32, |x| {
                if x == 7 {
                    Err(CliError::run("seven"))
                } else {
                    Ok(())
                }
            })
            .unwrap_err();
            assert_eq!(err.to_string(), "seven");
        }
    }

    #[test]
    fn socket_connect_to_nothing_is_refused() {
        let dst = closed_port();
        let sock = tcp_socket(&dst).unwrap();
        let err = tcp_connect(&sock, &dst).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let there = listener.local_addr().unwrap();
        let sock = tcp_socket(&there).unwrap();
        tcp_connect(&sock, &there).unwrap();
        let (_, peer) = listener.accept().unwrap();
        assert!(peer.ip().is_loopback());
    }
}
