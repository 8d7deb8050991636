//! What a client's run is ([`Plan`], resolved from its options) and what it asks of the
//! server for each size on each connection ([`Request`], encoded on the stream itself), and
//! the server's checks of a request against its own options.

use serde::{Deserialize, Serialize};

use crate::cli::{
    StreamArgs, Test, STREAM_MAX_CONNECTIONS as MAX_CONNECTIONS, STREAM_MAX_SIZE as MAX_SIZE,
};

/// Iterations per size unless `--iters` says otherwise.
pub const DEFAULT_ITERS: u64 = 1000;

/// How the bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transfer {
    /// Stream bytes: `write_all` and `read_exact`.
    Stream,
    /// One trespass message per `size` bytes: `send_msg` and `recv_msg`.
    Messages,
    /// One lent message per `size` bytes (zero-copy): `lend_msg` and `reclaim`, and
    /// `recv_msg` at the receiver.
    Lent,
}

impl Transfer {
    /// How the bytes travel, in words for the banner.
    pub(super) fn describe(self) -> &'static str {
        match self {
            Transfer::Stream => "byte stream (write_all / read_exact)",
            Transfer::Messages => "messages (send_msg / recv_msg)",
            Transfer::Lent => "lent messages, zero-copy (lend_msg / reclaim, recv_msg)",
        }
    }
}

/// A client's run, resolved from its options.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Latency or bandwidth.
    pub test: Test,
    /// The sizes, in run order.
    pub sizes: Vec<u64>,
    /// Iterations per size and connection.
    pub iterations: u64,
    /// Stream bytes or messages.
    pub transfer: Transfer,
    /// Parallel connections.
    pub connections: u32,
    /// Whether the sizes are `--all`'s.
    pub all_sizes: bool,
}

/// The sizes of `--all`: 1 B to 4 MiB in powers of two.
pub fn all_sizes() -> Vec<u64> {
    (0..=22).map(|k| 1u64 << k).collect()
}

/// The size used without `-s` or `-a`.
pub fn default_size(test: Test) -> u64 {
    match test {
        Test::Lat => 64,
        Test::Bw => 65536,
    }
}

impl Plan {
    /// The client's run from its options; refuses combinations that make no sense, naming
    /// the option.
    pub fn client(a: &StreamArgs) -> Result<Plan, String> {
        if a.bind.is_some() {
            return Err(
                "--bind is the server's listening address; a client (given a server address) \
                 connects through whatever device reaches the server"
                    .into(),
            );
        }
        let iterations = a.iterations.unwrap_or(DEFAULT_ITERS);
        if a.test == Test::Lat && iterations < 3 {
            return Err(format!(
                "-n {iterations}: a latency run needs at least 3 round trips (the statistics \
                 drop the two largest samples, as perftest's)"
            ));
        }
        let connections = a.connections.unwrap_or(1);
        if a.test == Test::Lat {
            // Each round trip keeps its post stamp and then its sample, per connection, all
            // allocated before the run: refuse what cannot fit rather than fail to allocate.
            let per_iteration = 16 * u64::from(connections.max(1));
            let most = crate::params::MAX_STAMP_BYTES / per_iteration;
            if iterations > most {
                return Err(format!(
                    "-n {iterations} is more than stride-perf records: each round trip keeps \
                     {per_iteration} bytes of timestamps and samples, and it allows {} GiB \
                     (at most -n {most} here); use a smaller -n",
                    crate::params::MAX_STAMP_BYTES >> 30
                ));
            }
        }
        let sizes = if a.all_sizes {
            all_sizes()
        } else {
            vec![a.size.unwrap_or(default_size(a.test))]
        };
        Ok(Plan {
            test: a.test,
            sizes,
            iterations,
            transfer: if a.lend {
                Transfer::Lent
            } else if a.messages {
                Transfer::Messages
            } else {
                Transfer::Stream
            },
            connections,
            all_sizes: a.all_sizes,
        })
    }

    /// The request that sets up `size` on connection `index`.
    pub fn request(&self, index: u32, size: u64) -> Request {
        Request {
            test: self.test,
            transfer: self.transfer,
            all_sizes: self.all_sizes,
            connections: self.connections,
            index,
            size,
            iterations: self.iterations,
        }
    }
}

/// The server's options checked before it listens.
pub fn check_server(a: &StreamArgs) -> Result<(), String> {
    if a.json.is_some() {
        return Err("--json is the client's: the client measures, the server only serves".into());
    }
    if a.test == Test::Lat && a.iterations.is_some_and(|n| n < 3) {
        return Err(
            "-n: a latency run needs at least 3 round trips (the statistics drop the two \
             largest samples)"
                .into(),
        );
    }
    Ok(())
}

