//! [`Config`]: a connection's sizes and timers, and the way to connect or listen with them.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::core::Limits;
use crate::stream::{Listener, Stream};
use crate::wire::{MAX_RING, MIN_RECV_DEPTH, MIN_RING};

/// The smallest shared receive queue: the receives one connection is promised at least.
const MIN_SHARED_DEPTH: u32 = MIN_RECV_DEPTH as u32;

/// The largest shared receive queue asked for (devices allow less: rxe and mlx5 about
/// 2^15 to 2^22; creating a larger one fails with the device's limit named).
const MAX_SHARED_DEPTH: u32 = 1 << 22;

/// How connections are made: buffer sizes, queue depths, timers. Both sides choose their
/// own; each tells the other its receive ring in the handshake.
///
/// Memory per connection: `ring_size + send_buffer` bytes of registered memory (512 KiB by
/// default), plus the QP's `send_depth + recv_depth` work queue entries and a CQ of the same
/// size; in the [shared-receive-queue mode](Self::shared_receive_queue), `send_depth` work
/// queue entries and CQ entries, the receives being the device pool's
/// (`docs/trespass-protocol.md`, "Memory per connection").
///
/// ```no_run
/// use std::time::Duration;
/// let stream = trespass::Config::new()
///     .ring_size(1 << 20)
///     .keepalive(Some(Duration::from_secs(5)))
///     .connect("198.18.0.1:7471")?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) ring_size: u32,
    pub(crate) send_buffer: u32,
    pub(crate) recv_depth: u16,
    pub(crate) send_depth: u32,
    pub(crate) max_write: u32,
    pub(crate) max_message: u32,
    pub(crate) max_inline: u32,
    pub(crate) keepalive: Option<Duration>,
    pub(crate) busy_poll: Duration,
    /// `None`: the default, [`BUSY_POLL_MAX`], for both front ends.
    pub(crate) busy_poll_max: Option<Duration>,
    pub(crate) connect_timeout: Duration,
    pub(crate) linger: Duration,
    pub(crate) retry_count: u8,
    pub(crate) backlog: u16,
    pub(crate) shared_receive_queue: Option<u32>,
}

/// The adaptive spin's limit of both front ends when [`Config::busy_poll_max`] is not set.
pub(crate) const BUSY_POLL_MAX: Duration = Duration::from_micros(750);

impl Default for Config {
    fn default() -> Self {
        Config {
            ring_size: 256 * 1024,
            send_buffer: 256 * 1024,
            recv_depth: 128,
            send_depth: 128,
            max_write: 64 * 1024,
            max_message: 64 << 20,
            max_inline: 64,
            keepalive: Some(Duration::from_secs(30)),
            busy_poll: Duration::from_micros(20),
            busy_poll_max: None,
            connect_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(10),
            retry_count: 7,
            backlog: 1024,
            shared_receive_queue: None,
        }
    }
}

impl Config {
    /// The defaults: 256 KiB receive ring and send buffer, 128 receives and 128 sends, 64 KiB
    /// writes, 64 MiB messages, 64 bytes inline, keep-alive every 30 s, 20 µs of busy
    /// polling before sleeping, 10 s to connect and to linger on close.
    pub fn new() -> Config {
        Config::default()
    }

    /// This side's receive ring in bytes (4 KiB to 256 MiB): how much the peer may write
    /// ahead of this side's reads.
    pub fn ring_size(&mut self, bytes: u32) -> &mut Self {
        self.ring_size = bytes;
        self
    }

    /// This side's send buffer in bytes (at least 4 KiB): how much a write may copy before
    /// the peer's NIC has taken the bytes before it.
    pub fn send_buffer(&mut self, bytes: u32) -> &mut Self {
        self.send_buffer = bytes;
        self
    }

    /// Receives posted for the peer's writes (8 to 65535): how many writes with immediate
    /// may be in flight towards this side. (Unread messages are bounded by the ring: each
    /// costs 64 bytes of it besides its bytes.)
    pub fn recv_depth(&mut self, n: u16) -> &mut Self {
        self.recv_depth = n;
        self
    }

    /// Send queue depth (at least 8).
    pub fn send_depth(&mut self, n: u32) -> &mut Self {
        self.send_depth = n;
        self
    }

    /// The largest single RDMA WRITE in bytes (at least 1).
    pub fn max_write(&mut self, bytes: u32) -> &mut Self {
        self.max_write = bytes;
        self
    }

    /// The largest message this side accepts from [`Stream::recv_msg`]; the peer learns it
    /// and refuses to send larger ones.
    pub fn max_message(&mut self, bytes: u32) -> &mut Self {
        self.max_message = bytes;
        self
    }

    /// Writes up to this many bytes are copied into the work request (inline); the device
    /// may allow fewer.
    pub fn max_inline(&mut self, bytes: u32) -> &mut Self {
        self.max_inline = bytes;
        self
    }

