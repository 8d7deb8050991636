//! What rdma-core's `ibv_xsrq_pingpong` puts on the TCP connection, so our `xsrq_pingpong`
//! and theirs talk.
//!
//! Each side sends one 66-byte message per connection: `LLLL:RRRRRR:SSSSSS:PPPPPP:QQQQQQ:GID`
//! and a NUL, in lowercase hex: the port's LID (4 digits), the XRC receive QP's number, the
//! XRC send QP's number, the PSN both of its QPs start sending at, the XRC SRQ's number (6
//! digits each) and the GID in 32 digits in wire order. At the end, each side sends `END`
//! and a NUL (4 bytes) so that neither closes its QPs while the other still expects a message
//! through them: the client first, then the server to every client.
//!
//! The attributes each QP is moved with are here too ([`init`], [`recv_rtr`], [`recv_rts`],
//! [`send_rtr`], [`send_rts`]): the same masks as rdma-core's program, so that both sides
//! agree on PSNs and timers, checked against the state table in the tests.

use sideway::address_handle::AddressVector;
use sideway::device::Mtu;
use sideway::gid::Gid;
use sideway::memory_region::AccessFlags;
use sideway::queue_pair::{QpState, QueuePairAttribute};

/// Bytes of one endpoint message, the NUL included (`MSG_SIZE`).
pub const MSG_SIZE: usize = 66;
/// The termination message (`END` and its NUL).
pub const TERMINATION: &[u8; 4] = b"END\0";

/// One side's endpoint as the message carries it (`struct pingpong_dest`'s wire fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XsrqDest {
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// The XRC receive QP's number, which the peer's send QP connects to.
    pub recv_qpn: u32,
    /// The XRC send QP's number, which the peer's receive QP connects to.
    pub send_qpn: u32,
    /// The first PSN this side's QPs send with.
    pub psn: u32,
    /// The XRC SRQ the peer's sends land in.
    pub srqn: u32,
    /// The GID (zero without `-g`).
    pub gid: Gid,
}

impl XsrqDest {
    /// The 66 bytes of the message.
    pub fn encode(&self) -> [u8; MSG_SIZE] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{:06x}:{:06x}:{}",
            self.lid,
            self.recv_qpn & 0xff_ffff,
            self.send_qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.srqn & 0xff_ffff,
            self.gid.to_wire_hex()
        );
        let mut msg = [0u8; MSG_SIZE];
        // 4 + 5 * 7 + 32 = 65 bytes, the last of MSG_SIZE staying NUL.
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// Reads a peer's message; what is wrong with it otherwise (the peer's bytes are not
    /// echoed, only counted).
    pub fn decode(msg: &[u8; MSG_SIZE]) -> Result<Self, String> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(MSG_SIZE);
        let text = std::str::from_utf8(&msg[..end])
            .map_err(|_| "the peer's address message is not text".to_owned())?;
        let fields: Vec<&str> = text.split(':').collect();
        let [lid, recv_qpn, send_qpn, psn, srqn, gid] = fields[..] else {
            return Err(format!(
                "the peer's address message has {} fields, not the 6 of LID:QPN:QPN:PSN:SRQN:GID",
                fields.len()
            ));
        };
        // Hex digits only: from_str_radix alone also takes a leading '+'.
        let hex = |what: &str, s: &str, max: u32| {
            Some(s)
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|s| u32::from_str_radix(s, 16).ok())
                .filter(|&v| v <= max)
                .ok_or_else(|| format!("the peer's {what} is not a hex number up to {max:#x}"))
        };
        Ok(XsrqDest {
            // Bounded to 0xffff by the check.
            lid: hex("LID", lid, 0xffff)? as u16,
            recv_qpn: hex("receive QPN", recv_qpn, 0xff_ffff)?,
            send_qpn: hex("send QPN", send_qpn, 0xff_ffff)?,
            psn: hex("PSN", psn, 0xff_ffff)?,
            srqn: hex("SRQ number", srqn, 0xff_ffff)?,
            gid: Gid::from_wire_hex(gid)
                .map_err(|_| "the peer's GID is not 32 hex digits".to_owned())?,
        })
    }

    /// The line `ibv_xsrq_pingpong` prints for an endpoint (`which`: `local` or `remote`).
    pub fn line(&self, which: &str) -> String {
        format!(
            "{which:>8}: LID {:04x}, QPN RECV {:06x} SEND {:06x}, PSN {:06x}, SRQN {:06x}, GID {}",
            self.lid,
            self.recv_qpn,
            self.send_qpn,
            self.psn,
            self.srqn,
            std::net::Ipv6Addr::from(*self.gid.as_bytes())
        )
    }

    /// Whether the GID's interface ID is set, which makes the path global (a GRH), as
    /// `ibv_xsrq_pingpong` decides.
    pub fn is_global(&self) -> bool {
        self.gid.as_bytes()[8..].iter().any(|&b| b != 0)
    }
}

