//! What this process knows about the fds it carries: the addresses to answer
//! getpeername/getsockname with, the TCP options of the connecting side's socket pair, which
//! fds are listeners that also listen for RDMA; and the pump's loopback connections that the
//! program's accept has not returned yet.

use std::collections::HashMap;
use std::ffi::c_int;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A carried connection, as its fd shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conn {
    /// This side's RDMA address.
    pub(crate) local: SocketAddr,
    /// The peer's RDMA address.
    pub(crate) peer: SocketAddr,
    /// The family of the program's socket (`AF_INET` or `AF_INET6`), in which addresses are
    /// written.
    pub(crate) family: c_int,
    /// The fd is one end of a Unix socket pair (the connecting side), whose TCP options this
    /// library answers; else a loopback TCP socket, which has them.
    pub(crate) pair: bool,
    /// `TCP_NODELAY` as the program last set it (socket pairs only).
    pub(crate) nodelay: bool,
    /// The process whose pump carries it (a forked child's copies name the parent).
    pub(crate) owner: u32,
}

/// A connect on a non-blocking socket that returned `EINPROGRESS`: the fd is one end of a
/// socket pair that turns writable once the pump has the connection (over RDMA, or over TCP
/// carried the same way), as a TCP socket does when its connect completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    /// Which connect (the pump finds its fds by it, not by number: the program may have
    /// closed the fd and reused the number meanwhile).
    pub(crate) id: u64,
    /// The family of the program's socket.
    pub(crate) family: c_int,
    /// 0 while the connect is in progress; else why it failed, as `SO_ERROR` reports it
    /// once (and `connect` every time).
    pub(crate) error: c_int,
    /// Whether `SO_ERROR` reported `error` already.
    pub(crate) reported: bool,
}

/// An fd's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A carried connection.
    Conn(Conn),
    /// A connect in progress, or one that failed after returning `EINPROGRESS`.
    Pending(Pending),
    /// A TCP listener that also listens for RDMA, as the pump's listener `id`.
    Listener { id: u64 },
}

/// Where the pump's loopback connection to a listener came from, and whom it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marker {
    pub(crate) peer: SocketAddr,
    pub(crate) local: SocketAddr,
}

/// The fd entries, the pump's connections not yet accepted, and the peers that did not
/// answer an RDMA connection request lately.
#[derive(Default)]
pub(crate) struct Tables {
    fds: HashMap<c_int, Entry>,
    markers: HashMap<SocketAddr, Marker>,
    unanswered: HashMap<IpAddr, Instant>,
}

/// How long a peer that did not answer an RDMA connection request is reached over TCP
/// without asking again: a host that does not answer rdma_cm at all has no RDMA, and each
/// new connection to it would otherwise wait the whole timeout.
pub(crate) const UNANSWERED_FOR: Duration = Duration::from_secs(30);

static TABLES: Mutex<Option<Tables>> = Mutex::new(None);
/// Entries in both maps: close, dup and the name calls look no further while it is 0, so
/// programs that carry nothing pay one atomic load.
static LEN: AtomicUsize = AtomicUsize::new(0);

/// The tables' lock, also for the fork handlers.
pub(crate) fn lock() -> MutexGuard<'static, Option<Tables>> {
    TABLES.lock().unwrap_or_else(|p| p.into_inner())
}

fn with<R>(f: impl FnOnce(&mut Tables) -> R) -> R {
    let mut t = lock();
    let t = t.get_or_insert_with(Tables::default);
    let r = f(t);
    LEN.store(t.fds.len() + t.markers.len(), Ordering::Release);
    r
}

fn empty() -> bool {
    LEN.load(Ordering::Acquire) == 0
}

/// Records `fd`'s entry (replacing any).
pub(crate) fn insert(fd: c_int, entry: Entry) {
    with(|t| t.fds.insert(fd, entry));
}

/// `fd`'s entry.
pub(crate) fn get(fd: c_int) -> Option<Entry> {
    if empty() {
        return None;
    }
    with(|t| t.fds.get(&fd).copied())
}

/// Changes `fd`'s connection entry, if it has one.
pub(crate) fn update(fd: c_int, f: impl FnOnce(&mut Conn)) {
    if empty() {
        return;
    }
    with(|t| {
        if let Some(Entry::Conn(c)) = t.fds.get_mut(&fd) {
            f(c);
        }
    });
}

/// Forgets `fd` (it is being closed, or replaced by dup2). Returns the listener id whose
/// last fd this was, if any: that listener stops listening for RDMA.
pub(crate) fn remove(fd: c_int) -> Option<u64> {
    if empty() {
        return None;
    }
    with(|t| match t.fds.remove(&fd)? {
        Entry::Listener { id } => {
            let still = t.fds.values().any(|e| *e == Entry::Listener { id });
            (!still).then_some(id)
        }
        Entry::Conn(_) | Entry::Pending(_) => None,
    })
}

/// Every fd of pending connect `id` (the one connect made, and its dups) becomes `to`.
/// Returns those fds (none when the program closed them all).
pub(crate) fn settle(id: u64, to: Entry) -> Vec<c_int> {
    with(|t| {
        let mut fds = Vec::new();
        for (fd, e) in t.fds.iter_mut() {
            if matches!(e, Entry::Pending(p) if p.id == id) {
                *e = to;
                fds.push(*fd);
            }
        }
        fds
    })
}

