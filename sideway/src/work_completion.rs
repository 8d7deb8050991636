//! Work completions (`struct ibv_wc`): what a completion queue hands back for each work
//! request, its status, opcode and flags. A leaf: plain values that know nothing of the
//! queues they come from.

use std::fmt;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use crate::macros::c_enum;

c_enum! {
    /// How a work request ended. Its `Display` is `ibv_wc_status_str`'s text and the value.
    #[doc(alias = "ibv_wc_status_str")]
    pub enum WcStatus: "ibv_wc_status" {
        /// Success.
        Success = ffi::ibv_wc_status::IBV_WC_SUCCESS,
        /// Local length error: a receive buffer too small, or a message too long.
        LocLenErr = ffi::ibv_wc_status::IBV_WC_LOC_LEN_ERR,
        /// Local QP operation error.
        LocQpOpErr = ffi::ibv_wc_status::IBV_WC_LOC_QP_OP_ERR,
        /// Local EE context operation error.
        LocEecOpErr = ffi::ibv_wc_status::IBV_WC_LOC_EEC_OP_ERR,
        /// Local protection error: an SGE outside its region, or a bad lkey.
        LocProtErr = ffi::ibv_wc_status::IBV_WC_LOC_PROT_ERR,
        /// Flushed: the QP went to the error state before this request ran.
        WrFlushErr = ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
        /// Memory window bind error.
        MwBindErr = ffi::ibv_wc_status::IBV_WC_MW_BIND_ERR,
        /// Bad response from the peer.
        BadRespErr = ffi::ibv_wc_status::IBV_WC_BAD_RESP_ERR,
        /// Local access error.
        LocAccessErr = ffi::ibv_wc_status::IBV_WC_LOC_ACCESS_ERR,
        /// Remote invalid request.
        RemInvReqErr = ffi::ibv_wc_status::IBV_WC_REM_INV_REQ_ERR,
        /// Remote access error: a bad rkey, an address outside the remote region, or access
        /// the remote region does not grant.
        RemAccessErr = ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
        /// Remote operation error.
        RemOpErr = ffi::ibv_wc_status::IBV_WC_REM_OP_ERR,
        /// Transport retry counter exceeded: the peer did not answer.
        RetryExcErr = ffi::ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
        /// RNR retry counter exceeded: the peer had no receive posted.
        RnrRetryExcErr = ffi::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR,
        /// Local RDD violation.
        LocRddViolErr = ffi::ibv_wc_status::IBV_WC_LOC_RDD_VIOL_ERR,
        /// Remote invalid RD request.
        RemInvRdReqErr = ffi::ibv_wc_status::IBV_WC_REM_INV_RD_REQ_ERR,
        /// Remote aborted.
        RemAbortErr = ffi::ibv_wc_status::IBV_WC_REM_ABORT_ERR,
        /// Invalid EE context number.
        InvEecnErr = ffi::ibv_wc_status::IBV_WC_INV_EECN_ERR,
        /// Invalid EE context state.
        InvEecStateErr = ffi::ibv_wc_status::IBV_WC_INV_EEC_STATE_ERR,
        /// Fatal error.
        FatalErr = ffi::ibv_wc_status::IBV_WC_FATAL_ERR,
        /// Response timeout.
        RespTimeoutErr = ffi::ibv_wc_status::IBV_WC_RESP_TIMEOUT_ERR,
        /// General error.
        GeneralErr = ffi::ibv_wc_status::IBV_WC_GENERAL_ERR,
        /// Tag matching error.
        TmErr = ffi::ibv_wc_status::IBV_WC_TM_ERR,
        /// Tag matching rendezvous incomplete.
        TmRndvIncomplete = ffi::ibv_wc_status::IBV_WC_TM_RNDV_INCOMPLETE,
    }
}

