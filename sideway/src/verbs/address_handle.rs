//! Address handles (`struct ibv_ah`): where a UD send goes, and the Global Route Header
//! (`struct ibv_grh`) a UD receive finds in front of its data.
//!
//! An [`AddressHandle`] is made from an [`AddressVector`] (LID, SL, port, and for a global
//! path the GRH fields) with [`ProtectionDomain::create_ah`], or from a received UD message
//! with [`ProtectionDomain::create_ah_from_wc`] (to answer its sender). It holds its
//! protection domain; a UD send names it through
//! [`WorkRequestBuilder::ud_addr`](crate::queue_pair::WorkRequestBuilder::ud_addr).
//!
//! Every UD receive buffer starts with [`GRH_LEN`] bytes that the device fills when the
//! completion has [`WcFlags::GRH`](crate::completion_queue::WcFlags::GRH); [`Grh::parse`] reads
//! them. On RoCE v2 over IPv4 that area holds the IPv4 header in its last 20 bytes instead of an IB
//! GRH, and the parser tells the two apart as rdma-core does (an IPv4 header whose checksum is
//! right wins).

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, from_ret, non_null};
use crate::gid::Gid;
use crate::verbs::protection_domain::ProtectionDomain;
use crate::work_completion::{WcFlags, WorkCompletion};

/// Bytes of Global Route Header room at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;

/// Why an address handle could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AddressHandleError {
    /// `ibv_create_ah` or `ibv_create_ah_from_wc` failed.
    #[error("{call} on {device} (port {port_num}, dlid {dlid:#x}, {}) failed: {source}{}",
        if *global { "global path" } else { "LID-routed" }, create_hint(source, *global))]
    Create {
        /// The verb.
        call: &'static str,
        /// The device's name.
        device: String,
        /// The port.
        port_num: u8,
        /// The destination LID.
        dlid: u16,
        /// Whether the path had a GRH.
        global: bool,
        /// The errno.
        source: io::Error,
    },
    /// `ibv_init_ah_from_wc` failed.
    #[error("ibv_init_ah_from_wc on {device} port {port_num} failed: {source}")]
    InitFromWc {
        /// The device's name.
        device: String,
        /// The port.
        port_num: u8,
        /// The errno.
        source: io::Error,
    },
    /// The completion says a GRH is present but fewer than [`GRH_LEN`] bytes were given.
    #[error("the completion carries a GRH, so the first {GRH_LEN} bytes of its receive buffer are needed, but {given} were given")]
    ShortGrh {
        /// Bytes given.
        given: usize,
    },
}

fn create_hint(source: &io::Error, global: bool) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EINVAL) if !global => {
            " (RoCE ports need a global path: set_is_global(true) with a dgid and sgid_index)"
        }
        Some(libc::EINVAL) => " (is the sgid_index a valid GID of the port?)",
        _ => "",
    }
}

impl ProtectionDomain {
    /// Creates an address handle for `attr` (`ibv_create_ah`).
    #[doc(alias = "ibv_create_ah")]
    pub fn create_ah(
        self: &Arc<Self>,
        attr: &AddressVector,
    ) -> Result<Arc<AddressHandle>, AddressHandleError> {
        let mut raw = *attr.as_raw();
        // SAFETY: the PD is alive; raw is a fully initialised ibv_ah_attr the verb reads.
        let ah = fresh(|| unsafe { ffi::ibv_create_ah(self.as_raw(), &mut raw) });
        let raw_ah = non_null(ah).map_err(|source| AddressHandleError::Create {
            call: "ibv_create_ah",
            device: self.context().name().to_owned(),
            port_num: attr.port_num(),
            dlid: attr.dlid(),
            global: attr.is_global(),
            source,
        })?;
        Ok(Arc::new(AddressHandle {
            raw: raw_ah,
            attr: *attr,
            pd: Arc::clone(self),
        }))
    }

