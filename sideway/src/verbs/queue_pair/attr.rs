//! Queue pair attributes (`struct ibv_qp_attr` with its `ibv_qp_attr_mask`), the typed enums
//! and flags they use. The address vector (`struct ibv_ah_attr`) inside them is the address
//! handle module's [`AddressVector`].

use std::fmt;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use crate::macros::c_enum;
use crate::verbs::address_handle::AddressVector;
use crate::verbs::device::Mtu;
use crate::verbs::memory_region::AccessFlags;

c_enum! {
    /// The state of a queue pair.
    pub enum QpState: "ibv_qp_state" {
        /// Reset: just created, or reset; nothing can be posted.
        Reset = ffi::ibv_qp_state::IBV_QPS_RESET,
        /// Initialized: receives may be posted.
        Init = ffi::ibv_qp_state::IBV_QPS_INIT,
        /// Ready to receive.
        Rtr = ffi::ibv_qp_state::IBV_QPS_RTR,
        /// Ready to send.
        Rts = ffi::ibv_qp_state::IBV_QPS_RTS,
        /// Send queue drained.
        Sqd = ffi::ibv_qp_state::IBV_QPS_SQD,
        /// Send queue error (UD and UC).
        Sqe = ffi::ibv_qp_state::IBV_QPS_SQE,
        /// Error: outstanding requests are flushed.
        Err = ffi::ibv_qp_state::IBV_QPS_ERR,
    }
}

impl fmt::Display for QpState {
    /// The names the IB spec uses: `Reset`, `Init`, `RTR`, `RTS`, `SQD`, `SQE`, `Error`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "Reset",
            QpState::Init => "Init",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "Error",
            QpState::Unknown(n) => return write!(f, "state {n}"),
        })
    }
}

c_enum! {
    /// The transport service of a queue pair.
    pub enum QpType: "ibv_qp_type" {
        /// Reliable connected.
        Rc = ffi::ibv_qp_type::IBV_QPT_RC,
        /// Unreliable connected.
        Uc = ffi::ibv_qp_type::IBV_QPT_UC,
        /// Unreliable datagram.
        Ud = ffi::ibv_qp_type::IBV_QPT_UD,
        /// Raw Ethernet packets.
        RawPacket = ffi::ibv_qp_type::IBV_QPT_RAW_PACKET,
        /// XRC initiator.
        XrcSend = ffi::ibv_qp_type::IBV_QPT_XRC_SEND,
        /// XRC target.
        XrcRecv = ffi::ibv_qp_type::IBV_QPT_XRC_RECV,
        /// Provider-specific.
        Driver = ffi::ibv_qp_type::IBV_QPT_DRIVER,
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::RawPacket => "raw packet",
            QpType::XrcSend => "XRC send",
            QpType::XrcRecv => "XRC receive",
            QpType::Driver => "driver",
            QpType::Unknown(n) => return write!(f, "type {n}"),
        })
    }
}

c_enum! {
    /// Path migration state (automatic path migration).
    pub enum MigState: "ibv_mig_state" {
        /// Migrated: the alternate path is not armed.
        Migrated = ffi::ibv_mig_state::IBV_MIG_MIGRATED,
        /// Rearm: arming the alternate path.
        Rearm = ffi::ibv_mig_state::IBV_MIG_REARM,
        /// Armed: the alternate path is ready.
        Armed = ffi::ibv_mig_state::IBV_MIG_ARMED,
    }
}

