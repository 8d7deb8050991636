//! The cluster's control messages, between every rank and rank 0's coordinator, and the
//! one-frame greeting a pair's client sends before the pair's own out-of-band protocol.
//!
//! Framed like the pair channel ([`crate::oob`]): a magic (`STRC` here, so that a control
//! connection that reaches a pair port, or the reverse, is refused by name), a version, a
//! length of at most [`MAX_PAYLOAD`] bytes, and JSON. Each connection is read by one thread
//! that blocks on it; a peer that sends half a frame and stops is caught by the silence
//! bound of whoever waits on that thread, not by the reader.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use serde::{Deserialize, Serialize};

use crate::report::SideReport;

/// Frame magic of cluster control messages.
pub const MAGIC: &[u8; 4] = b"STRC";
/// Version of the control protocol.
pub const VERSION: u16 = 1;
/// Largest control payload: a step's results for a few hundred sizes fit many times over.
pub const MAX_PAYLOAD: u32 = 16 << 20;

/// One rank, as it registers with rank 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The rank.
    pub rank: usize,
    /// The world size this rank was given.
    pub size: usize,
    /// Its host name.
    pub host: String,
    /// Its process id, to find it on its host.
    pub pid: u32,
    /// The RDMA device, port and GID it runs pairs on.
    pub device: String,
    /// The port of that device.
    pub port: u8,
    /// The GID line its banner would print (index, address, type), or the LID.
    pub gid: String,
    /// The address its pair listener takes connections on (`ip:port`).
    pub pair_addr: String,
}

impl Member {
    /// The member with its text made printable and cut (it came from a peer).
    pub fn printable(self) -> Self {
        let text = |s: &str| sideway::peer_text::printable(s, 128);
        Member {
            host: text(&self.host),
            device: text(&self.device),
            gid: text(&self.gid),
            pair_addr: text(&self.pair_addr),
            ..self
        }
    }
}

/// One pair of a step: `client` initiates (sends, writes, reads, or starts the ping-pong),
/// `server` is its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PairJob {
    /// The initiating rank.
    pub client: usize,
    /// The target rank.
    pub server: usize,
}

/// What the client of a pair sends to the coordinator: both sides' reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairResult {
    /// The pair.
    pub pair: PairJob,
    /// The client's report.
    pub client: SideReport,
    /// The server's report, as the pair run handed it over.
    pub server: SideReport,
}

/// A control message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Control {
    /// A rank arrives (rank → 0).
    Register {
        /// Who it is.
        member: Member,
    },
    /// Everyone arrived: the table, indexed by rank (0 → every rank).
    Table {
        /// One entry per rank.
        members: Vec<Member>,
    },
    /// Run these pairs now, all at once (0 → every rank).
    Step {
        /// The step's number, from 0.
        index: usize,
        /// The pairs.
        jobs: Vec<PairJob>,
    },
    /// This rank's pairs of the step are done (rank → 0).
    StepDone {
        /// The step's number.
        index: usize,
        /// The results of the pairs this rank was the client of.
        results: Vec<PairResult>,
    },
    /// A pair of this rank failed (rank → 0).
    Failed {
        /// The step's number.
        index: usize,
        /// Why.
        reason: String,
    },
    /// The run stops (0 → every rank).
    Abort {
        /// Why, naming the rank and host that caused it.
        reason: String,
    },
    /// The report is written; exit (0 → every rank).
    Finish,
    /// Still here (both ways, every second).
    Heartbeat,
    /// A pair's client introduces itself to the server's pair listener.
    PairHello {
        /// The client's rank.
        client: usize,
        /// The step.
        step: usize,
    },
}

/// Writes one message as a frame.
pub fn send(stream: &mut TcpStream, msg: &Control) -> io::Result<()> {
    let payload = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= MAX_PAYLOAD)
        .ok_or_else(|| io::Error::other("a control message of ours is too large"))?;
    let mut frame = Vec::with_capacity(10 + payload.len());
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&VERSION.to_be_bytes());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&payload);
    stream.write_all(&frame)
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    /// The peer closed the connection.
    #[error("closed the connection")]
    Closed,
    /// A socket error.
    #[error("{0}")]
    Io(io::Error),
    /// Not a control frame of this version, or undecodable.
    #[error("sent something that is not a stride-perf cluster message: {0}")]
    Garbage(String),
}

/// Reads exactly one frame (never a byte past it) and decodes it.
pub fn recv(source: &mut impl Read) -> Result<Control, RecvError> {
    let mut header = [0u8; 10];
    read_all(source, &mut header)?;
    let [m0, m1, m2, m3, v0, v1, l0, l1, l2, l3] = header;
    if [m0, m1, m2, m3] != *MAGIC {
        return Err(RecvError::Garbage(format!(
            "it began \"{}\"",
            sideway::peer_text::printable(&String::from_utf8_lossy(&header[..4]), 16)
        )));
    }
    let version = u16::from_be_bytes([v0, v1]);
    if version != VERSION {
        return Err(RecvError::Garbage(format!(
            "control protocol version {version}, this program speaks {VERSION}: run the same \
             stride-perf on every rank"
        )));
    }
    let len = u32::from_be_bytes([l0, l1, l2, l3]);
    if len > MAX_PAYLOAD {
        return Err(RecvError::Garbage(format!("a {len}-byte message")));
    }
    // len <= MAX_PAYLOAD, which fits any usize.
    let mut payload = vec![0u8; len as usize];
    read_all(source, &mut payload)?;
    serde_json::from_slice(&payload).map_err(|e| {
        RecvError::Garbage(sideway::peer_text::printable(
            &e.to_string(),
            sideway::peer_text::PEER_TEXT_MAX,
        ))
    })
}

fn read_all(source: &mut impl Read, buf: &mut [u8]) -> Result<(), RecvError> {
    source.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe => RecvError::Closed,
        _ => RecvError::Io(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(msg: &Control) -> Vec<u8> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        send(&mut a, msg).unwrap();
        drop(a);
        let mut bytes = Vec::new();
        b.read_to_end(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn frames_round_trip_and_stop_at_their_end() {
        let msg = Control::Step {
            index: 3,
            jobs: vec![PairJob {
                client: 1,
                server: 2,
            }],
        };
        let mut bytes = frame(&msg);
        bytes.extend_from_slice(b"next");
        let mut cursor = io::Cursor::new(bytes);
        assert_eq!(recv(&mut cursor).unwrap(), msg);
        assert_eq!(cursor.position(), cursor.get_ref().len() as u64 - 4);
    }

    #[test]
    fn garbage_and_short_frames_are_refused() {
        let e = recv(&mut io::Cursor::new(b"STRD\0\x01\0\0\0\x02{}".to_vec())).unwrap_err();
        assert!(e.to_string().contains("began \"STRD\""), "{e}");
        let e = recv(&mut io::Cursor::new(b"STRC\0\x07\0\0\0\x02{}".to_vec())).unwrap_err();
        assert!(e.to_string().contains("version 7"), "{e}");
        let e = recv(&mut io::Cursor::new(b"STRC\0\x01\xff\0\0\0".to_vec())).unwrap_err();
        assert!(e.to_string().contains("-byte message"), "{e}");
        let e = recv(&mut io::Cursor::new(b"STRC\0\x01\0\0\0\x09{}".to_vec())).unwrap_err();
        assert!(matches!(e, RecvError::Closed), "{e}");
        let e = recv(&mut io::Cursor::new(
            b"STRC\0\x01\0\0\0\x05\x1b[2J}".to_vec(),
        ))
        .unwrap_err()
        .to_string();
        assert!(!e.contains('\u{1b}'), "{e:?}");
    }
}