impl WcStatus {
    /// What usually causes this status, for error messages; empty when nothing useful is
    /// known.
    pub fn hint(self) -> &'static str {
        match self {
            WcStatus::RetryExcErr => {
                "the peer did not acknowledge: it is gone, its QP is not in RTR/RTS, or the \
                 address (GID index, LID, QPN) it was given is wrong"
            }
            WcStatus::RnrRetryExcErr => "the peer had no receive buffer posted in time",
            WcStatus::RemAccessErr => {
                "the remote key, address or length does not match a region the peer \
                 registered with the needed access; if it matched until now, the peer process \
                 is gone or deregistered its memory: check the peer's output"
            }
            WcStatus::LocProtErr => "a scatter/gather entry is outside its memory region",
            WcStatus::LocLenErr => {
                "the message is longer than the receive buffer posted for it (or, on a send, \
                 than the path allows): check that both sides use the same message size"
            }
            WcStatus::LocQpOpErr => {
                "the QP could not carry out the request, most often a message longer than the \
                 receive buffer posted for it: check that both sides use the same message size"
            }
            WcStatus::RemInvReqErr | WcStatus::RemOpErr => {
                "the peer could not take the request, most often a send longer than the \
                 receive buffer the peer posted for it: check that both sides use the same \
                 message size"
            }
            WcStatus::WrFlushErr => "the QP entered the error state; an earlier error caused it",
            _ => "",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static string (the shim
        // returns one even without the library).
        let text = unsafe { ffi::ibv_wc_status_str(u32::from(*self)) };
        if text.is_null() {
            return write!(f, "status {}", u32::from(*self));
        }
        // SAFETY: non-NULL static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy();
        write!(f, "{text} ({})", u32::from(*self))
    }
}

c_enum! {
    /// The operation a completion reports.
    pub enum WcOpcode: "ibv_wc_opcode" {
        /// A send completed.
        Send = ffi::ibv_wc_opcode::IBV_WC_SEND,
        /// An RDMA WRITE completed.
        RdmaWrite = ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE,
        /// An RDMA READ completed.
        RdmaRead = ffi::ibv_wc_opcode::IBV_WC_RDMA_READ,
        /// An atomic compare-and-swap completed.
        CompSwap = ffi::ibv_wc_opcode::IBV_WC_COMP_SWAP,
        /// An atomic fetch-and-add completed.
        FetchAdd = ffi::ibv_wc_opcode::IBV_WC_FETCH_ADD,
        /// A memory window bind completed.
        BindMw = ffi::ibv_wc_opcode::IBV_WC_BIND_MW,
        /// A local invalidate completed.
        LocalInv = ffi::ibv_wc_opcode::IBV_WC_LOCAL_INV,
        /// A TSO send completed.
        Tso = ffi::ibv_wc_opcode::IBV_WC_TSO,
        /// An atomic write completed.
        AtomicWrite = ffi::ibv_wc_opcode::IBV_WC_ATOMIC_WRITE,
        /// A receive completed.
        Recv = ffi::ibv_wc_opcode::IBV_WC_RECV,
        /// An RDMA WRITE with immediate consumed a receive.
        RecvRdmaWithImm = ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

bitflags! {
    /// Flags of one completion (`ibv_wc_flags`).
    #[doc(alias = "ibv_wc_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: a GRH is in the first 40 bytes of the receive buffer (UD).
        const GRH = ffi::ibv_wc_flags::IBV_WC_GRH;
        /// `IBV_WC_WITH_IMM`: immediate data is valid.
        const WITH_IMM = ffi::ibv_wc_flags::IBV_WC_WITH_IMM;
        /// `IBV_WC_IP_CSUM_OK`
        const IP_CSUM_OK = ffi::ibv_wc_flags::IBV_WC_IP_CSUM_OK;
        /// `IBV_WC_WITH_INV`: an rkey was invalidated.
        const WITH_INV = ffi::ibv_wc_flags::IBV_WC_WITH_INV;
        const _ = !0;
    }
}

/// One work completion: every `ibv_wc` field. A plain value: it borrows nothing.
///
/// `#[repr(transparent)]` over `struct ibv_wc`, so a `&mut [WorkCompletion]` is an `ibv_wc`
/// array: [`CompletionQueue::poll_into`](crate::completion_queue::CompletionQueue::poll_into) hands
/// it to `ibv_poll_cq` itself, as a C program hands its array, and nothing is copied.
///
/// The completion timestamp of extended CQs (`ibv_wc_read_completion_ts`) is not here, as
/// `ibv_wc` has no room for it:
/// [`Poller::completion_timestamp`](crate::completion_queue::Poller::completion_timestamp) reads it
/// for the completion the poller handed out last.
#[doc(alias = "ibv_wc")]
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct WorkCompletion {
    pub(crate) raw: ffi::ibv_wc,
}

// The slice cast of poll_into relies on this; repr(transparent) promises it, and this says
// so where a reader looks.
const _: () = assert!(
    std::mem::size_of::<WorkCompletion>() == std::mem::size_of::<ffi::ibv_wc>()
        && std::mem::align_of::<WorkCompletion>() == std::mem::align_of::<ffi::ibv_wc>()
);

impl From<ffi::ibv_wc> for WorkCompletion {
    /// Wraps a completion polled some other way (every `ibv_wc` is a valid one).
    fn from(raw: ffi::ibv_wc) -> Self {
        WorkCompletion { raw }
    }
}

impl WorkCompletion {
    /// The `wr_id` of the work request.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id
    }

    /// How it ended.
    #[inline]
    pub fn status(&self) -> WcStatus {
        WcStatus::from(self.raw.status)
    }

    /// True when the status is [`WcStatus::Success`].
    #[inline]
    pub fn is_success(&self) -> bool {
        self.raw.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// `Ok(self)` on success, else an error naming the status, the work request and the
    /// likely cause. Inlined: an out-of-line call taking `&self` would force every polled
    /// completion out of registers into memory, which costs more than the poll.
    #[inline]
    pub fn ok(&self) -> Result<&Self, WorkCompletionError> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(WorkCompletionError {
                status: self.status(),
                wr_id: self.wr_id(),
                qp_num: self.raw.qp_num,
                vendor_err: self.raw.vendor_err,
            })
        }
    }