bitflags! {
    /// Which fields of a [`QueuePairAttribute`] are meant (`ibv_qp_attr_mask`).
    #[doc(alias = "ibv_qp_attr_mask")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`: `qp_state`.
        const STATE = ffi::ibv_qp_attr_mask::IBV_QP_STATE;
        /// `IBV_QP_CUR_STATE`: `cur_qp_state`.
        const CUR_STATE = ffi::ibv_qp_attr_mask::IBV_QP_CUR_STATE;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = ffi::ibv_qp_attr_mask::IBV_QP_EN_SQD_ASYNC_NOTIFY;
        /// `IBV_QP_ACCESS_FLAGS`: `qp_access_flags`.
        const ACCESS_FLAGS = ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        /// `IBV_QP_PKEY_INDEX`: `pkey_index`.
        const PKEY_INDEX = ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX;
        /// `IBV_QP_PORT`: `port_num`.
        const PORT = ffi::ibv_qp_attr_mask::IBV_QP_PORT;
        /// `IBV_QP_QKEY`: `qkey`.
        const QKEY = ffi::ibv_qp_attr_mask::IBV_QP_QKEY;
        /// `IBV_QP_AV`: `ah_attr`, the primary path's address vector.
        const AV = ffi::ibv_qp_attr_mask::IBV_QP_AV;
        /// `IBV_QP_PATH_MTU`: `path_mtu`.
        const PATH_MTU = ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU;
        /// `IBV_QP_TIMEOUT`: `timeout`.
        const TIMEOUT = ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT;
        /// `IBV_QP_RETRY_CNT`: `retry_cnt`.
        const RETRY_CNT = ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT;
        /// `IBV_QP_RNR_RETRY`: `rnr_retry`.
        const RNR_RETRY = ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY;
        /// `IBV_QP_RQ_PSN`: `rq_psn`.
        const RQ_PSN = ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`: `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        /// `IBV_QP_ALT_PATH`: `alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`.
        const ALT_PATH = ffi::ibv_qp_attr_mask::IBV_QP_ALT_PATH;
        /// `IBV_QP_MIN_RNR_TIMER`: `min_rnr_timer`.
        const MIN_RNR_TIMER = ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        /// `IBV_QP_SQ_PSN`: `sq_psn`.
        const SQ_PSN = ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`: `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC;
        /// `IBV_QP_PATH_MIG_STATE`: `path_mig_state`.
        const PATH_MIG_STATE = ffi::ibv_qp_attr_mask::IBV_QP_PATH_MIG_STATE;
        /// `IBV_QP_CAP`: `cap`.
        const CAP = ffi::ibv_qp_attr_mask::IBV_QP_CAP;
        /// `IBV_QP_DEST_QPN`: `dest_qp_num`.
        const DEST_QPN = ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN;
        /// `IBV_QP_RATE_LIMIT`: `rate_limit`.
        const RATE_LIMIT = ffi::ibv_qp_attr_mask::IBV_QP_RATE_LIMIT;
        // Bits from newer rdma-core survive.
        const _ = !0;
    }
}

/// Each known mask bit with the name error messages use for it.
const MASK_NAMES: [(QpAttrMask, &str); 22] = [
    (QpAttrMask::STATE, "State"),
    (QpAttrMask::CUR_STATE, "CurState"),
    (QpAttrMask::EN_SQD_ASYNC_NOTIFY, "EnSqdAsyncNotify"),
    (QpAttrMask::ACCESS_FLAGS, "AccessFlags"),
    (QpAttrMask::PKEY_INDEX, "PkeyIndex"),
    (QpAttrMask::PORT, "Port"),
    (QpAttrMask::QKEY, "Qkey"),
    (QpAttrMask::AV, "Av"),
    (QpAttrMask::PATH_MTU, "PathMtu"),
    (QpAttrMask::TIMEOUT, "Timeout"),
    (QpAttrMask::RETRY_CNT, "RetryCnt"),
    (QpAttrMask::RNR_RETRY, "RnrRetry"),
    (QpAttrMask::RQ_PSN, "RqPsn"),
    (QpAttrMask::MAX_QP_RD_ATOMIC, "MaxQpRdAtomic"),
    (QpAttrMask::ALT_PATH, "AltPath"),
    (QpAttrMask::MIN_RNR_TIMER, "MinRnrTimer"),
    (QpAttrMask::SQ_PSN, "SqPsn"),
    (QpAttrMask::MAX_DEST_RD_ATOMIC, "MaxDestRdAtomic"),
    (QpAttrMask::PATH_MIG_STATE, "PathMigState"),
    (QpAttrMask::CAP, "Cap"),
    (QpAttrMask::DEST_QPN, "DestQpn"),
    (QpAttrMask::RATE_LIMIT, "RateLimit"),
];

