//! A port's GID table (`ibv_query_gid_ex`, `ibv_query_gid_table`): its entries
//! ([`GidEntry`], with their [`GidType`] and network interface), and the RoCE v2 IPv4 entry a
//! connection over IPv4 wants. The GID value itself is [`Gid`].

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::net::Ipv4Addr;
use std::os::raw::c_int;

use rdma_mummy_sys as ffi;

use super::context::{DeviceContext, DeviceError, DeviceResult};
use crate::errno::{count_from_ret, fresh, from_ret};
use crate::gid::Gid;
use crate::macros::c_enum;

c_enum! {
    /// What a GID table entry is for.
    pub enum GidType: "ibv_gid_type" {
        /// InfiniBand.
        Ib = ffi::ibv_gid_type::IBV_GID_TYPE_IB,
        /// RoCE v1 (Ethernet, no IP header).
        RoceV1 = ffi::ibv_gid_type::IBV_GID_TYPE_ROCE_V1,
        /// RoCE v2 (UDP/IP): the routable one.
        RoceV2 = ffi::ibv_gid_type::IBV_GID_TYPE_ROCE_V2,
    }
}

impl fmt::Display for GidType {
    /// The way sysfs and `show_gids` name the types.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::Ib => f.write_str("IB"),
            GidType::RoceV1 => f.write_str("RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Unknown(n) => write!(f, "unknown ({n})"),
        }
    }
}

/// One GID table entry (`struct ibv_gid_entry`).
#[doc(alias = "ibv_gid_entry")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table.
    pub index: u8,
    /// The port, from 1.
    pub port: u8,
    /// What the GID is for.
    pub gid_type: GidType,
    /// The network device behind a RoCE GID (`eth0`), `None` for InfiniBand.
    pub netdev: Option<String>,
}

impl GidEntry {
    /// The entry, or `None` for one whose port or index does not fit in 8 bits (the verbs
    /// that use a GID cannot name it).
    fn from_raw(raw: &ffi::ibv_gid_entry) -> Option<Self> {
        Some(GidEntry {
            // SAFETY: every bit pattern of the union's raw bytes is valid.
            gid: Gid::from_raw(unsafe { raw.gid.raw }),
            index: u8::try_from(raw.gid_index).ok()?,
            port: u8::try_from(raw.port_num).ok()?,
            gid_type: GidType::from(raw.gid_type),
            netdev: netdev_name(raw.ndev_ifindex),
        })
    }
}

/// The RoCE v2 entry of `port` in `table` with the IPv4-mapped address `addr` (any IPv4
/// address for `None`), lowest index first.
fn pick_roce_v2_ipv4(table: &[GidEntry], port: u8, addr: Option<Ipv4Addr>) -> Option<&GidEntry> {
    table
        .iter()
        .filter(|e| e.port == port && e.gid_type == GidType::RoceV2)
        .filter(|e| match (e.gid.to_ipv4_mapped(), addr) {
            (Some(v4), Some(want)) => v4 == want,
            (Some(_), None) => true,
            (None, _) => false,
        })
        .min_by_key(|e| e.index)
}