    /// Creates an address handle that reaches the sender of a received UD message
    /// (`ibv_create_ah_from_wc`), on local port `port_num`. `grh` is the start of the
    /// receive buffer (at least [`GRH_LEN`] bytes) when the completion has
    /// [`WcFlags::GRH`]; it is not read otherwise.
    #[doc(alias = "ibv_create_ah_from_wc")]
    pub fn create_ah_from_wc(
        self: &Arc<Self>,
        port_num: u8,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<Arc<AddressHandle>, AddressHandleError> {
        // One path for both: the attribute is what ibv_create_ah_from_wc would build.
        let attr = self.context().init_ah_from_wc(port_num, wc, grh)?;
        self.create_ah(&attr).map_err(|e| match e {
            AddressHandleError::Create {
                device,
                port_num,
                dlid,
                global,
                source,
                ..
            } => AddressHandleError::Create {
                call: "ibv_create_ah_from_wc",
                device,
                port_num,
                dlid,
                global,
                source,
            },
            other => other,
        })
    }
}

impl crate::verbs::device::DeviceContext {
    /// Fills an address vector that reaches the sender of a received UD message
    /// (`ibv_init_ah_from_wc`), as [`ProtectionDomain::create_ah_from_wc`] does; `grh` as
    /// there.
    #[doc(alias = "ibv_init_ah_from_wc")]
    pub fn init_ah_from_wc(
        &self,
        port_num: u8,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<AddressVector, AddressHandleError> {
        let has_grh = wc.wc_flags().contains(WcFlags::GRH);
        if has_grh && grh.len() < GRH_LEN {
            return Err(AddressHandleError::ShortGrh { given: grh.len() });
        }
        let mut raw_grh = [0u8; GRH_LEN];
        if has_grh {
            raw_grh.copy_from_slice(&grh[..GRH_LEN]);
        }
        let mut wc_raw = *wc.as_raw();
        let mut attr = *AddressVector::new().as_raw();
        // SAFETY: the context is open; wc_raw and attr are valid; raw_grh is GRH_LEN bytes,
        // the size of struct ibv_grh, and the verb only reads it.
        let ret = fresh(|| unsafe {
            ffi::ibv_init_ah_from_wc(
                self.as_raw(),
                port_num,
                &mut wc_raw,
                raw_grh.as_mut_ptr().cast::<ffi::ibv_grh>(),
                &mut attr,
            )
        });
        from_ret(ret).map_err(|source| AddressHandleError::InitFromWc {
            device: self.name().to_owned(),
            port_num,
            source,
        })?;
        Ok(AddressVector::from_raw(attr))
    }
}

/// An address handle (`struct ibv_ah`); destroyed (`ibv_destroy_ah`) on drop. Holds its
/// protection domain.
#[doc(alias = "ibv_ah")]
#[doc(alias = "ibv_destroy_ah")]
pub struct AddressHandle {
    raw: NonNull<ffi::ibv_ah>,
    attr: AddressVector,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs address handles may be used from any thread; this type never mutates
// one after creation.
unsafe impl Send for AddressHandle {}
// SAFETY: as above.
unsafe impl Sync for AddressHandle {}

impl AddressHandle {
    /// The raw `ibv_ah`, valid while this handle is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_ah {
        self.raw.as_ptr()
    }

