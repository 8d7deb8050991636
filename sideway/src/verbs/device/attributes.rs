//! What a device says about itself: its attributes and capabilities
//! (`ibv_query_device_ex`) and its raw clock (`ibv_query_rt_values_ex`).

use std::fmt;
use std::io;
use std::mem::MaybeUninit;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;

use super::context::{DeviceContext, DeviceResult};
use crate::errno::{fresh, from_ret};
use crate::macros::c_enum;

/// The device's raw clock as `ibv_query_rt_values_ex` reports it (a `timespec` whose fields
/// hold the raw cycle counter as the provider chooses to split it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawClock {
    /// `raw_clock.tv_sec`.
    pub seconds: i64,
    /// `raw_clock.tv_nsec`.
    pub nanoseconds: i64,
}

c_enum! {
    /// Which atomic operations are atomic with respect to what.
    pub enum AtomicCap: "ibv_atomic_cap" {
        /// No atomic operations.
        None = ffi::ibv_atomic_cap::IBV_ATOMIC_NONE,
        /// Atomic among operations through this HCA.
        Hca = ffi::ibv_atomic_cap::IBV_ATOMIC_HCA,
        /// Atomic with respect to every access, the CPU's included.
        Global = ffi::ibv_atomic_cap::IBV_ATOMIC_GLOB,
    }
}

bitflags! {
    /// Device capability flags (`ibv_device_cap_flags`); bits unknown to this crate are kept.
    #[doc(alias = "ibv_device_cap_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct DeviceCapFlags: u64 {
        /// `IBV_DEVICE_RESIZE_MAX_WR`
        const RESIZE_MAX_WR = ffi::ibv_device_cap_flags::IBV_DEVICE_RESIZE_MAX_WR as u64;
        /// `IBV_DEVICE_BAD_PKEY_CNTR`
        const BAD_PKEY_CNTR = ffi::ibv_device_cap_flags::IBV_DEVICE_BAD_PKEY_CNTR as u64;
        /// `IBV_DEVICE_BAD_QKEY_CNTR`
        const BAD_QKEY_CNTR = ffi::ibv_device_cap_flags::IBV_DEVICE_BAD_QKEY_CNTR as u64;
        /// `IBV_DEVICE_RAW_MULTI`
        const RAW_MULTI = ffi::ibv_device_cap_flags::IBV_DEVICE_RAW_MULTI as u64;
        /// `IBV_DEVICE_AUTO_PATH_MIG`
        const AUTO_PATH_MIG = ffi::ibv_device_cap_flags::IBV_DEVICE_AUTO_PATH_MIG as u64;
        /// `IBV_DEVICE_CHANGE_PHY_PORT`
        const CHANGE_PHY_PORT = ffi::ibv_device_cap_flags::IBV_DEVICE_CHANGE_PHY_PORT as u64;
        /// `IBV_DEVICE_UD_AV_PORT_ENFORCE`
        const UD_AV_PORT_ENFORCE = ffi::ibv_device_cap_flags::IBV_DEVICE_UD_AV_PORT_ENFORCE as u64;
        /// `IBV_DEVICE_CURR_QP_STATE_MOD`
        const CURR_QP_STATE_MOD = ffi::ibv_device_cap_flags::IBV_DEVICE_CURR_QP_STATE_MOD as u64;
        /// `IBV_DEVICE_SHUTDOWN_PORT`
        const SHUTDOWN_PORT = ffi::ibv_device_cap_flags::IBV_DEVICE_SHUTDOWN_PORT as u64;
        /// `IBV_DEVICE_INIT_TYPE`
        const INIT_TYPE = ffi::ibv_device_cap_flags::IBV_DEVICE_INIT_TYPE as u64;
        /// `IBV_DEVICE_PORT_ACTIVE_EVENT`
        const PORT_ACTIVE_EVENT = ffi::ibv_device_cap_flags::IBV_DEVICE_PORT_ACTIVE_EVENT as u64;
        /// `IBV_DEVICE_SYS_IMAGE_GUID`
        const SYS_IMAGE_GUID = ffi::ibv_device_cap_flags::IBV_DEVICE_SYS_IMAGE_GUID as u64;
        /// `IBV_DEVICE_RC_RNR_NAK_GEN`
        const RC_RNR_NAK_GEN = ffi::ibv_device_cap_flags::IBV_DEVICE_RC_RNR_NAK_GEN as u64;
        /// `IBV_DEVICE_SRQ_RESIZE`
        const SRQ_RESIZE = ffi::ibv_device_cap_flags::IBV_DEVICE_SRQ_RESIZE as u64;
        /// `IBV_DEVICE_N_NOTIFY_CQ`
        const N_NOTIFY_CQ = ffi::ibv_device_cap_flags::IBV_DEVICE_N_NOTIFY_CQ as u64;
        /// `IBV_DEVICE_MEM_WINDOW`
        const MEM_WINDOW = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW as u64;
        /// `IBV_DEVICE_UD_IP_CSUM`
        const UD_IP_CSUM = ffi::ibv_device_cap_flags::IBV_DEVICE_UD_IP_CSUM as u64;
        /// `IBV_DEVICE_XRC`
        const XRC = ffi::ibv_device_cap_flags::IBV_DEVICE_XRC as u64;
        /// `IBV_DEVICE_MEM_MGT_EXTENSIONS`
        const MEM_MGT_EXTENSIONS = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS as u64;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`
        const MEM_WINDOW_TYPE_2A = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A as u64;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`
        const MEM_WINDOW_TYPE_2B = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B as u64;
        /// `IBV_DEVICE_RC_IP_CSUM`
        const RC_IP_CSUM = ffi::ibv_device_cap_flags::IBV_DEVICE_RC_IP_CSUM as u64;
        /// `IBV_DEVICE_RAW_IP_CSUM`
        const RAW_IP_CSUM = ffi::ibv_device_cap_flags::IBV_DEVICE_RAW_IP_CSUM as u64;
        /// `IBV_DEVICE_MANAGED_FLOW_STEERING`
        const MANAGED_FLOW_STEERING = ffi::ibv_device_cap_flags::IBV_DEVICE_MANAGED_FLOW_STEERING as u64;
        // Bits from newer rdma-core (and the extended flags above bit 31) survive.
        const _ = !0;
    }
}