impl QpAttrMask {
    /// The mask's bits by name, comma-separated (`MinRnrTimer, MaxDestRdAtomic`); bits this
    /// crate does not know appear as `bit N`.
    pub fn names(self) -> impl fmt::Display {
        MaskNames(self)
    }
}

struct MaskNames(QpAttrMask);

impl fmt::Display for MaskNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut sep = |f: &mut fmt::Formatter<'_>| {
            let s = if first { "" } else { ", " };
            first = false;
            f.write_str(s)
        };
        let mut known = QpAttrMask::empty();
        for (bit, name) in MASK_NAMES {
            known |= bit;
            if self.0.contains(bit) {
                sep(f)?;
                f.write_str(name)?;
            }
        }
        let rest = self.0.bits() & !known.bits();
        for i in 0..32 {
            if rest & (1 << i) != 0 {
                sep(f)?;
                write!(f, "bit {i}")?;
            }
        }
        Ok(())
    }
}

/// Work queue sizes of a queue pair (`struct ibv_qp_cap`).
#[doc(alias = "ibv_qp_cap")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCapabilities {
    /// Most outstanding send work requests.
    pub max_send_wr: u32,
    /// Most outstanding receive work requests.
    pub max_recv_wr: u32,
    /// Most scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Most scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// Most bytes of inline data per send work request.
    pub max_inline_data: u32,
}