    /// The attributes it was created with.
    pub fn attr(&self) -> &AddressVector {
        &self.attr
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl AddressHandle {
    /// Wraps an address handle of a PD whose context came from
    /// [`DeviceContext::from_raw_parts`](crate::device::DeviceContext::from_raw_parts) (a test
    /// double's): dropping the wrapper calls no destroy verb.
    ///
    /// # Safety
    ///
    /// `pd`'s context comes from `DeviceContext::from_raw_parts`, and `raw` is an address
    /// handle of that context for `attr`, valid until the context's owner is dropped; that
    /// constructor's contract (data path only) applies to the returned handle too.
    #[doc(hidden)]
    pub unsafe fn from_raw_parts(
        raw: NonNull<ffi::ibv_ah>,
        attr: &AddressVector,
        pd: &Arc<ProtectionDomain>,
    ) -> Arc<AddressHandle> {
        Arc::new(AddressHandle {
            raw,
            attr: *attr,
            pd: Arc::clone(pd),
        })
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        if !self.pd.context().owns_objects() {
            // A test double's handle (from_raw_parts): its owner frees it.
            return;
        }
        // SAFETY: raw came from ibv_create_ah and is destroyed once, here. Posted sends
        // copied what they needed of it (the guard borrowed it until posting).
        let ret = fresh(|| unsafe { ffi::ibv_destroy_ah(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_destroy_ah", "an address handle", &e);
        }
    }
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle")
            .field("dlid", &self.attr.dlid())
            .field("port_num", &self.attr.port_num())
            .field("global", &self.attr.is_global())
            .field("dgid", &self.attr.dgid())
            .finish()
    }
}

/// Which network header the GRH area of a UD receive holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrhKind {
    /// An InfiniBand GRH, or the IPv6 header of RoCE v2 over IPv6 (the same layout).
    Ipv6,
    /// RoCE v2 over IPv4: the last 20 bytes are an IPv4 header.
    Ipv4,
}

/// Why 40 bytes are not a GRH.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrhError {
    /// Fewer than [`GRH_LEN`] bytes.
    #[error("a GRH is {GRH_LEN} bytes, got {0}")]
    TooShort(usize),
    /// Neither an IPv6/IB GRH (version 6) nor an IPv4 header with a valid checksum.
    #[error("the GRH area holds neither an IPv6/IB GRH (version 6) nor a valid IPv4 header")]
    UnknownHeader,
}

/// A parsed Global Route Header: the 40 bytes in front of a UD receive's data.
#[doc(alias = "ibv_grh")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Grh {
    kind: GrhKind,
    sgid: Gid,
    dgid: Gid,
    hop_limit: u8,
    traffic_class: u8,
    flow_label: u32,
}

/// The ones'-complement sum of a header, folded: 0xffff for a header with a right checksum.
fn ipv4_checksum_ok(header: &[u8]) -> bool {
    let mut sum: u32 = header
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

impl Grh {
    /// Parses the first [`GRH_LEN`] bytes of a UD receive buffer whose completion has
    /// [`WcFlags::GRH`]. Version 6 in the first byte means an IB GRH or IPv6 header,
    /// unless the last 20 bytes are an IPv4 header with a right checksum; without version
    /// 6 in front, an IPv4 header (version 4) in the last 20 bytes means RoCE v2 over IPv4.
    /// IPv4 addresses become IPv4-mapped GIDs.
    pub fn parse(bytes: &[u8]) -> Result<Grh, GrhError> {
        let b = bytes
            .get(..GRH_LEN)
            .ok_or(GrhError::TooShort(bytes.len()))?;
        let v4 = &b[20..40];
        let looks_v6 = b[0] >> 4 == 6;
        let looks_v4 = v4[0] >> 4 == 4;
        // Version 6 in front could still be the unused bytes before an IPv4 header; then
        // only a right checksum (of a 20-byte header) settles it. Without version 6 in
        // front, version 4 behind is enough: some devices (rxe) leave the checksum 0.
        let ipv4 = if looks_v6 {
            v4[0] == 0x45 && ipv4_checksum_ok(v4)
        } else if looks_v4 {
            true
        } else {
            return Err(GrhError::UnknownHeader);
        };
        if ipv4 {
            let src = Ipv4Addr::new(v4[12], v4[13], v4[14], v4[15]);
            let dst = Ipv4Addr::new(v4[16], v4[17], v4[18], v4[19]);
            return Ok(Grh {
                kind: GrhKind::Ipv4,
                sgid: Gid::from(src),
                dgid: Gid::from(dst),
                hop_limit: v4[8],
                traffic_class: v4[1],
                flow_label: 0,
            });
        }
        let vtf = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let gid = |at: usize| {
            let mut raw = [0u8; 16];
            raw.copy_from_slice(&b[at..at + 16]);
            Gid::from_raw(raw)
        };
        Ok(Grh {
            kind: GrhKind::Ipv6,
            sgid: gid(8),
            dgid: gid(24),
            hop_limit: b[7],
            // vtf is 4 bits version, 8 bits traffic class, 20 bits flow label.
            traffic_class: ((vtf >> 20) & 0xff) as u8,
            flow_label: vtf & 0xf_ffff,
        })
    }

    /// Which header it was.
    pub fn kind(&self) -> GrhKind {
        self.kind
    }

    /// The sender's GID (IPv4-mapped for RoCE v2 over IPv4).
    pub fn sgid(&self) -> Gid {
        self.sgid
    }

    /// The destination GID (IPv4-mapped for RoCE v2 over IPv4).
    pub fn dgid(&self) -> Gid {
        self.dgid
    }

    /// Hop limit (IPv4: TTL).
    pub fn hop_limit(&self) -> u8 {
        self.hop_limit
    }

    /// Traffic class (IPv4: the TOS byte).
    pub fn traffic_class(&self) -> u8 {
        self.traffic_class
    }

    /// Flow label (0 for IPv4).
    pub fn flow_label(&self) -> u32 {
        self.flow_label
    }
}

impl fmt::Debug for Grh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grh")
            .field("kind", &self.kind)
            .field("sgid", &std::net::Ipv6Addr::from(*self.sgid.as_bytes()))
            .field("dgid", &std::net::Ipv6Addr::from(*self.dgid.as_bytes()))
            .field("hop_limit", &self.hop_limit)
            .field("traffic_class", &self.traffic_class)
            .field("flow_label", &self.flow_label)
            .finish()
    }
}

/// An address vector (`struct ibv_ah_attr`, with its `struct ibv_global_route`): where a
/// connected QP's packets go. A plain value; setters chain.
#[doc(alias = "ibv_ah_attr")]
#[doc(alias = "ibv_global_route")]
#[derive(Clone, Copy)]
pub struct AddressVector {
    raw: ffi::ibv_ah_attr,
}

impl Default for AddressVector {
    fn default() -> Self {
        AddressVector {
            raw: ffi::ibv_ah_attr {
                grh: ffi::ibv_global_route {
                    dgid: ffi::ibv_gid { raw: [0; 16] },
                    flow_label: 0,
                    sgid_index: 0,
                    hop_limit: 0,
                    traffic_class: 0,
                },
                dlid: 0,
                sl: 0,
                src_path_bits: 0,
                static_rate: 0,
                is_global: 0,
                port_num: 0,
            },
        }
    }
}

impl AddressVector {
    /// An all-zero address vector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wraps the C struct.
    pub fn from_raw(raw: ffi::ibv_ah_attr) -> Self {
        AddressVector { raw }
    }