bitflags! {
    /// On-demand paging in general (`ibv_odp_general_caps`, `odp_caps.general_caps`); bits
    /// unknown to this crate are kept.
    #[doc(alias = "ibv_odp_general_caps")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpGeneralCaps: u64 {
        /// `IBV_ODP_SUPPORT`: memory may be registered with `IBV_ACCESS_ON_DEMAND`.
        const SUPPORT = ffi::ibv_odp_general_caps::IBV_ODP_SUPPORT as u64;
        /// `IBV_ODP_SUPPORT_IMPLICIT`: one region may cover the whole address space
        /// ([`ProtectionDomain::reg_implicit_odp`](crate::protection_domain::ProtectionDomain::reg_implicit_odp)).
        const SUPPORT_IMPLICIT = ffi::ibv_odp_general_caps::IBV_ODP_SUPPORT_IMPLICIT as u64;
        // Bits from newer rdma-core survive.
        const _ = !0;
    }
}

bitflags! {
    /// What a transport may do on on-demand-paged memory (`ibv_odp_transport_cap_bits`,
    /// one mask per transport); bits unknown to this crate are kept.
    #[doc(alias = "ibv_odp_transport_cap_bits")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpTransportCaps: u32 {
        /// `IBV_ODP_SUPPORT_SEND`
        const SEND = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_SEND;
        /// `IBV_ODP_SUPPORT_RECV`
        const RECV = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_RECV;
        /// `IBV_ODP_SUPPORT_WRITE`
        const WRITE = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_WRITE;
        /// `IBV_ODP_SUPPORT_READ`
        const READ = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_READ;
        /// `IBV_ODP_SUPPORT_ATOMIC`
        const ATOMIC = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_ATOMIC;
        /// `IBV_ODP_SUPPORT_SRQ_RECV`: receives through a shared receive queue.
        const SRQ_RECV = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_SRQ_RECV;
        // Bits from newer rdma-core survive.
        const _ = !0;
    }
}