    /// Keep-alive period: after this long without a word from the peer, a probe goes out,
    /// and if the peer answers nothing within another period after its NIC acknowledged
    /// the probe, the connection fails with a keep-alive error (a probe the NIC never
    /// acknowledges ends as unreachable when the transport's retries run out). A process-wide helper thread answers probes for connections no
    /// thread is using. `None` turns it off (a stopped peer is then noticed only by a
    /// write that its NIC does not acknowledge, or never).
    pub fn keepalive(&mut self, period: Option<Duration>) -> &mut Self {
        self.keepalive = period;
        self
    }

    /// How long a blocking call spins polling the completion queue before it sleeps on the
    /// completion channel, at least (0: sleep at once unless the adaptive spin says
    /// otherwise; see [`busy_poll_max`](Self::busy_poll_max)). However long, a spin ends at
    /// the call's read or write timeout, and from its first millisecond on it looks every
    /// millisecond for the peer's disconnect and runs keep-alive.
    pub fn busy_poll(&mut self, d: Duration) -> &mut Self {
        self.busy_poll = d;
        self
    }

    /// The adaptive spin's limit. A connection learns how long its waits take when they end
    /// while it spins; while they keep doing so, a wait spins up to twice their average
    /// (within this limit) before sleeping, since waking from the completion channel costs
    /// more than such a wait. After 8 waits in a row that had to sleep (an idle or slow
    /// peer) it spins only [`busy_poll`](Self::busy_poll), and one wait in 16 spins the whole
    /// limit to see whether the peer is quick again (a wait for an answer caught after such
    /// sleeps starts the average again from its own length). A limit at or below
    /// `busy_poll` turns the adaptation off.
    ///
    /// Default 750 µs, in a read that waits for an answer (one that
    /// begins after this side wrote since its last read wait): long enough for the two sides
    /// of a ping-pong that both slept to find each other again where a wake-up is slow (each
    /// side's wait then holds the other's wake-up; in the SoftRoCE guest 250 µs left small
    /// round trips at the sleeping level, twice as long). Every other wait (a reader of a
    /// bulk transfer, a writer waiting for room) spins at most a third of the limit: there
    /// the spin took the CPU the emulated device needs to move the bytes. And a blocking
    /// wait adapts only while no more threads of the process wait in trespass's blocking
    /// calls than half its cores (counted when the wait begins; else it spins just
    /// `busy_poll`): many blocking threads per core lose from long spins, since one thread's
    /// spin is time the others wait. `docs/trespass-perf.md`, "The spin limit", has the
    /// numbers. A host whose wake-up costs microseconds loses little by sleeping; a lower
    /// limit there saves CPU.
    ///
    /// The tokio front end uses the same limit the same way (the whole of it for an answer,
    /// a third for other waits), but adapts only while its runtime has no more tasks alive
    /// than worker threads instead of counting threads, unless the stream's
    /// `set_busy_poll_max` fixes the choice (a runtime thread may serve many connections);
    /// setting the limit here sets it for both front ends.
    pub fn busy_poll_max(&mut self, d: Duration) -> &mut Self {
        self.busy_poll_max = Some(d);
        self
    }

    /// The limit for a connect, and for the handshake of each accepted connection.
    pub fn connect_timeout(&mut self, d: Duration) -> &mut Self {
        self.connect_timeout = d;
        self
    }

    /// How long dropping a stream waits for its last bytes to reach the peer.
    pub fn linger(&mut self, d: Duration) -> &mut Self {
        self.linger = d;
        self
    }

    /// The transport's retry count (0 to 7): how often an unacknowledged packet is sent
    /// again before the connection fails as unreachable.
    pub fn retry_count(&mut self, n: u8) -> &mut Self {
        self.retry_count = n.min(7);
        self
    }

    /// How many connection requests a listener holds while its application has not
    /// accepted them yet (default 1024; the kernel caps it at `net.rdma_ucm.max_backlog`,
    /// 1024 unless raised). Requests beyond it are not answered, as a full TCP accept
    /// queue drops SYNs: the client's connection manager sends them again (every 4 s or so
    /// with rdma_cm's defaults), so they connect once the listener catches up, or fail
    /// with the client's connect timeout.
    pub fn backlog(&mut self, n: u16) -> &mut Self {
        self.backlog = n.max(1);
        self
    }

