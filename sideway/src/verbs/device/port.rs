//! A device's ports (`ibv_query_port`): their state, MTU, width, speed and link layer, and
//! their P_Key table.

use std::fmt;
use std::mem::MaybeUninit;
use std::os::raw::c_int;

use rdma_mummy_sys as ffi;

use super::context::{DeviceContext, DeviceError, DeviceResult};
use crate::errno::{fresh, from_ret};
use crate::macros::c_enum;

c_enum! {
    /// A port's logical state.
    pub enum PortState: "ibv_port_state" {
        /// No state change.
        Nop = ffi::ibv_port_state::IBV_PORT_NOP,
        /// Down.
        Down = ffi::ibv_port_state::IBV_PORT_DOWN,
        /// Initializing.
        Init = ffi::ibv_port_state::IBV_PORT_INIT,
        /// Armed.
        Armed = ffi::ibv_port_state::IBV_PORT_ARMED,
        /// Active: traffic can flow.
        Active = ffi::ibv_port_state::IBV_PORT_ACTIVE,
        /// Active, deferred.
        ActiveDefer = ffi::ibv_port_state::IBV_PORT_ACTIVE_DEFER,
    }
}

c_enum! {
    /// A path MTU.
    pub enum Mtu: "ibv_mtu" {
        /// 256 bytes.
        Mtu256 = ffi::ibv_mtu::IBV_MTU_256,
        /// 512 bytes.
        Mtu512 = ffi::ibv_mtu::IBV_MTU_512,
        /// 1024 bytes.
        Mtu1024 = ffi::ibv_mtu::IBV_MTU_1024,
        /// 2048 bytes.
        Mtu2048 = ffi::ibv_mtu::IBV_MTU_2048,
        /// 4096 bytes.
        Mtu4096 = ffi::ibv_mtu::IBV_MTU_4096,
    }
}

impl Mtu {
    /// The MTU in bytes, `None` for an unknown value.
    pub fn bytes(self) -> Option<u32> {
        match self {
            Mtu::Mtu256 => Some(256),
            Mtu::Mtu512 => Some(512),
            Mtu::Mtu1024 => Some(1024),
            Mtu::Mtu2048 => Some(2048),
            Mtu::Mtu4096 => Some(4096),
            Mtu::Unknown(_) => None,
        }
    }

    /// The MTU of this many bytes, if it is one of the five path MTUs.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ]
        .into_iter()
        .find(|m| m.bytes() == Some(bytes))
    }
}

c_enum! {
    /// A port's link layer.
    pub enum LinkLayer: "IBV_LINK_LAYER_*" {
        /// Not reported (InfiniBand, on old drivers).
        Unspecified = ffi::IBV_LINK_LAYER_UNSPECIFIED,
        /// InfiniBand.
        Infiniband = ffi::IBV_LINK_LAYER_INFINIBAND,
        /// Ethernet: RoCE.
        Ethernet = ffi::IBV_LINK_LAYER_ETHERNET,
    }
}

c_enum! {
    /// A port's active link width (lanes).
    pub enum PortWidth: "active_width" {
        /// 1 lane.
        X1 = 1,
        /// 4 lanes.
        X4 = 2,
        /// 8 lanes.
        X8 = 4,
        /// 12 lanes.
        X12 = 8,
        /// 2 lanes.
        X2 = 16,
    }
}

impl PortWidth {
    /// The number of lanes, `None` for an unknown value.
    pub fn lanes(self) -> Option<u32> {
        match self {
            PortWidth::X1 => Some(1),
            PortWidth::X2 => Some(2),
            PortWidth::X4 => Some(4),
            PortWidth::X8 => Some(8),
            PortWidth::X12 => Some(12),
            PortWidth::Unknown(_) => None,
        }
    }
}

c_enum! {
    /// A port's active per-lane speed.
    pub enum PortSpeed: "active_speed" {
        /// SDR, 2.5 Gb/s.
        Sdr = 1,
        /// DDR, 5 Gb/s.
        Ddr = 2,
        /// QDR, 10 Gb/s (also reported by RoCE ports).
        Qdr = 4,
        /// FDR10, 10.3125 Gb/s.
        Fdr10 = 8,
        /// FDR, 14.0625 Gb/s.
        Fdr = 16,
        /// EDR, 25.78125 Gb/s.
        Edr = 32,
        /// HDR, 50 Gb/s.
        Hdr = 64,
        /// NDR, 100 Gb/s.
        Ndr = 128,
        /// XDR, 200 Gb/s.
        Xdr = 256,
    }
}

impl PortSpeed {
    /// The per-lane signalling rate in Gb/s, `None` for an unknown value.
    pub fn gbps_per_lane(self) -> Option<f64> {
        Some(match self {
            PortSpeed::Sdr => 2.5,
            PortSpeed::Ddr => 5.0,
            PortSpeed::Qdr => 10.0,
            PortSpeed::Fdr10 => 10.3125,
            PortSpeed::Fdr => 14.0625,
            PortSpeed::Edr => 25.78125,
            PortSpeed::Hdr => 50.0,
            PortSpeed::Ndr => 100.0,
            PortSpeed::Xdr => 200.0,
            PortSpeed::Unknown(_) => return None,
        })
    }
}

/// A port's attributes (`struct ibv_port_attr`), from [`DeviceContext::query_port`].
#[doc(alias = "ibv_port_attr")]
#[derive(Clone, Copy)]
pub struct PortAttr {
    raw: ffi::ibv_port_attr,
}

impl PortAttr {
    /// The raw struct, for fields this type does not expose.
    pub fn as_raw(&self) -> &ffi::ibv_port_attr {
        &self.raw
    }

    /// Logical state.
    pub fn state(&self) -> PortState {
        PortState::from(self.raw.state)
    }