/// Reset to Init, for both QPs of a connection (the receive QP with remote read and write,
/// the send QP with no remote access).
pub fn init(port: u8, access: AccessFlags) -> QueuePairAttribute {
    let mut attr = QueuePairAttribute::new();
    attr.set_qp_state(QpState::Init)
        .set_pkey_index(0)
        .set_port_num(port)
        .set_qp_access_flags(access);
    attr
}

/// The path to the peer: LID-routed, or global (hop limit 5, from GID index `gid_index`) when
/// the peer's GID has an interface ID.
pub fn path(rem: &XsrqDest, sl: u8, port: u8, gid_index: u8) -> AddressVector {
    let mut av = AddressVector::new();
    av.set_dlid(rem.lid).set_sl(sl).set_port_num(port);
    if rem.is_global() {
        av.set_is_global(true)
            .set_hop_limit(5)
            .set_dgid(rem.gid)
            .set_sgid_index(gid_index);
    }
    av
}

/// The receive QP's Init to RTR: toward the peer's send QP, receiving from its PSN.
pub fn recv_rtr(rem: &XsrqDest, mtu: Mtu, av: AddressVector) -> QueuePairAttribute {
    let mut attr = QueuePairAttribute::new();
    attr.set_qp_state(QpState::Rtr)
        .set_dest_qp_num(rem.send_qpn)
        .set_path_mtu(mtu)
        .set_rq_psn(rem.psn)
        .set_min_rnr_timer(12)
        .set_max_dest_rd_atomic(0)
        .set_ah_attr(av);
    attr
}

/// The receive QP's RTR to RTS (it sends the acknowledgements), from this side's PSN.
pub fn recv_rts(local_psn: u32) -> QueuePairAttribute {
    let mut attr = QueuePairAttribute::new();
    attr.set_qp_state(QpState::Rts)
        .set_timeout(14)
        .set_sq_psn(local_psn);
    attr
}

/// The send QP's Init to RTR: toward the peer's receive QP.
pub fn send_rtr(rem: &XsrqDest, mtu: Mtu, av: AddressVector) -> QueuePairAttribute {
    let mut attr = QueuePairAttribute::new();
    attr.set_qp_state(QpState::Rtr)
        .set_dest_qp_num(rem.recv_qpn)
        .set_path_mtu(mtu)
        .set_rq_psn(rem.psn)
        .set_ah_attr(av);
    attr
}

/// The send QP's RTR to RTS, from this side's PSN, retrying as rdma-core's program does
/// (7 times; RNR retries without end).
pub fn send_rts(local_psn: u32) -> QueuePairAttribute {
    let mut attr = QueuePairAttribute::new();
    attr.set_qp_state(QpState::Rts)
        .set_timeout(14)
        .set_retry_cnt(7)
        .set_rnr_retry(7)
        .set_sq_psn(local_psn)
        .set_max_rd_atomic(0);
    attr
}

#[cfg(test)]
mod tests {
    use super::*;
    use sideway::queue_pair::{diagnose, MaskDiagnosis, QpType};