    /// The C struct.
    pub fn as_raw(&self) -> &ffi::ibv_ah_attr {
        &self.raw
    }

    /// Sets the destination GID (`grh.dgid`); used when `is_global` is set.
    pub fn set_dgid(&mut self, dgid: Gid) -> &mut Self {
        self.raw.grh.dgid = ffi::ibv_gid {
            raw: *dgid.as_bytes(),
        };
        self
    }

    /// The destination GID (`grh.dgid`).
    pub fn dgid(&self) -> Gid {
        // SAFETY: every bit pattern of the union's 16 bytes is a valid `raw` array.
        Gid::from_raw(unsafe { self.raw.grh.dgid.raw })
    }

    /// Sets the flow label (`grh.flow_label`, 20 bits).
    pub fn set_flow_label(&mut self, flow_label: u32) -> &mut Self {
        self.raw.grh.flow_label = flow_label;
        self
    }

    /// The flow label (`grh.flow_label`).
    pub fn flow_label(&self) -> u32 {
        self.raw.grh.flow_label
    }

    /// Sets the local GID table index to send from (`grh.sgid_index`).
    pub fn set_sgid_index(&mut self, sgid_index: u8) -> &mut Self {
        self.raw.grh.sgid_index = sgid_index;
        self
    }

    /// The local GID index (`grh.sgid_index`).
    pub fn sgid_index(&self) -> u8 {
        self.raw.grh.sgid_index
    }

    /// Sets the hop limit (`grh.hop_limit`, the IP TTL on RoCE v2).
    pub fn set_hop_limit(&mut self, hop_limit: u8) -> &mut Self {
        self.raw.grh.hop_limit = hop_limit;
        self
    }

    /// The hop limit (`grh.hop_limit`).
    pub fn hop_limit(&self) -> u8 {
        self.raw.grh.hop_limit
    }

    /// Sets the traffic class (`grh.traffic_class`, the IP DSCP/ECN byte on RoCE v2).
    pub fn set_traffic_class(&mut self, traffic_class: u8) -> &mut Self {
        self.raw.grh.traffic_class = traffic_class;
        self
    }

    /// The traffic class (`grh.traffic_class`).
    pub fn traffic_class(&self) -> u8 {
        self.raw.grh.traffic_class
    }

    /// Sets the destination LID (`dlid`; ignored on RoCE).
    pub fn set_dlid(&mut self, dlid: u16) -> &mut Self {
        self.raw.dlid = dlid;
        self
    }

    /// The destination LID (`dlid`).
    pub fn dlid(&self) -> u16 {
        self.raw.dlid
    }

    /// Sets the service level (`sl`).
    pub fn set_sl(&mut self, sl: u8) -> &mut Self {
        self.raw.sl = sl;
        self
    }

    /// The service level (`sl`).
    pub fn sl(&self) -> u8 {
        self.raw.sl
    }