/// A device's on-demand-paging capabilities (`odp_caps` and `xrc_odp_caps` of
/// `ibv_device_attr_ex`), from [`DeviceAttr::odp_caps`]. All empty on a device without
/// on-demand paging. (rdma-core's `struct ibv_odp_caps` has no size limit of its own: an
/// on-demand region is bounded by [`DeviceAttr::max_mr_size`] like any other.)
#[doc(alias = "ibv_odp_caps")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OdpCaps {
    /// `general_caps`.
    pub general: OdpGeneralCaps,
    /// `per_transport_caps.rc_odp_caps`.
    pub rc: OdpTransportCaps,
    /// `per_transport_caps.uc_odp_caps`.
    pub uc: OdpTransportCaps,
    /// `per_transport_caps.ud_odp_caps`.
    pub ud: OdpTransportCaps,
    /// `xrc_odp_caps`.
    pub xrc: OdpTransportCaps,
}

impl OdpCaps {
    /// True when the device pages memory on demand at all (`IBV_ODP_SUPPORT`).
    pub fn is_supported(&self) -> bool {
        self.general.contains(OdpGeneralCaps::SUPPORT)
    }

    /// True when it also supports implicit on-demand regions (`IBV_ODP_SUPPORT_IMPLICIT`).
    pub fn supports_implicit(&self) -> bool {
        self.is_supported() && self.general.contains(OdpGeneralCaps::SUPPORT_IMPLICIT)
    }
}

/// A device's attributes (`struct ibv_device_attr_ex`), from [`DeviceContext::query_device`].
#[doc(alias = "ibv_device_attr_ex")]
#[derive(Clone, Copy)]
pub struct DeviceAttr {
    pub(super) raw: ffi::ibv_device_attr_ex,
}

