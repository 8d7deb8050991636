//! The protocol's messages and the numbers both sides agree on: the frame's magic, version
//! and limits, the queue-pair endpoints, and the 24-bit and MTU rules they obey.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::params::TestParams;
use crate::preflight::PortProfile;
use crate::report::SideReport;

/// Frame magic.
pub const MAGIC: &[u8; 4] = b"STRD";
/// Protocol version; bumped whenever a message changes.
pub const VERSION: u16 = 2;
/// Largest payload accepted, to refuse garbage early.
pub const MAX_PAYLOAD: u32 = 1 << 20;
/// How long the rest of a frame may take once its first bytes came.
pub const FRAME_LIMIT: Duration = Duration::from_secs(5);

/// The largest QP number, PSN and DCT number: they have 24 bits on the wire.
pub const MAX_24_BITS: u32 = (1 << 24) - 1;

/// The path MTUs in bytes, the only values a port's active MTU takes.
pub const PATH_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// One queue pair's address, for the peer to connect to and to target with RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpEndpoint {
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// GID, 16 bytes in network order.
    pub gid: [u8; 16],
    /// Remote key of the buffer RDMA operations target.
    pub rkey: u32,
    /// Address of that buffer.
    pub addr: u64,
    /// The sender's active MTU in bytes (the two sides use the smaller).
    pub mtu: u32,
    /// With `-c DC`, on the side the peer's operations reach: the DC target of this QP
    /// index, which every request of the peer's must name. Absent otherwise (and from
    /// versions without DC, which the handshake's agreement on `-c` keeps apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dc: Option<DcEndpoint>,
}

/// A DC target's address (`-c DC`): its DCT number and the access key that requests to it
/// must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DcEndpoint {
    /// The DCT number.
    pub dctn: u32,
    /// The DC access key.
    pub key: u64,
}

/// A message of the protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// The client's opening: its parameters.
    Hello {
        /// The client's test parameters.
        params: TestParams,
    },
    /// The server agrees.
    Agree,
    /// The server refuses: the parameters differ.
    Refuse {
        /// One line per setting that differs, from the server's point of view.
        mismatches: Vec<String>,
    },
    /// The sender's port, for the pre-flight diagnosis (protocol version 2).
    Preflight {
        /// The port's link layer, MTU and GIDs.
        profile: PortProfile,
    },
    /// The sender's queue pairs, one per QP in order.
    Endpoints {
        /// The endpoints.
        qps: Vec<QpEndpoint>,
    },
    /// The sender is ready for the next step (a barrier).
    Ready {
        /// What step the sender reached, so that both sides check they are in step.
        step: String,
    },
    /// The sender's results.
    Results {
        /// What the sender measured.
        report: SideReport,
    },
    /// The sender hit an error and stops; the receiver should stop too.
    Abort {
        /// Why.
        reason: String,
    },
}

impl Message {
    /// The message's name, for error messages.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Agree => "agree",
            Message::Refuse { .. } => "refuse",
            Message::Preflight { .. } => "preflight",
            Message::Endpoints { .. } => "endpoints",
            Message::Ready { .. } => "ready",
            Message::Results { .. } => "results",
            Message::Abort { .. } => "abort",
        }
    }
}
