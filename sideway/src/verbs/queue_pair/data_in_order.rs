//! Whether the device writes a QP's incoming data in order (`ibv_query_qp_data_in_order`):
//! a receiver may then poll the last byte of an RDMA WRITE or SEND instead of waiting for its
//! completion.

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use super::qp::{QueuePair, Threading};

/// The operation [`QueuePair::query_data_in_order`] asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataInOrderOp {
    /// `IBV_WR_SEND`: the peer's SENDs into this QP's receives.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm,
    /// `IBV_WR_RDMA_WRITE`: the peer's RDMA WRITEs into this side's memory.
    RdmaWrite,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    RdmaWriteWithImm,
    /// `IBV_WR_RDMA_READ`: the responses to RDMA READs posted on this QP.
    RdmaRead,
}

impl DataInOrderOp {
    fn opcode(self) -> ffi::ibv_wr_opcode::Type {
        use ffi::ibv_wr_opcode as o;
        match self {
            DataInOrderOp::Send => o::IBV_WR_SEND,
            DataInOrderOp::SendWithImm => o::IBV_WR_SEND_WITH_IMM,
            DataInOrderOp::RdmaWrite => o::IBV_WR_RDMA_WRITE,
            DataInOrderOp::RdmaWriteWithImm => o::IBV_WR_RDMA_WRITE_WITH_IMM,
            DataInOrderOp::RdmaRead => o::IBV_WR_RDMA_READ,
        }
    }
}

bitflags! {
    /// How the query is asked (`enum ibv_query_qp_data_in_order_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct DataInOrderFlags: u32 {
        /// `IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS`: answer with every capability bit, not
        /// only [`DataInOrderCaps::WHOLE_MSG`] (rdma-core 45 and later; older libraries and
        /// providers answer 0 to flags they do not know).
        const RETURN_CAPS = 1;
        /// `IBV_QUERY_QP_DATA_IN_ORDER_DEVICE_ONLY`: what the device guarantees, leaving out
        /// what the CPU's memory ordering adds (newer rdma-core).
        const DEVICE_ONLY = 2;
        // Bits from newer rdma-core survive.
        const _ = !0;
    }
}

bitflags! {
    /// What is guaranteed to be written in order (`enum ibv_query_qp_data_in_order_caps`).
    /// Empty: nothing is (the answer of devices and libraries that do not know, and of
    /// rdma-core on CPUs other than x86).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct DataInOrderCaps: u32 {
        /// `IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG`: every byte of a message, in order.
        const WHOLE_MSG = 1;
        /// `IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES`: each aligned 128-byte block.
        const ALIGNED_128_BYTES = 2;
        // Bits from newer rdma-core survive.
        const _ = !0;
    }
}

/// The answer of `ibv_query_qp_data_in_order`, which has no error return: negative values
/// (none documented) read as "nothing guaranteed".
fn caps_of(ret: std::os::raw::c_int) -> DataInOrderCaps {
    u32::try_from(ret).map_or(DataInOrderCaps::empty(), DataInOrderCaps::from_bits_retain)
}

impl<T: Threading> QueuePair<T> {
    /// Whether the device writes the data of `op` in order (`ibv_query_qp_data_in_order`).
    /// With empty `flags` the answer is [`DataInOrderCaps::WHOLE_MSG`] or nothing; with
    /// [`DataInOrderFlags::RETURN_CAPS`], every capability. The verb cannot fail: a device
    /// or library that does not know answers empty.
    #[doc(alias = "ibv_query_qp_data_in_order")]
    pub fn query_data_in_order(
        &self,
        op: DataInOrderOp,
        flags: DataInOrderFlags,
    ) -> DataInOrderCaps {
        // SAFETY: the QP is alive for as long as self; the verb only reads it.
        let ret =
            unsafe { ffi::ibv_query_qp_data_in_order(self.as_raw(), op.opcode(), flags.bits()) };
        caps_of(ret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_caps() {
        assert_eq!(caps_of(0), DataInOrderCaps::empty());
        assert_eq!(caps_of(1), DataInOrderCaps::WHOLE_MSG);
        assert_eq!(
            caps_of(3),
            DataInOrderCaps::WHOLE_MSG | DataInOrderCaps::ALIGNED_128_BYTES
        );
        assert_eq!(caps_of(-1), DataInOrderCaps::empty());
        assert_eq!(caps_of(1 << 5).bits(), 1 << 5);
        assert_eq!(
            DataInOrderOp::RdmaRead.opcode(),
            ffi::ibv_wr_opcode::IBV_WR_RDMA_READ
        );
    }
}