    /// Every transition both QPs of a connection go through fits the IB state table of its
    /// XRC type (what the kernel checks): nothing missing, nothing not allowed.
    #[test]
    fn each_transition_fits_the_xrc_state_table() {
        let rem = dest();
        let av = path(&rem, 0, 1, 1);
        let none = sideway::queue_pair::QpAttrMask::empty();
        let fits = MaskDiagnosis::Attributes {
            missing: none,
            not_allowed: none,
        };
        let recv = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        for (qp_type, from, attr) in [
            (QpType::XrcRecv, QpState::Reset, init(1, recv)),
            (
                QpType::XrcRecv,
                QpState::Init,
                recv_rtr(&rem, Mtu::Mtu1024, av),
            ),
            (QpType::XrcRecv, QpState::Rtr, recv_rts(0x123)),
            (
                QpType::XrcSend,
                QpState::Reset,
                init(1, AccessFlags::empty()),
            ),
            (
                QpType::XrcSend,
                QpState::Init,
                send_rtr(&rem, Mtu::Mtu1024, av),
            ),
            (QpType::XrcSend, QpState::Rtr, send_rts(0x123)),
        ] {
            let d = diagnose(qp_type, from, attr.qp_state(), attr.mask());
            assert_eq!(d, fits, "{qp_type} from {from} to {}", attr.qp_state());
        }
    }

    fn dest() -> XsrqDest {
        XsrqDest {
            lid: 0x12,
            recv_qpn: 0x11,
            send_qpn: 0x12,
            psn: 0xabcdef,
            srqn: 0x2a5,
            gid: "::ffff:198.18.0.1".parse().unwrap(),
        }
    }

    #[test]
    fn the_message_is_rdma_core_s_format() {
        let msg = dest().encode();
        assert_eq!(
            &msg[..65],
            b"0012:000011:000012:abcdef:0002a5:00000000000000000000ffffc6120001"
        );
        assert_eq!(msg[65], 0);
        assert_eq!(XsrqDest::decode(&msg), Ok(dest()));
    }

    #[test]
    fn the_printed_line_is_rdma_core_s() {
        assert_eq!(
            dest().line("local"),
            "   local: LID 0012, QPN RECV 000011 SEND 000012, PSN abcdef, SRQN 0002a5, GID \
             ::ffff:198.18.0.1"
        );
        assert!(dest().is_global());
        let lid_routed = XsrqDest {
            gid: Gid::ZERO,
            ..dest()
        };
        assert!(!lid_routed.is_global());
        assert!(lid_routed.line("remote").ends_with("GID ::"));
    }

    #[test]
    fn bad_messages_are_refused_with_a_reason() {
        let mut msg = [0u8; MSG_SIZE];
        msg[..5].copy_from_slice(b"hello");
        assert!(XsrqDest::decode(&msg).unwrap_err().contains("1 fields"));
        let mut bad = dest().encode();
        bad[5] = b'g';
        assert!(XsrqDest::decode(&bad).unwrap_err().contains("receive QPN"));
        let mut bad = dest().encode();
        bad[60] = b'z';
        assert!(XsrqDest::decode(&bad).unwrap_err().contains("GID"));
        let mut bad = dest().encode();
        bad[0] = 0xff;
        assert!(XsrqDest::decode(&bad).is_err());
        // A sign is not a hex digit, as in the pingpong endpoint line.
        let text = std::str::from_utf8(&dest().encode()).unwrap().to_owned();
        let first = text.split(':').next().unwrap().to_owned();
        let signed = text.replacen(&first, &format!("+{}", &first[1..]), 1);
        let mut bad = [0u8; MSG_SIZE];
        bad[..signed.trim_end_matches('\0').len()]
            .copy_from_slice(signed.trim_end_matches('\0').as_bytes());
        assert!(
            XsrqDest::decode(&bad).unwrap_err().contains("LID"),
            "{signed:?}"
        );
    }
}