impl From<ffi::ibv_qp_cap> for QpCapabilities {
    fn from(c: ffi::ibv_qp_cap) -> Self {
        QpCapabilities {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

impl From<QpCapabilities> for ffi::ibv_qp_cap {
    fn from(c: QpCapabilities) -> Self {
        ffi::ibv_qp_cap {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// Attributes for `ibv_modify_qp` and from `ibv_query_qp` (`struct ibv_qp_attr` plus its
/// mask). Each setter also sets its `IBV_QP_*` mask bit, so the mask always names exactly the
/// fields that were set.
///
/// ```
/// use sideway::queue_pair::{QpAttrMask, QpState, QueuePairAttribute};
/// let mut attr = QueuePairAttribute::new();
/// attr.set_qp_state(QpState::Init).set_pkey_index(0).set_port_num(1);
/// assert_eq!(attr.mask(), QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT);
/// ```
#[doc(alias = "ibv_qp_attr")]
#[derive(Clone, Copy)]
pub struct QueuePairAttribute {
    raw: ffi::ibv_qp_attr,
    mask: QpAttrMask,
}

impl Default for QueuePairAttribute {
    fn default() -> Self {
        let av = *AddressVector::default().as_raw();
        QueuePairAttribute {
            raw: ffi::ibv_qp_attr {
                qp_state: 0,
                cur_qp_state: 0,
                path_mtu: 0,
                path_mig_state: 0,
                qkey: 0,
                rq_psn: 0,
                sq_psn: 0,
                dest_qp_num: 0,
                qp_access_flags: 0,
                cap: ffi::ibv_qp_cap::default(),
                ah_attr: av,
                alt_ah_attr: av,
                pkey_index: 0,
                alt_pkey_index: 0,
                en_sqd_async_notify: 0,
                sq_draining: 0,
                max_rd_atomic: 0,
                max_dest_rd_atomic: 0,
                min_rnr_timer: 0,
                port_num: 0,
                timeout: 0,
                retry_cnt: 0,
                rnr_retry: 0,
                alt_port_num: 0,
                alt_timeout: 0,
                rate_limit: 0,
            },
            mask: QpAttrMask::empty(),
        }
    }
}

/// Defines a setter (which also sets a mask bit) and a getter for plain fields.
macro_rules! plain_fields {
    ($( $(#[$doc:meta])* $field:ident / $setter:ident : $ty:ty => $bit:ident; )*) => {$(
        $(#[$doc])*
        #[doc = concat!("\n\nSets `", stringify!($field), "` and `IBV_QP_", stringify!($bit), "`.")]
        pub fn $setter(&mut self, $field: $ty) -> &mut Self {
            self.raw.$field = $field;
            self.mask |= QpAttrMask::$bit;
            self
        }

        $(#[$doc])*
        #[doc = concat!("\n\nReads `", stringify!($field), "`.")]
        pub fn $field(&self) -> $ty {
            self.raw.$field
        }
    )*};
}

impl QueuePairAttribute {
    /// Attributes with nothing set (an empty mask).
    pub fn new() -> Self {
        Self::default()
    }

    /// Wraps a C struct with the mask that says which of its fields count.
    pub fn from_raw(raw: ffi::ibv_qp_attr, mask: QpAttrMask) -> Self {
        QueuePairAttribute { raw, mask }
    }

    /// The C struct.
    pub fn as_raw(&self) -> &ffi::ibv_qp_attr {
        &self.raw
    }

    /// The fields that were set.
    pub fn mask(&self) -> QpAttrMask {
        self.mask
    }

    /// The state to move to (`qp_state`, `IBV_QP_STATE`).
    pub fn set_qp_state(&mut self, state: QpState) -> &mut Self {
        self.raw.qp_state = state.into();
        self.mask |= QpAttrMask::STATE;
        self
    }

    /// The state (`qp_state`): the target of a modify, the current state of a query.
    pub fn qp_state(&self) -> QpState {
        QpState::from(self.raw.qp_state)
    }

    /// The state the caller believes the QP is in (`cur_qp_state`, `IBV_QP_CUR_STATE`).
    pub fn set_cur_qp_state(&mut self, state: QpState) -> &mut Self {
        self.raw.cur_qp_state = state.into();
        self.mask |= QpAttrMask::CUR_STATE;
        self
    }

    /// The assumed current state (`cur_qp_state`).
    pub fn cur_qp_state(&self) -> QpState {
        QpState::from(self.raw.cur_qp_state)
    }

    /// The path MTU (`path_mtu`, `IBV_QP_PATH_MTU`).
    pub fn set_path_mtu(&mut self, mtu: Mtu) -> &mut Self {
        self.raw.path_mtu = mtu.into();
        self.mask |= QpAttrMask::PATH_MTU;
        self
    }

    /// The path MTU (`path_mtu`).
    pub fn path_mtu(&self) -> Mtu {
        Mtu::from(self.raw.path_mtu)
    }

    /// The path migration state (`path_mig_state`, `IBV_QP_PATH_MIG_STATE`).
    pub fn set_path_mig_state(&mut self, state: MigState) -> &mut Self {
        self.raw.path_mig_state = state.into();
        self.mask |= QpAttrMask::PATH_MIG_STATE;
        self
    }

    /// The path migration state (`path_mig_state`).
    pub fn path_mig_state(&self) -> MigState {
        MigState::from(self.raw.path_mig_state)
    }

    /// What the peer may do through this QP (`qp_access_flags`, `IBV_QP_ACCESS_FLAGS`).
    pub fn set_qp_access_flags(&mut self, access: AccessFlags) -> &mut Self {
        self.raw.qp_access_flags = access.bits();
        self.mask |= QpAttrMask::ACCESS_FLAGS;
        self
    }

    /// The remote access allowed (`qp_access_flags`).
    pub fn qp_access_flags(&self) -> AccessFlags {
        AccessFlags::from_bits_retain(self.raw.qp_access_flags)
    }

    /// Work queue sizes (`cap`, `IBV_QP_CAP`; few devices allow resizing).
    pub fn set_cap(&mut self, cap: QpCapabilities) -> &mut Self {
        self.raw.cap = cap.into();
        self.mask |= QpAttrMask::CAP;
        self
    }

    /// Work queue sizes (`cap`).
    pub fn cap(&self) -> QpCapabilities {
        QpCapabilities::from(self.raw.cap)
    }

    /// The primary path (`ah_attr`, `IBV_QP_AV`).
    pub fn set_ah_attr(&mut self, av: AddressVector) -> &mut Self {
        self.raw.ah_attr = *av.as_raw();
        self.mask |= QpAttrMask::AV;
        self
    }

    /// The primary path (`ah_attr`).
    pub fn ah_attr(&self) -> AddressVector {
        AddressVector::from_raw(self.raw.ah_attr)
    }

    /// The alternate path (`alt_ah_attr`, `IBV_QP_ALT_PATH`).
    pub fn set_alt_ah_attr(&mut self, av: AddressVector) -> &mut Self {
        self.raw.alt_ah_attr = *av.as_raw();
        self.mask |= QpAttrMask::ALT_PATH;
        self
    }

    /// The alternate path (`alt_ah_attr`).
    pub fn alt_ah_attr(&self) -> AddressVector {
        AddressVector::from_raw(self.raw.alt_ah_attr)
    }

    /// Whether the send queue is draining (`sq_draining`). Reported by queries only: it has
    /// no mask bit, and `ibv_modify_qp` ignores it.
    pub fn set_sq_draining(&mut self, draining: bool) -> &mut Self {
        self.raw.sq_draining = u8::from(draining);
        self
    }

    /// Whether the send queue is draining (`sq_draining`, from queries).
    pub fn sq_draining(&self) -> bool {
        self.raw.sq_draining != 0
    }

    /// Whether to raise an async event when the send queue drains (`en_sqd_async_notify`,
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`).
    pub fn set_en_sqd_async_notify(&mut self, notify: bool) -> &mut Self {
        self.raw.en_sqd_async_notify = u8::from(notify);
        self.mask |= QpAttrMask::EN_SQD_ASYNC_NOTIFY;
        self
    }

    /// Whether SQD raises an async event (`en_sqd_async_notify`).
    pub fn en_sqd_async_notify(&self) -> bool {
        self.raw.en_sqd_async_notify != 0
    }

    plain_fields! {
        /// The Q_Key of a datagram QP.
        qkey / set_qkey: u32 => QKEY;
        /// The packet sequence number the receive queue expects first.
        rq_psn / set_rq_psn: u32 => RQ_PSN;
        /// The packet sequence number of the first packet sent.
        sq_psn / set_sq_psn: u32 => SQ_PSN;
        /// The peer's QP number.
        dest_qp_num / set_dest_qp_num: u32 => DEST_QPN;
        /// The P_Key table index of the primary path.
        pkey_index / set_pkey_index: u16 => PKEY_INDEX;
        /// The P_Key table index of the alternate path (part of the alternate path).
        alt_pkey_index / set_alt_pkey_index: u16 => ALT_PATH;
        /// Outstanding RDMA READs and atomics this QP may have in flight as initiator.
        max_rd_atomic / set_max_rd_atomic: u8 => MAX_QP_RD_ATOMIC;
        /// Incoming RDMA READs and atomics this QP handles at once as responder.
        max_dest_rd_atomic / set_max_dest_rd_atomic: u8 => MAX_DEST_RD_ATOMIC;
        /// The RNR NAK timer code this QP asks senders to wait (1..=31; 12 is 0.64 ms).
        min_rnr_timer / set_min_rnr_timer: u8 => MIN_RNR_TIMER;
        /// The local port (from 1).
        port_num / set_port_num: u8 => PORT;
        /// The ack timeout code: 4.096 µs × 2^timeout (14 is about 67 ms; 0 waits forever).
        timeout / set_timeout: u8 => TIMEOUT;
        /// Transport retries before a request fails (0..=7).
        retry_cnt / set_retry_cnt: u8 => RETRY_CNT;
        /// RNR retries before a request fails (0..=6; 7 retries forever).
        rnr_retry / set_rnr_retry: u8 => RNR_RETRY;
        /// The local port of the alternate path (part of the alternate path).
        alt_port_num / set_alt_port_num: u8 => ALT_PATH;
        /// The ack timeout code of the alternate path (part of the alternate path).
        alt_timeout / set_alt_timeout: u8 => ALT_PATH;
        /// The send rate limit in kbit/s (0 = unlimited; raw packet QPs).
        rate_limit / set_rate_limit: u32 => RATE_LIMIT;
    }
}

impl fmt::Debug for QueuePairAttribute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePairAttribute")
            .field("mask", &format_args!("{}", self.mask.names()))
            .field("qp_state", &self.qp_state())
            .field("path_mtu", &self.path_mtu())
            .field("dest_qp_num", &format_args!("{:#x}", self.dest_qp_num()))
            .field("rq_psn", &self.rq_psn())
            .field("sq_psn", &self.sq_psn())
            .field("port_num", &self.port_num())
            .field("ah_attr", &self.ah_attr())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gid::Gid;

    #[test]
    fn setters_set_their_mask_bits() {
        let mut a = QueuePairAttribute::new();
        assert!(a.mask().is_empty());
        a.set_qp_state(QpState::Rtr)
            .set_path_mtu(Mtu::Mtu1024)
            .set_dest_qp_num(0x11)
            .set_rq_psn(7)
            .set_max_dest_rd_atomic(1)
            .set_min_rnr_timer(12)
            .set_alt_timeout(3)
            .set_sq_draining(true);
        assert_eq!(
            a.mask(),
            QpAttrMask::STATE
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
                | QpAttrMask::ALT_PATH
        );
        assert_eq!(a.qp_state(), QpState::Rtr);
        assert_eq!(a.path_mtu(), Mtu::Mtu1024);
        assert_eq!(a.dest_qp_num(), 0x11);
        assert_eq!(a.alt_timeout(), 3);
        assert!(a.sq_draining());
    }

    #[test]
    fn address_vector_round_trips() {
        let gid: Gid = "::ffff:198.18.0.1".parse().unwrap();
        let mut av = AddressVector::new();
        av.set_dgid(gid)
            .set_is_global(true)
            .set_sgid_index(1)
            .set_hop_limit(1)
            .set_port_num(1)
            .set_dlid(3);
        let mut a = QueuePairAttribute::new();
        a.set_ah_attr(av);
        let back = a.ah_attr();
        assert_eq!(back.dgid(), gid);
        assert!(back.is_global());
        assert_eq!(
            (back.sgid_index(), back.hop_limit(), back.port_num()),
            (1, 1, 1)
        );
        assert_eq!(back.dlid(), 3);
        assert_eq!(a.mask(), QpAttrMask::AV);
    }

    #[test]
    fn mask_names_read_like_the_spec() {
        let m = QpAttrMask::MIN_RNR_TIMER | QpAttrMask::MAX_DEST_RD_ATOMIC;
        assert_eq!(m.names().to_string(), "MinRnrTimer, MaxDestRdAtomic");
        let odd = QpAttrMask::PORT | QpAttrMask::from_bits_retain(1 << 30);
        assert_eq!(odd.names().to_string(), "Port, bit 30");
        assert_eq!(QpState::Rtr.to_string(), "RTR");
        assert!(matches!(QpState::from(99), QpState::Unknown(v) if v.get() == 99));
        assert_eq!(QpType::from(2), QpType::Rc);
    }
}