    /// Draws the connection's receives from one shared receive queue per RDMA device, made
    /// with `depth` receives by the first connection that asks (later ones share it, at the
    /// depth it was made with, while any connection uses it); `None` (the default): each
    /// connection has a receive queue of its own, `recv_depth` deep.
    ///
    /// Every write with immediate data uses a receive, and receives carry no buffer (the
    /// bytes land in the connection's ring), so the shared mode saves receive queue and
    /// completion queue entries, not registered memory: a connection then has no receive
    /// queue and a CQ of `send_depth + 1` entries, and the device has one SRQ and one CQ of
    /// `depth`. Each peer is still promised `recv_depth` receives; when more writes arrive
    /// at once than the pool holds, the peer's NIC retries (the shared side asks its peers
    /// for receiver-not-ready retries for ever, 0.64 ms apart; a process that stopped with
    /// its pool empty is found by the writer's keep-alive): size `depth` for the
    /// connections that write at the same moment times their `recv_depth`, and the rest
    /// is free. Both sides choose their mode alone; the wire protocol is the same.
    ///
    /// ```no_run
    /// let listener = trespass::Config::new()
    ///     .recv_depth(16)
    ///     .shared_receive_queue(Some(4096))
    ///     .bind("198.18.0.1:7471")?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn shared_receive_queue(&mut self, depth: Option<u32>) -> &mut Self {
        self.shared_receive_queue = depth;
        self
    }

    /// Connects to `addr` (the first address it resolves to) with this configuration.
    ///
    /// # Errors
    ///
    /// An invalid configuration (`InvalidInput`), or what [`Stream::connect`] returns.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> io::Result<Stream> {
        let addr = first_addr(addr)?;
        self.check()?;
        Ok(crate::stream::connect(self, addr, self.connect_timeout)?)
    }

    /// Listens on `addr` with this configuration; every accepted stream uses it.
    ///
    /// # Errors
    ///
    /// An invalid configuration (`InvalidInput`), or what [`Listener::bind`] returns.
    pub fn bind(&self, addr: impl ToSocketAddrs) -> io::Result<Listener> {
        let addr = first_addr(addr)?;
        self.check()?;
        Ok(crate::stream::bind(self, addr)?)
    }

    pub(crate) fn check(&self) -> io::Result<()> {
        let bad = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        if !(MIN_RING..=MAX_RING).contains(&self.ring_size) {
            return bad(format!(
                "ring_size {} is outside {MIN_RING}..={MAX_RING}",
                self.ring_size
            ));
        }
        if self.send_buffer < MIN_RING {
            return bad(format!(
                "send_buffer {} is below {MIN_RING}",
                self.send_buffer
            ));
        }
        if self.recv_depth < MIN_RECV_DEPTH {
            return bad(format!(
                "recv_depth {} is below {MIN_RECV_DEPTH}",
                self.recv_depth
            ));
        }
        if self.send_depth < 8 {
            return bad(format!("send_depth {} is below 8", self.send_depth));
        }
        if self.max_write == 0 {
            return bad("max_write is 0".into());
        }
        if let Some(depth) = self.shared_receive_queue {
            if !(MIN_SHARED_DEPTH..=MAX_SHARED_DEPTH).contains(&depth) {
                return bad(format!(
                    "a shared receive queue of {depth} receives is outside \
                     {MIN_SHARED_DEPTH}..={MAX_SHARED_DEPTH}"
                ));
            }
        }
        if self.keepalive == Some(Duration::ZERO) {
            return bad("a keep-alive period of 0; use None to turn keep-alive off".into());
        }
        Ok(())
    }

    pub(crate) fn limits(&self) -> Limits {
        Limits {
            ring_size: self.ring_size,
            send_buffer: self.send_buffer,
            recv_depth: self.recv_depth,
            send_depth: self.send_depth,
            max_write: self.max_write.min(crate::wire::MAX_DATA_LEN),
            max_message: self.max_message,
            lends: true,
        }
    }
}

pub(crate) fn first_addr(addr: impl ToSocketAddrs) -> io::Result<SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(c: &Config, says: &str) {
        let err = c.check().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains(says), "{err} should say {says:?}");
    }

    #[test]
    fn a_shared_receive_queue_outside_its_bounds_is_refused_with_them() {
        let mut c = Config::new();
        assert!(c.check().is_ok(), "the defaults");
        c.shared_receive_queue(Some(MIN_SHARED_DEPTH));
        assert!(c.check().is_ok());
        c.shared_receive_queue(Some(MAX_SHARED_DEPTH));
        assert!(c.check().is_ok());
        c.shared_receive_queue(Some(MIN_SHARED_DEPTH - 1));
        refused(&c, "outside 8..=4194304");
        c.shared_receive_queue(Some(MAX_SHARED_DEPTH + 1));
        refused(&c, "a shared receive queue of 4194305 receives");
        c.shared_receive_queue(None);
        assert!(c.check().is_ok(), "off again");
    }

    #[test]
    fn the_other_sizes_are_refused_outside_their_bounds() {
        refused(Config::new().ring_size(MIN_RING - 1), "ring_size");
        refused(Config::new().send_buffer(MIN_RING - 1), "send_buffer");
        refused(Config::new().recv_depth(MIN_RECV_DEPTH - 1), "recv_depth");
        refused(Config::new().send_depth(7), "send_depth");
        refused(Config::new().max_write(0), "max_write");
        refused(Config::new().keepalive(Some(Duration::ZERO)), "keep-alive");
    }
}