    /// The operation (valid only on success, as in C).
    #[doc(alias = "ibv_wc_read_opcode")]
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from(self.raw.opcode)
    }

    /// Vendor error syndrome of a failed completion.
    #[doc(alias = "ibv_wc_read_vendor_err")]
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        self.raw.vendor_err
    }

    /// Bytes transferred (receives, RDMA READ, atomics).
    #[doc(alias = "ibv_wc_read_byte_len")]
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.raw.byte_len
    }

    /// The completion's flags.
    #[doc(alias = "ibv_wc_read_wc_flags")]
    #[inline]
    pub fn wc_flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.raw.wc_flags)
    }

    /// Immediate data in host order, when the sender sent some.
    #[doc(alias = "ibv_wc_read_imm_data")]
    #[inline]
    pub fn imm_data(&self) -> Option<u32> {
        // SAFETY: both union members are plain u32s; WITH_IMM says which one is meant.
        self.wc_flags()
            .contains(WcFlags::WITH_IMM)
            .then(|| u32::from_be(unsafe { self.raw.__bindgen_anon_1.imm_data }))
    }

    /// The rkey a send-with-invalidate invalidated.
    #[doc(alias = "ibv_wc_read_invalidated_rkey")]
    pub fn invalidated_rkey(&self) -> Option<u32> {
        // SAFETY: as for imm_data; WITH_INV selects this member.
        self.wc_flags()
            .contains(WcFlags::WITH_INV)
            .then_some(unsafe { self.raw.__bindgen_anon_1.invalidated_rkey })
    }

    /// The local QP number.
    #[doc(alias = "ibv_wc_read_qp_num")]
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num
    }

    /// The remote QP number (UD).
    #[doc(alias = "ibv_wc_read_src_qp")]
    pub fn src_qp(&self) -> u32 {
        self.raw.src_qp
    }

    /// P_Key index (GSI QPs).
    pub fn pkey_index(&self) -> u16 {
        self.raw.pkey_index
    }

    /// Source LID (UD).
    #[doc(alias = "ibv_wc_read_slid")]
    pub fn slid(&self) -> u16 {
        self.raw.slid
    }

    /// Service level (UD).
    #[doc(alias = "ibv_wc_read_sl")]
    pub fn sl(&self) -> u8 {
        self.raw.sl
    }

    /// Destination LID path bits (UD).
    #[doc(alias = "ibv_wc_read_dlid_path_bits")]
    pub fn dlid_path_bits(&self) -> u8 {
        self.raw.dlid_path_bits
    }

    /// The C struct.
    pub fn as_raw(&self) -> &ffi::ibv_wc {
        &self.raw
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("qp_num", &self.qp_num())
            .field("wc_flags", &self.wc_flags())
            .field("imm_data", &self.imm_data())
            .finish_non_exhaustive()
    }
}