    /// Sets the source path bits (`src_path_bits`, with LMC).
    pub fn set_src_path_bits(&mut self, src_path_bits: u8) -> &mut Self {
        self.raw.src_path_bits = src_path_bits;
        self
    }

    /// The source path bits (`src_path_bits`).
    pub fn src_path_bits(&self) -> u8 {
        self.raw.src_path_bits
    }

    /// Sets the static rate limit (`static_rate`, an `ibv_rate` value; 0 = port rate).
    pub fn set_static_rate(&mut self, static_rate: u8) -> &mut Self {
        self.raw.static_rate = static_rate;
        self
    }

    /// The static rate (`static_rate`).
    pub fn static_rate(&self) -> u8 {
        self.raw.static_rate
    }

    /// Sets whether the GRH fields are used (`is_global`; required on RoCE).
    pub fn set_is_global(&mut self, is_global: bool) -> &mut Self {
        self.raw.is_global = u8::from(is_global);
        self
    }

    /// Whether the GRH fields are used (`is_global`).
    pub fn is_global(&self) -> bool {
        self.raw.is_global != 0
    }

    /// Sets the local port to send from (`port_num`).
    pub fn set_port_num(&mut self, port_num: u8) -> &mut Self {
        self.raw.port_num = port_num;
        self
    }

    /// The local port (`port_num`).
    pub fn port_num(&self) -> u8 {
        self.raw.port_num
    }
}

impl fmt::Debug for AddressVector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressVector")
            .field("dgid", &self.dgid())
            .field("flow_label", &self.flow_label())
            .field("sgid_index", &self.sgid_index())
            .field("hop_limit", &self.hop_limit())
            .field("traffic_class", &self.traffic_class())
            .field("dlid", &self.dlid())
            .field("sl", &self.sl())
            .field("src_path_bits", &self.src_path_bits())
            .field("static_rate", &self.static_rate())
            .field("is_global", &self.is_global())
            .field("port_num", &self.port_num())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4_grh(src: [u8; 4], dst: [u8; 4]) -> [u8; GRH_LEN] {
        let mut b = [0u8; GRH_LEN];
        let h = &mut b[20..];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&60u16.to_be_bytes());
        h[8] = 64;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let mut sum: u32 = h
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        b
    }

    #[test]
    fn roce_v2_ipv4_header_gives_mapped_gids() {
        let g = Grh::parse(&ipv4_grh([198, 18, 0, 1], [198, 18, 0, 2])).unwrap();
        assert_eq!(g.kind(), GrhKind::Ipv4);
        assert_eq!(g.sgid(), "::ffff:198.18.0.1".parse().unwrap());
        assert_eq!(g.dgid(), "::ffff:198.18.0.2".parse().unwrap());
        assert_eq!(g.hop_limit(), 64);
    }

    #[test]
    fn checksum_decides_only_when_the_front_says_version_6() {
        let mut b = ipv4_grh([1, 2, 3, 4], [5, 6, 7, 8]);
        b[20 + 10] = 0;
        b[20 + 11] = 0;
        // rxe leaves the checksum 0 and the front zeroed: still IPv4.
        assert_eq!(Grh::parse(&b).unwrap().kind(), GrhKind::Ipv4);
        b[0] = 0x60;
        assert_eq!(Grh::parse(&b).unwrap().kind(), GrhKind::Ipv6);
        let mut good = ipv4_grh([1, 2, 3, 4], [5, 6, 7, 8]);
        good[0] = 0x60;
        assert_eq!(Grh::parse(&good).unwrap().kind(), GrhKind::Ipv4);
        assert_eq!(Grh::parse(&[0u8; GRH_LEN]), Err(GrhError::UnknownHeader));
    }

    #[test]
    fn ib_grh_fields() {
        let mut b = [0u8; GRH_LEN];
        b[0..4].copy_from_slice(&0x6ab1_2345u32.to_be_bytes());
        b[7] = 3;
        b[8..24].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        b[24..40].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]);
        let g = Grh::parse(&b).unwrap();
        assert_eq!(g.kind(), GrhKind::Ipv6);
        assert_eq!(g.sgid().interface_id(), 0x0102_0304_0506_0708);
        assert_eq!(g.dgid().interface_id(), 0x0807_0605_0403_0201);
        assert_eq!(
            (g.traffic_class(), g.flow_label(), g.hop_limit()),
            (0xab, 0x1_2345, 3)
        );
        assert_eq!(Grh::parse(&b[..39]), Err(GrhError::TooShort(39)));
    }
}