/// The name of the network interface with this index (`if_indextoname`), `None` for 0.
fn netdev_name(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has the IF_NAMESIZE bytes if_indextoname requires.
    let name = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if name.is_null() {
        return None;
    }
    // SAFETY: on success buf holds a NUL-terminated name.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

impl DeviceContext {
    /// One GID table entry with its type and network device (`ibv_query_gid_ex`, or
    /// `ibv_query_gid` plus sysfs on rdma-core builds that lack it). An index past the table
    /// or an empty entry is a [`DeviceError::NoSuchGid`] that says which.
    #[doc(alias = "ibv_query_gid_ex")]
    #[doc(alias = "ibv_query_gid")]
    pub fn query_gid(&self, port: u8, index: u8) -> DeviceResult<GidEntry> {
        let table_len = self.query_port(port)?.gid_table_len();
        let no_such = |empty| DeviceError::NoSuchGid {
            device: self.name.clone(),
            port,
            index,
            table_len,
            empty,
        };
        if u32::from(index) >= table_len {
            return Err(no_such(false));
        }
        let mut entry = MaybeUninit::<ffi::ibv_gid_entry>::zeroed();
        // SAFETY: the context is open, port and index are in range, entry is a valid
        // out-parameter; flags must be 0.
        let ret = fresh(|| unsafe {
            ffi::ibv_query_gid_ex(
                self.as_raw(),
                u32::from(port),
                u32::from(index),
                entry.as_mut_ptr(),
                0,
            )
        });
        match from_ret(ret) {
            // SAFETY: plain C struct, filled by the verb.
            Ok(()) => GidEntry::from_raw(&unsafe { entry.assume_init() }).ok_or_else(|| {
                self.query_err(
                    "ibv_query_gid_ex",
                    Some(port),
                    io::Error::new(io::ErrorKind::InvalidData, "a port or index past 255"),
                )
            }),
            // The kernel reports unused entries as ENODATA (and some as EINVAL).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA) | Some(libc::EINVAL)) => {
                Err(no_such(true))
            }
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => self
                .query_gid_legacy(port, index)?
                .ok_or_else(|| no_such(true)),
            Err(e) => Err(self.query_err("ibv_query_gid_ex", Some(port), e)),
        }
    }

    /// The GID table of every port, unused entries left out (`ibv_query_gid_table`, or one
    /// `ibv_query_gid` per entry plus sysfs for the type and netdev on older rdma-core).
    /// Entries past index 255 are left out too: no work request or address can name them
    /// (`sgid_index` is 8 bits).
    #[doc(alias = "ibv_query_gid_table")]
    pub fn query_gid_table(&self) -> DeviceResult<Vec<GidEntry>> {
        let mut max = 0usize;
        let ports = self.port_count()?;
        for port in 1..=ports {
            max += self.query_port(port)?.gid_table_len() as usize;
        }
        let mut entries: Vec<ffi::ibv_gid_entry> = vec![Default::default(); max];
        // SAFETY: entries has room for max entries; flags must be 0.
        let n = fresh(|| unsafe {
            ffi::ibv_query_gid_table(self.as_raw(), entries.as_mut_ptr(), max, 0)
        });
        match count_from_ret(n) {
            Ok(n) => {
                entries.truncate(n);
                return Ok(entries.iter().filter_map(GidEntry::from_raw).collect());
            }
            Err(e) if e.raw_os_error() != Some(libc::EOPNOTSUPP) => {
                return Err(self.query_err("ibv_query_gid_table", None, e));
            }
            // An older provider: entry by entry below.
            Err(_) => {}
        }
        let mut out = Vec::new();
        for port in 1..=ports {
            let len = self.query_port(port)?.gid_table_len();
            for index in (0..=u8::MAX).take(len as usize) {
                out.extend(self.query_gid_legacy(port, index)?);
            }
        }
        Ok(out)
    }

    /// The RoCE v2 GID of `port` whose IPv4-mapped address is `addr`, or with `None` the
    /// IPv4-mapped RoCE v2 GID of lowest index: the GID to send from on a RoCE network
    /// that routes IPv4 (what `ibv_rc_pingpong -g` and perftest's `-x` are usually given).
    /// Reads the whole table ([`query_gid_table`](Self::query_gid_table)); a port without
    /// such a GID is a [`DeviceError::NoRoceV2Ipv4Gid`] that says what to do.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), sideway::device::DeviceError> {
    /// let ctx = sideway::open_device(Some("rxe0"))?;
    /// let entry = ctx.roce_v2_ipv4_gid(1, Some("198.18.0.1".parse().unwrap()))?;
    /// let mut opts = sideway::queue_pair::ConnectOptions::new();
    /// opts.port_num(1).gid_index(entry.index);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_query_gid_table")]
    pub fn roce_v2_ipv4_gid(&self, port: u8, addr: Option<Ipv4Addr>) -> DeviceResult<GidEntry> {
        self.check_port(port)?;
        let table = self.query_gid_table()?;
        pick_roce_v2_ipv4(&table, port, addr)
            .cloned()
            .ok_or_else(|| DeviceError::NoRoceV2Ipv4Gid {
                device: self.name.clone(),
                port,
                addr,
            })
    }

    /// `ibv_query_gid` for the GID, sysfs for its type and network device: what older
    /// rdma-core offers. `None` for an unused (all-zero) entry.
    fn query_gid_legacy(&self, port: u8, index: u8) -> DeviceResult<Option<GidEntry>> {
        let mut gid = ffi::ibv_gid::default();
        let port_num = self.check_port(port)?;
        let index_c = c_int::from(index);
        // SAFETY: the context is open, gid is a valid out-parameter.
        let ret =
            fresh(|| unsafe { ffi::ibv_query_gid(self.as_raw(), port_num, index_c, &mut gid) });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_gid", Some(port), e))?;
        // SAFETY: every bit pattern of the union's raw bytes is valid.
        let gid = Gid::from_raw(unsafe { gid.raw });
        if gid.is_zero() {
            return Ok(None);
        }
        let attrs = format!("/sys/class/infiniband/{}/ports/{port}/gid_attrs", self.name);
        let read = |what: &str| {
            std::fs::read_to_string(format!("{attrs}/{what}/{index}"))
                .map(|s| s.trim().to_owned())
                .ok()
        };
        let gid_type = match read("types").as_deref() {
            Some("RoCE v2") => GidType::RoceV2,
            Some(t) if t.contains("RoCE") => GidType::RoceV1,
            _ => GidType::Ib,
        };
        Ok(Some(GidEntry {
            gid,
            index,
            port,
            gid_type,
            netdev: read("ndevs"),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_type_names_match_sysfs() {
        assert_eq!(GidType::RoceV2.to_string(), "RoCE v2");
        assert_eq!(GidType::from(7).to_string(), "unknown (7)");
    }

    fn entry(port: u8, index: u8, gid: &str, gid_type: GidType) -> GidEntry {
        GidEntry {
            gid: gid.parse().unwrap(),
            index,
            port,
            gid_type,
            netdev: None,
        }
    }

    #[test]
    fn the_roce_v2_ipv4_picker_takes_the_v2_entry_of_the_address_on_the_port() {
        // SoftRoCE's usual table on two ports, out of order.
        let table = [
            entry(1, 3, "::ffff:198.18.0.1", GidType::RoceV2),
            entry(1, 0, "fe80::1", GidType::RoceV1),
            entry(1, 1, "fe80::1", GidType::RoceV2),
            entry(1, 2, "::ffff:198.18.0.1", GidType::RoceV1),
            entry(1, 5, "::ffff:10.0.0.7", GidType::RoceV2),
            entry(2, 3, "::ffff:192.0.2.9", GidType::RoceV2),
        ];
        let pick = |port, addr: Option<&str>| {
            pick_roce_v2_ipv4(&table, port, addr.map(|a| a.parse().unwrap())).map(|e| e.index)
        };
        assert_eq!(pick(1, None), Some(3), "the lowest IPv4-mapped v2 index");
        assert_eq!(pick(1, Some("10.0.0.7")), Some(5));
        assert_eq!(pick(1, Some("192.0.2.9")), None, "that address is port 2's");
        assert_eq!(pick(2, None), Some(3));
        assert_eq!(pick(3, None), None);
        let e = DeviceError::NoRoceV2Ipv4Gid {
            device: "rxe0".into(),
            port: 1,
            addr: Some("192.0.2.9".parse().unwrap()),
        };
        assert_eq!(
            e.to_string(),
            "rxe0 port 1 has no RoCE v2 GID for 192.0.2.9: give its network interface \
             192.0.2.9 (ip addr add), or pick a GID index by hand"
        );
    }
}