/// What a client asks of the server for one size on one connection. `size` 0 ends the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Latency or bandwidth.
    pub test: Test,
    /// Stream bytes or messages.
    pub transfer: Transfer,
    /// Whether the client runs `--all`.
    pub all_sizes: bool,
    /// The client's connection count.
    pub connections: u32,
    /// This connection's index among them, from 0.
    pub index: u32,
    /// Message size; 0: the run is over.
    pub size: u64,
    /// Iterations of this size on this connection.
    pub iterations: u64,
}

/// The request's first bytes.
const MAGIC: [u8; 8] = *b"STRDSTRM";
/// The request's layout version.
const VERSION: u16 = 1;
/// Bytes of an encoded [`Request`].
pub const REQUEST_LEN: usize = 40;

impl Request {
    /// The request that ends a connection's run.
    pub fn done(plan: &Plan, index: u32) -> Request {
        plan.request(index, 0)
    }

    /// Whether this request ends the run.
    pub fn is_done(&self) -> bool {
        self.size == 0
    }

    /// The request on the wire: magic, version, test, flags, connections, index, then size
    /// and iterations, little-endian.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[10] = match self.test {
            Test::Lat => 0,
            Test::Bw => 1,
        };
        b[11] = u8::from(self.transfer == Transfer::Messages)
            | (u8::from(self.all_sizes) << 1)
            | (u8::from(self.transfer == Transfer::Lent) << 2);
        b[12..16].copy_from_slice(&self.connections.to_le_bytes());
        b[16..20].copy_from_slice(&self.index.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..40].copy_from_slice(&self.iterations.to_le_bytes());
        b
    }

    /// Reads a request, refusing anything that is not one of this version's.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Request, String> {
        if b[..8] != MAGIC {
            return Err("the client is not a stride-perf stream client".into());
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != VERSION {
            return Err(format!(
                "the client speaks version {version} of stride-perf stream's setup, this \
                 server {VERSION}: run the same stride-perf on both sides"
            ));
        }
        let test = match b[10] {
            0 => Test::Lat,
            1 => Test::Bw,
            t => return Err(format!("unknown test {t} in the client's request")),
        };
        if b[11] & !7 != 0 || b[11] & 5 == 5 {
            return Err(format!(
                "unknown flags {:#x} in the client's request",
                b[11]
            ));
        }
        let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let r = Request {
            test,
            transfer: if b[11] & 1 != 0 {
                Transfer::Messages
            } else if b[11] & 4 != 0 {
                Transfer::Lent
            } else {
                Transfer::Stream
            },
            all_sizes: b[11] & 2 != 0,
            connections: word(12),
            index: word(16),
            size: long(24),
            iterations: long(32),
        };
        if r.connections == 0 || r.connections > MAX_CONNECTIONS || r.index >= r.connections {
            return Err(format!(
                "connection {} of {} in the client's request",
                r.index, r.connections
            ));
        }
        if r.size > MAX_SIZE {
            return Err(format!(
                "size {} in the client's request is above {MAX_SIZE}",
                r.size
            ));
        }
        if !r.is_done() && (r.iterations == 0 || (r.test == Test::Lat && r.iterations < 3)) {
            return Err(format!(
                "{} iterations in the client's request",
                r.iterations
            ));
        }
        Ok(r)
    }
}

/// The settings given on the server's command line that differ from the client's request,
/// each as a sentence; empty when the server may serve it. What the server was not given,
/// it takes from the client.
pub fn mismatches(a: &StreamArgs, r: &Request) -> Vec<String> {
    let mut out = Vec::new();
    if a.test != r.test {
        out.push(format!(
            "the server runs stream {}, the client stream {}",
            a.test.as_str(),
            r.test.as_str()
        ));
    }
    if a.messages && r.transfer != Transfer::Messages {
        out.push("the server was given --messages, the client was not".into());
    }
    if a.lend && r.transfer != Transfer::Lent {
        out.push("the server was given --lend, the client was not".into());
    }
    if a.all_sizes && !r.all_sizes {
        out.push("the server was given -a, the client was not".into());
    }
    if let Some(s) = a.size {
        if r.all_sizes {
            out.push(format!("the server was given -s {s}, the client -a"));
        } else if !r.is_done() && r.size != s {
            out.push(format!(
                "the server was given -s {s}, the client -s {}",
                r.size
            ));
        }
    }
    if let Some(n) = a.iterations {
        if !r.is_done() && r.iterations != n {
            out.push(format!(
                "the server was given -n {n}, the client -n {}",
                r.iterations
            ));
        }
    }
    if let Some(c) = a.connections {
        if r.connections != c {
            out.push(format!(
                "the server was given --connections {c}, the client --connections {}",
                r.connections
            ));
        }
    }
    out
}

/// The differences between a later connection's request and the first one's (the run's).
pub(super) fn differs_from_run(first: &Request, r: &Request) -> Option<String> {
    (first.test != r.test
        || first.transfer != r.transfer
        || first.connections != r.connections
        || first.all_sizes != r.all_sizes)
        .then(|| {
            "a connection's request differs from the run's first connection (test, transfer, \
             --connections or -a)"
                .to_owned()
        })
}