macro_rules! limits {
    ($( $(#[$m:meta])* $name:ident ),* $(,)?) => {
        $(
            $(#[$m])*
            pub fn $name(&self) -> u32 {
                u32::try_from(self.raw.orig_attr.$name).unwrap_or(0)
            }
        )*
    };
}

impl DeviceAttr {
    /// The raw struct, for fields this type does not expose.
    pub fn as_raw(&self) -> &ffi::ibv_device_attr_ex {
        &self.raw
    }

    /// Firmware version text.
    pub fn fw_ver(&self) -> String {
        let bytes: Vec<u8> = self
            .raw
            .orig_attr
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Node GUID, host order.
    pub fn node_guid(&self) -> u64 {
        u64::from_be(self.raw.orig_attr.node_guid)
    }

    /// System image GUID, host order.
    pub fn sys_image_guid(&self) -> u64 {
        u64::from_be(self.raw.orig_attr.sys_image_guid)
    }

    /// Largest registrable memory region, in bytes.
    pub fn max_mr_size(&self) -> u64 {
        self.raw.orig_attr.max_mr_size
    }

    /// Supported page sizes, as a bit mask.
    pub fn page_size_cap(&self) -> u64 {
        self.raw.orig_attr.page_size_cap
    }

    /// IEEE vendor id.
    pub fn vendor_id(&self) -> u32 {
        self.raw.orig_attr.vendor_id
    }

    /// Vendor part id.
    pub fn vendor_part_id(&self) -> u32 {
        self.raw.orig_attr.vendor_part_id
    }

    /// Hardware version.
    pub fn hw_ver(&self) -> u32 {
        self.raw.orig_attr.hw_ver
    }

    limits! {
        /// Most QPs.
        max_qp,
        /// Most outstanding work requests per queue.
        max_qp_wr,
        /// Most scatter/gather entries per send or receive request.
        max_sge,
        /// Most scatter/gather entries per RDMA READ request.
        max_sge_rd,
        /// Most CQs.
        max_cq,
        /// Most entries per CQ.
        max_cqe,
        /// Most MRs.
        max_mr,
        /// Most PDs.
        max_pd,
        /// Most outstanding RDMA READ and atomic operations a QP can receive.
        max_qp_rd_atom,
        /// Most outstanding RDMA READ and atomic operations an EE context can receive.
        max_ee_rd_atom,
        /// Most resources for incoming RDMA READ and atomic operations.
        max_res_rd_atom,
        /// Most outstanding RDMA READ and atomic operations a QP can initiate.
        max_qp_init_rd_atom,
        /// Most RDMA READ and atomic operations an EE context can initiate.
        max_ee_init_rd_atom,
        /// Most EE contexts.
        max_ee,
        /// Most RD domains.
        max_rdd,
        /// Most memory windows.
        max_mw,
        /// Most raw IPv6 datagram QPs.
        max_raw_ipv6_qp,
        /// Most raw Ethertype datagram QPs.
        max_raw_ethy_qp,
        /// Most multicast groups.
        max_mcast_grp,
        /// Most QPs per multicast group.
        max_mcast_qp_attach,
        /// Most QPs attached to multicast groups in all.
        max_total_mcast_qp_attach,
        /// Most address handles.
        max_ah,
        /// Most FMRs.
        max_fmr,
        /// Most remaps per FMR before an unmap.
        max_map_per_fmr,
        /// Most SRQs.
        max_srq,
        /// Most work requests per SRQ.
        max_srq_wr,
        /// Most scatter/gather entries per SRQ request.
        max_srq_sge,
    }

    /// P_Key table size.
    pub fn max_pkeys(&self) -> u16 {
        self.raw.orig_attr.max_pkeys
    }

    /// Local CA ACK delay (as the exponent in 4.096 µs × 2^n).
    pub fn local_ca_ack_delay(&self) -> u8 {
        self.raw.orig_attr.local_ca_ack_delay
    }

    /// Number of physical ports.
    pub fn phys_port_cnt(&self) -> u8 {
        self.raw.orig_attr.phys_port_cnt
    }

    /// Capability flags: the classic ones and the extended ones (`device_cap_flags_ex`).
    pub fn device_cap_flags(&self) -> DeviceCapFlags {
        DeviceCapFlags::from_bits_retain(
            u64::from(self.raw.orig_attr.device_cap_flags) | self.raw.device_cap_flags_ex,
        )
    }

    /// Atomic operation support.
    pub fn atomic_cap(&self) -> AtomicCap {
        AtomicCap::from(self.raw.orig_attr.atomic_cap)
    }

    /// Mask of the valid bits of completion timestamps (0: no timestamps).
    pub fn completion_timestamp_mask(&self) -> u64 {
        self.raw.completion_timestamp_mask
    }

    /// Frequency of the device clock that stamps completions, in kHz (0: unknown).
    pub fn hca_core_clock(&self) -> u64 {
        self.raw.hca_core_clock
    }

    /// PCIe atomic operation support: `(fetch_add, swap, compare_swap)` operand-size masks.
    pub fn pci_atomic_caps(&self) -> PciAtomicCaps {
        let c = self.raw.pci_atomic_caps;
        PciAtomicCaps {
            fetch_add: c.fetch_add,
            swap: c.swap,
            compare_swap: c.compare_swap,
        }
    }

    /// Largest device memory allocation, in bytes.
    pub fn max_dm_size(&self) -> u64 {
        self.raw.max_dm_size
    }

    /// On-demand-paging capabilities: in general, per transport (RC, UC, UD, XRC).
    #[doc(alias = "ibv_odp_caps")]
    pub fn odp_caps(&self) -> OdpCaps {
        let odp = self.raw.odp_caps;
        let t = OdpTransportCaps::from_bits_retain;
        OdpCaps {
            general: OdpGeneralCaps::from_bits_retain(odp.general_caps),
            rc: t(odp.per_transport_caps.rc_odp_caps),
            uc: t(odp.per_transport_caps.uc_odp_caps),
            ud: t(odp.per_transport_caps.ud_odp_caps),
            xrc: t(self.raw.xrc_odp_caps),
        }
    }

    /// Physical port count from the extended attributes (can exceed 255).
    pub fn phys_port_cnt_ex(&self) -> u32 {
        self.raw.phys_port_cnt_ex
    }
}

impl fmt::Debug for DeviceAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceAttr")
            .field("fw_ver", &self.fw_ver())
            .field("node_guid", &format_args!("{:#018x}", self.node_guid()))
            .field("vendor_id", &format_args!("{:#x}", self.vendor_id()))
            .field("max_qp", &self.max_qp())
            .field("max_qp_wr", &self.max_qp_wr())
            .field("max_cqe", &self.max_cqe())
            .field("max_sge", &self.max_sge())
            .field("device_cap_flags", &self.device_cap_flags())
            .field("atomic_cap", &self.atomic_cap())
            .field("phys_port_cnt", &self.phys_port_cnt())
            .finish_non_exhaustive()
    }
}

/// PCIe atomic capabilities: for each operation, a mask of supported operand sizes
/// (`IBV_PCI_ATOMIC_OPERATION_4_BYTE_SIZE_SUP` = 1, 8 bytes = 2, 16 bytes = 4).
#[doc(alias = "ibv_pci_atomic_caps")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PciAtomicCaps {
    /// Fetch-and-add.
    pub fetch_add: u16,
    /// Swap.
    pub swap: u16,
    /// Compare-and-swap.
    pub compare_swap: u16,
}

impl DeviceContext {
    /// The device's attributes and capabilities (`ibv_query_device_ex`).
    #[doc(alias = "ibv_query_device_ex")]
    #[doc(alias = "ibv_query_device")]
    pub fn query_device(&self) -> DeviceResult<DeviceAttr> {
        let mut attr = MaybeUninit::<ffi::ibv_device_attr_ex>::zeroed();
        // SAFETY: the context is open; a NULL input asks for the default query; attr is a
        // valid, zeroed out-parameter of the right type.
        let ret = fresh(|| unsafe {
            ffi::ibv_query_device_ex(self.as_raw(), std::ptr::null(), attr.as_mut_ptr())
        });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_device_ex", None, e))?;
        // SAFETY: zero is a valid bit pattern for this plain C struct, and the verb filled it.
        let raw = unsafe { attr.assume_init() };
        Ok(DeviceAttr { raw })
    }

    /// The device's free-running clock in raw cycles (`ibv_query_rt_values_ex` with
    /// `IBV_VALUES_MASK_RAW_CLOCK`), as `(seconds, nanoseconds)` fields of the raw value.
    /// Devices without a hardware clock (SoftRoCE) return an `EOPNOTSUPP` query error.
    #[doc(alias = "ibv_query_rt_values_ex")]
    #[allow(clippy::unnecessary_cast)] // time_t and long are 32 bits on 32-bit targets
    pub fn query_raw_clock(&self) -> DeviceResult<RawClock> {
        let mut values = ffi::ibv_values_ex {
            comp_mask: ffi::ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK,
            raw_clock: ffi::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        // SAFETY: the context is open, values is valid and asks for the raw clock only.
        let ret = fresh(|| unsafe { ffi::ibv_query_rt_values_ex(self.as_raw(), &mut values) });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_rt_values_ex", None, e))?;
        if values.comp_mask & ffi::ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK == 0 {
            return Err(self.query_err(
                "ibv_query_rt_values_ex",
                None,
                io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            ));
        }
        Ok(RawClock {
            seconds: values.raw_clock.tv_sec as i64,
            nanoseconds: values.raw_clock.tv_nsec as i64,
        })
    }
}
