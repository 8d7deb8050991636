//! The counters: how many connections went over RDMA, how many over TCP, and why.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::Stats;

/// Why a connection or listener went where it went. Each is one counter, named in the
/// summary as written here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Event {
    /// A connect carried over RDMA.
    ConnectRdma,
    /// A connect over TCP: the rules (`TRESPASS_PRELOAD_PORTS`, `_NETS`, off) exclude it.
    ConnectTcpRule,
    /// ... the peer refused the RDMA connection (nothing listens for trespass there).
    ConnectTcpRefused,
    /// ... no RDMA device has a route to the peer.
    ConnectTcpNoDevice,
    /// ... the peer did not answer within the timeout (now, or recently: see `Unanswered`).
    ConnectTcpTimeout,
    /// ... the RDMA connection failed otherwise.
    ConnectTcpError,
    /// A connect on a non-blocking socket returned `EINPROGRESS` before the RDMA attempt
    /// was answered (its outcome is counted too, when it comes).
    ConnectInProgress,
    /// A listener also listens for RDMA.
    ListenRdma,
    /// A listener on TCP only: the rules exclude it.
    ListenTcpRule,
    /// ... this machine has no RDMA device.
    ListenTcpNoDevice,
    /// ... rdma_cm could not listen on its address (no device for it, the port taken).
    ListenTcpError,
    /// A connection accepted from an RDMA client.
    AcceptRdma,
    /// A connection accepted from a TCP client.
    AcceptTcp,
    /// A data call (`write`, `send`, ...) whose bytes went to the stream directly.
    WriteDirect,
    /// A data call (`read`, `recv`, ...) whose bytes came from the stream directly.
    ReadDirect,
    /// A blocking direct read that waited on the stream in the pump's place and was woken
    /// by bytes (or the end).
    ReadStoodIn,
    /// A poll or epoll wait, standing in for the pump, reported a stream's bytes.
    WaitStoodIn,
}

const EVENTS: [(Event, &str); 17] = [
    (Event::ConnectRdma, "connect_rdma"),
    (Event::ConnectTcpRule, "connect_tcp_rule"),
    (Event::ConnectTcpRefused, "connect_tcp_refused"),
    (Event::ConnectTcpNoDevice, "connect_tcp_no_device"),
    (Event::ConnectTcpTimeout, "connect_tcp_timeout"),
    (Event::ConnectTcpError, "connect_tcp_error"),
    (Event::ConnectInProgress, "connect_in_progress"),
    (Event::ListenRdma, "listen_rdma"),
    (Event::ListenTcpRule, "listen_tcp_rule"),
    (Event::ListenTcpNoDevice, "listen_tcp_no_device"),
    (Event::ListenTcpError, "listen_tcp_error"),
    (Event::AcceptRdma, "accept_rdma"),
    (Event::AcceptTcp, "accept_tcp"),
    (Event::WriteDirect, "write_direct"),
    (Event::ReadDirect, "read_direct"),
    (Event::ReadStoodIn, "read_stood_in"),
    (Event::WaitStoodIn, "wait_stood_in"),
];

#[allow(clippy::declare_interior_mutable_const)] // the initialiser of the array below
const ZERO: AtomicU64 = AtomicU64::new(0);
static COUNTS: [AtomicU64; EVENTS.len()] = [ZERO; EVENTS.len()];

/// Counts one `event`.
pub(crate) fn count(event: Event) {
    COUNTS[event as usize].fetch_add(1, Ordering::Relaxed);
}

/// Sets every counter to zero (in a forked child).
pub(crate) fn reset() {
    for c in &COUNTS {
        c.store(0, Ordering::Relaxed);
    }
}

/// The summary line: `trespass-preload pid=N connect_rdma=1 ...`, every counter, in a fixed
/// order.
pub(crate) fn summary(pid: u32) -> String {
    let mut line = format!("trespass-preload pid={pid}");
    for (event, name) in EVENTS {
        let n = COUNTS[event as usize].load(Ordering::Relaxed);
        line.push_str(&format!(" {name}={n}"));
    }
    line
}

/// Writes the summary where `to` says. Errors are reported on stderr: at exit there is no
/// one else to tell.
pub(crate) fn report(to: &Stats) {
    let line = summary(std::process::id()) + "\n";
    match to {
        Stats::Off => {}
        Stats::Stderr => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        Stats::File(path) => {
            // One write of one line, appended: processes sharing the file (a server and
            // its forked children) do not interleave within a line.
            let r = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(line.as_bytes()));
            if let Err(e) = r {
                let _ = writeln!(
                    std::io::stderr(),
                    "trespass-preload: cannot append the counters to {}: {e}",
                    path.display()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_every_counter_once_in_order() {
        count(Event::AcceptTcp);
        count(Event::AcceptTcp);
        let line = summary(42);
        assert!(
            line.starts_with("trespass-preload pid=42 connect_rdma="),
            "{line}"
        );
        let names: Vec<&str> = line
            .split(' ')
            .skip(2)
            .map(|kv| kv.split('=').next().unwrap())
            .collect();
        let expected: Vec<&str> = EVENTS.iter().map(|(_, n)| *n).collect();
        assert_eq!(names, expected);
        // Counters only grow (other tests in this binary may count too).
        let n: u64 = line
            .split(' ')
            .find_map(|kv| kv.strip_prefix("accept_tcp="))
            .unwrap()
            .parse()
            .unwrap();
        assert!(n >= 2, "{line}");
        for (i, (event, _)) in EVENTS.iter().enumerate() {
            assert_eq!(*event as usize, i, "EVENTS is in the enum's order");
        }
    }

    #[test]
    fn a_stats_file_gets_one_line_per_report() {
        let dir =
            std::env::temp_dir().join(format!("trespass-preload-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats");
        let _ = std::fs::remove_file(&path);
        report(&Stats::File(path.clone()));
        report(&Stats::File(path.clone()));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.lines().all(|l| l.starts_with("trespass-preload pid=")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