    /// Largest MTU the port supports.
    pub fn max_mtu(&self) -> Mtu {
        Mtu::from(self.raw.max_mtu)
    }

    /// MTU in use.
    pub fn active_mtu(&self) -> Mtu {
        Mtu::from(self.raw.active_mtu)
    }

    /// GID table length.
    pub fn gid_table_len(&self) -> u32 {
        u32::try_from(self.raw.gid_tbl_len).unwrap_or(0)
    }

    /// Port capability flags (`port_cap_flags`).
    pub fn port_cap_flags(&self) -> u32 {
        self.raw.port_cap_flags
    }

    /// Second word of port capability flags (`port_cap_flags2`).
    pub fn port_cap_flags2(&self) -> u16 {
        self.raw.port_cap_flags2
    }

    /// Largest message size, in bytes.
    pub fn max_msg_sz(&self) -> u32 {
        self.raw.max_msg_sz
    }

    /// Bad P_Key counter.
    pub fn bad_pkey_cntr(&self) -> u32 {
        self.raw.bad_pkey_cntr
    }

    /// Q_Key violation counter.
    pub fn qkey_viol_cntr(&self) -> u32 {
        self.raw.qkey_viol_cntr
    }

    /// P_Key table length.
    pub fn pkey_table_len(&self) -> u16 {
        self.raw.pkey_tbl_len
    }

    /// The port's LID (0 on RoCE).
    pub fn lid(&self) -> u16 {
        self.raw.lid
    }

    /// The subnet manager's LID.
    pub fn sm_lid(&self) -> u16 {
        self.raw.sm_lid
    }

    /// LID mask control.
    pub fn lmc(&self) -> u8 {
        self.raw.lmc
    }

    /// Most virtual lanes.
    pub fn max_vl_num(&self) -> u8 {
        self.raw.max_vl_num
    }

    /// The subnet manager's service level.
    pub fn sm_sl(&self) -> u8 {
        self.raw.sm_sl
    }

    /// Subnet propagation delay.
    pub fn subnet_timeout(&self) -> u8 {
        self.raw.subnet_timeout
    }

    /// Type of initialization the SM performed.
    pub fn init_type_reply(&self) -> u8 {
        self.raw.init_type_reply
    }

    /// Active link width.
    pub fn active_width(&self) -> PortWidth {
        PortWidth::from(u32::from(self.raw.active_width))
    }

    /// Active per-lane speed.
    pub fn active_speed(&self) -> PortSpeed {
        PortSpeed::from(u32::from(self.raw.active_speed))
    }

    /// Physical port state (5 = LinkUp).
    pub fn phys_state(&self) -> u8 {
        self.raw.phys_state
    }

    /// Link layer: InfiniBand or Ethernet (RoCE).
    pub fn link_layer(&self) -> LinkLayer {
        LinkLayer::from(u32::from(self.raw.link_layer))
    }

    /// Port flags (`IBV_QPF_GRH_REQUIRED`, ...).
    pub fn flags(&self) -> u8 {
        self.raw.flags
    }
}

impl fmt::Debug for PortAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortAttr")
            .field("state", &self.state())
            .field("active_mtu", &self.active_mtu())
            .field("lid", &self.lid())
            .field("link_layer", &self.link_layer())
            .field("active_width", &self.active_width())
            .field("active_speed", &self.active_speed())
            .field("gid_table_len", &self.gid_table_len())
            .finish_non_exhaustive()
    }
}

impl DeviceContext {
    /// The number of physical ports (`phys_port_cnt`); they are numbered `1..=port_count`.
    pub fn port_count(&self) -> DeviceResult<u8> {
        Ok(self.query_device()?.raw.orig_attr.phys_port_cnt)
    }

    pub(super) fn check_port(&self, port: u8) -> DeviceResult<u8> {
        let port_count = self.port_count()?;
        if port == 0 || port > port_count {
            return Err(DeviceError::NoSuchPort {
                device: self.name.clone(),
                port,
                port_count,
            });
        }
        Ok(port)
    }

    /// A port's attributes (`ibv_query_port`); ports are numbered from 1.
    ///
    /// Ports are `u8` throughout the crate, as the verbs carry them (`port_num` of
    /// `ibv_qp_attr`, `ibv_ah_attr`, `rdma_cm_id`); GID indexes are `u8` too, as
    /// `sgid_index` carries them.
    #[doc(alias = "ibv_query_port")]
    pub fn query_port(&self, port: u8) -> DeviceResult<PortAttr> {
        let port_num = self.check_port(port)?;
        let mut attr = MaybeUninit::<ffi::ibv_port_attr>::zeroed();
        // SAFETY: the context is open, the port exists, attr is a valid out-parameter.
        let ret =
            fresh(|| unsafe { ffi::ibv_query_port(self.as_raw(), port_num, attr.as_mut_ptr()) });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_port", Some(port), e))?;
        // SAFETY: plain C struct, zero-initialised and filled by the verb.
        let raw = unsafe { attr.assume_init() };
        Ok(PortAttr { raw })
    }

    /// One entry of a port's P_Key table (`ibv_query_pkey`), in host order.
    #[doc(alias = "ibv_query_pkey")]
    pub fn query_pkey(&self, port: u8, index: u16) -> DeviceResult<u16> {
        let port_num = self.check_port(port)?;
        let mut pkey: u16 = 0;
        // SAFETY: the context is open, the port exists, pkey is a valid out-parameter.
        let ret = fresh(|| unsafe {
            ffi::ibv_query_pkey(self.as_raw(), port_num, c_int::from(index), &mut pkey)
        });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_pkey", Some(port), e))?;
        Ok(u16::from_be(pkey))
    }
}