/// `SO_ERROR` on a pending connect: its error, once (then 0), as the kernel reports a TCP
/// socket's.
pub(crate) fn take_pending_error(fd: c_int) -> c_int {
    with(|t| match t.fds.get(&fd) {
        Some(Entry::Pending(p)) if p.error != 0 && !p.reported => {
            let (id, error) = (p.id, p.error);
            for e in t.fds.values_mut() {
                if let Entry::Pending(q) = e {
                    if q.id == id {
                        q.reported = true;
                    }
                }
            }
            error
        }
        _ => 0,
    })
}

/// Gives `new` the entry of `old` (dup).
pub(crate) fn copy(old: c_int, new: c_int) {
    if empty() {
        return;
    }
    with(|t| {
        if let Some(e) = t.fds.get(&old).copied() {
            t.fds.insert(new, e);
        }
    });
}

/// The fds of the connections this process's own pump carries (not those a forked child
/// inherited from its parent, whose pump carries them).
pub(crate) fn carried_here() -> Vec<c_int> {
    if empty() {
        return Vec::new();
    }
    let me = std::process::id();
    with(|t| {
        t.fds
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Conn(c) if c.owner == me))
            .map(|(fd, _)| *fd)
            .collect()
    })
}

/// Records the pump's loopback connection from `source`.
pub(crate) fn add_marker(source: SocketAddr, peer: SocketAddr, local: SocketAddr) {
    with(|t| t.markers.insert(source, Marker { peer, local }));
}

/// Whether the pump's connection from `source` still waits for the program's accept.
pub(crate) fn has_marker(source: SocketAddr) -> bool {
    !empty() && with(|t| t.markers.contains_key(&source))
}

/// Takes the record of the pump's connection from `source`, if it is one.
pub(crate) fn take_marker(source: SocketAddr) -> Option<Marker> {
    if empty() {
        return None;
    }
    with(|t| t.markers.remove(&source))
}

/// Notes that `ip` did not answer an RDMA connection request.
pub(crate) fn note_unanswered(ip: IpAddr) {
    with(|t| {
        let now = Instant::now();
        t.unanswered
            .retain(|_, at| now.duration_since(*at) < UNANSWERED_FOR);
        t.unanswered.insert(ip, now);
    });
}

/// Whether `ip` did not answer an RDMA connection request within [`UNANSWERED_FOR`].
pub(crate) fn recently_unanswered(ip: IpAddr) -> bool {
    with(|t| {
        t.unanswered
            .get(&ip)
            .is_some_and(|at| at.elapsed() < UNANSWERED_FOR)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The tables are process-wide: one test walks through them in order.
    #[test]
    fn entries_follow_close_and_dup_and_listeners_stop_with_their_last_fd() {
        let conn = Conn {
            local: "198.18.0.1:1".parse().unwrap(),
            peer: "198.18.0.2:2".parse().unwrap(),
            family: libc::AF_INET,
            pair: true,
            nodelay: false,
            owner: std::process::id(),
        };
        assert_eq!(get(1000), None);
        insert(1000, Entry::Conn(conn));
        insert(1002, Entry::Conn(Conn { owner: 1, ..conn }));
        copy(1000, 1001);
        let mut here = carried_here();
        here.sort();
        assert_eq!(
            here,
            [1000, 1001],
            "a parent's connections are not this process's"
        );
        assert_eq!(remove(1002), None);
        update(1001, |c| c.nodelay = true);
        assert_eq!(get(1000), Some(Entry::Conn(conn)));
        assert!(matches!(get(1001), Some(Entry::Conn(c)) if c.nodelay));
        assert_eq!(remove(1000), None);
        assert_eq!(get(1000), None);
        assert_eq!(remove(1001), None);

        insert(2000, Entry::Listener { id: 7 });
        copy(2000, 2001);
        assert_eq!(remove(2000), None, "a dup still listens");
        assert_eq!(remove(2001), Some(7), "the last fd stops it");
        assert_eq!(remove(2001), None);

        let source: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        add_marker(source, conn.peer, conn.local);
        assert_eq!(take_marker("127.0.0.1:40001".parse().unwrap()), None);
        assert!(has_marker(source));
        assert_eq!(
            take_marker(source),
            Some(Marker {
                peer: conn.peer,
                local: conn.local
            })
        );
        assert_eq!(take_marker(source), None);
        assert!(empty(), "nothing is left behind");

        let pending = Pending {
            id: 9,
            family: libc::AF_INET,
            error: 0,
            reported: false,
        };
        insert(3000, Entry::Pending(pending));
        copy(3000, 3001);
        insert(3002, Entry::Pending(Pending { id: 10, ..pending }));
        assert_eq!(take_pending_error(3000), 0, "in progress: no error");
        let failed = Pending {
            error: libc::ECONNREFUSED,
            ..pending
        };
        assert_eq!(settle(9, Entry::Pending(failed)).len(), 2);
        assert_eq!(take_pending_error(3001), libc::ECONNREFUSED);
        assert_eq!(take_pending_error(3000), 0, "reported once, for every dup");
        assert!(matches!(get(3002), Some(Entry::Pending(p)) if p.error == 0));
        assert_eq!(settle(10, Entry::Conn(conn)), [3002]);
        assert_eq!(get(3002), Some(Entry::Conn(conn)));
        assert!(
            settle(11, Entry::Conn(conn)).is_empty(),
            "no fd of that connect"
        );
        for fd in [3000, 3001, 3002] {
            remove(fd);
        }
        assert!(empty(), "nothing is left behind");

        let quiet: IpAddr = "198.18.0.9".parse().unwrap();
        assert!(!recently_unanswered(quiet));
        note_unanswered(quiet);
        assert!(recently_unanswered(quiet));
        assert!(!recently_unanswered("198.18.0.8".parse().unwrap()));
    }
}