/// A completion with an error status.
#[derive(Debug, Clone, thiserror::Error)]
#[error("work request {wr_id} on QP {qp_num:#x} failed: {status}{}{}",
    if status.hint().is_empty() { "" } else { ": " }, status.hint())]
pub struct WorkCompletionError {
    /// The status.
    pub status: WcStatus,
    /// The work request's id.
    pub wr_id: u64,
    /// The local QP number.
    pub qp_num: u32,
    /// The vendor's error syndrome.
    pub vendor_err: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_status_and_opcode_do_not_panic() {
        assert_eq!(WcStatus::from(12), WcStatus::RetryExcErr);
        assert!(matches!(WcStatus::from(999), WcStatus::Unknown(v) if v.get() == 999));
        assert_eq!(WcOpcode::from(128), WcOpcode::Recv);
        assert!(matches!(WcOpcode::from(200), WcOpcode::Unknown(v) if v.get() == 200));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "calls libibverbs (ibv_wc_status_str), which Miri cannot run"
    )]
    fn failed_completion_explains_itself() {
        let mut wc = WorkCompletion::default();
        wc.raw.status = ffi::ibv_wc_status::IBV_WC_RETRY_EXC_ERR;
        wc.raw.wr_id = 7;
        wc.raw.qp_num = 0x11;
        let err = wc.ok().unwrap_err().to_string();
        assert!(
            err.starts_with("work request 7 on QP 0x11 failed: "),
            "{err}"
        );
        assert!(
            err.contains("(12)") && err.contains("did not acknowledge"),
            "{err}"
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "calls libibverbs (ibv_wc_status_str), which Miri cannot run"
    )]
    fn size_mismatch_statuses_say_so() {
        for status in [
            WcStatus::LocLenErr,
            WcStatus::LocQpOpErr,
            WcStatus::RemInvReqErr,
            WcStatus::RemOpErr,
        ] {
            let err = WorkCompletionError {
                status,
                wr_id: 1,
                qp_num: 0x11,
                vendor_err: 0,
            }
            .to_string();
            assert!(
                err.ends_with("check that both sides use the same message size"),
                "{err}"
            );
        }
        let err = WorkCompletionError {
            status: WcStatus::RemAccessErr,
            wr_id: 1,
            qp_num: 0x11,
            vendor_err: 0,
        }
        .to_string();
        assert!(
            err.contains("the peer process is gone or deregistered its memory"),
            "{err}"
        );
    }

    #[test]
    fn a_work_completion_is_an_ibv_wc() {
        assert_eq!(std::mem::size_of::<WorkCompletion>(), 48);
        assert_eq!(
            std::mem::size_of::<WorkCompletion>(),
            std::mem::size_of::<ffi::ibv_wc>()
        );
        assert_eq!(
            std::mem::align_of::<WorkCompletion>(),
            std::mem::align_of::<ffi::ibv_wc>()
        );
        // What poll_into relies on: the slice's entries sit where an ibv_wc array's would.
        let mut wcs = [WorkCompletion::default(); 3];
        let raw: *mut ffi::ibv_wc = wcs.as_mut_ptr().cast();
        // SAFETY: raw points to 3 ibv_wc-sized, -aligned entries of wcs.
        unsafe { (*raw.add(2)).wr_id = 42 };
        assert_eq!(wcs[2].wr_id(), 42);
        let raw = ffi::ibv_wc {
            wr_id: 7,
            ..Default::default()
        };
        assert_eq!(WorkCompletion::from(raw).wr_id(), 7);
    }

    #[test]
    fn immediate_data_needs_its_flag() {
        let mut wc = WorkCompletion::default();
        wc.raw.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        assert_eq!(wc.imm_data(), None);
        wc.raw.wc_flags = WcFlags::WITH_IMM.bits();
        assert_eq!(wc.imm_data(), Some(0x1234_5678));
        assert_eq!(wc.invalidated_rkey(), None);
    }
}
