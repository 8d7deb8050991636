//! How the example programs spell device and port attributes: the words, numbers and tab
//! alignment of rdma-core's `ibv_devinfo` and of the classic `show_gids` script, so that a
//! person holding our output next to theirs sees the same fields with the same values.
//!
//! Everything here is a pure function of the values sideway reports; the programs in
//! `src/bin/` own the queries and the order of the lines.

use std::fmt::Write as _;
use std::net::Ipv6Addr;

use sideway::device::{
    AtomicCap, DeviceCapFlags, GidEntry, GidType, LinkLayer, Mtu, PortSpeed, PortState, PortWidth,
    TransportType,
};

/// Width of a tab stop on the terminals these tables are read on.
const TAB: usize = 8;

/// Column where `ibv_devinfo` starts the values of device-level fields.
pub const DEVICE_COLUMN: usize = 40;

/// Column where `ibv_devinfo` starts the values of port-level fields, and of the TSO
/// capabilities.
pub const PORT_COLUMN: usize = 48;

/// Column where `ibv_devinfo` starts the values of the RSS capabilities.
pub const RSS_COLUMN: usize = 64;

/// One `label:<tabs>value` line: `indent` leading tabs, then `label`, then as many tabs as it
/// takes (at least one) to reach `column`, then `value`. No newline.
pub fn field(indent: usize, label: &str, value: impl std::fmt::Display, column: usize) -> String {
    let mut line = "\t".repeat(indent);
    line.push_str(label);
    line.push_str(&tabs_to(indent * TAB + label.len(), column));
    // Writing to a String cannot fail.
    let _ = write!(line, "{value}");
    line
}

/// The tabs that move the cursor from `position` to `column`, at least one.
fn tabs_to(position: usize, column: usize) -> String {
    // The first tab always moves to the next stop; each further one adds a stop.
    let first_stop = (position / TAB + 1) * TAB;
    let more = column.saturating_sub(first_stop).div_ceil(TAB);
    "\t".repeat(1 + more)
}

/// A 64-bit GUID as four groups of four hex digits (`486f:a4ff:fec6:629c`), host order in.
pub fn guid(guid: u64) -> String {
    let g = guid.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    )
}

/// `InfiniBand (0)`: the transport with its raw value.
pub fn transport(t: TransportType) -> String {
    let name = match t {
        TransportType::Infiniband => "InfiniBand",
        TransportType::Iwarp => "iWARP",
        TransportType::Usnic => "usNIC",
        TransportType::UsnicUdp => "usNIC UDP",
        TransportType::Unspecified => "unspecified",
        _ => "invalid transport",
    };
    format!("{name} ({})", u32::from(t))
}

/// `ATOMIC_HCA (1)`: the atomic capability with its raw value.
pub fn atomic_cap(a: AtomicCap) -> String {
    let name = match a {
        AtomicCap::None => "ATOMIC_NONE",
        AtomicCap::Hca => "ATOMIC_HCA",
        AtomicCap::Global => "ATOMIC_GLOB",
        _ => "invalid atomic capability",
    };
    format!("{name} ({})", u32::from(a))
}

/// `PORT_ACTIVE (4)`: the logical port state with its raw value.
pub fn port_state(s: PortState) -> String {
    let name = match s {
        PortState::Nop => "PORT_NOP",
        PortState::Down => "PORT_DOWN",
        PortState::Init => "PORT_INIT",
        PortState::Armed => "PORT_ARMED",
        PortState::Active => "PORT_ACTIVE",
        PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
        _ => "invalid state",
    };
    format!("{name} ({})", u32::from(s))
}

/// `4096 (5)`: an MTU in bytes with its raw enum value.
pub fn mtu(m: Mtu) -> String {
    match m.bytes() {
        Some(bytes) => format!("{bytes} ({})", u32::from(m)),
        None => format!("invalid MTU ({})", u32::from(m)),
    }
}

/// `4X (2)`: the active link width as a lane count with its raw value.
pub fn width(w: PortWidth) -> String {
    match w.lanes() {
        Some(lanes) => format!("{lanes}X ({})", u32::from(w)),
        None => format!("invalid width ({})", u32::from(w)),
    }
}

/// `25.0 Gbps (32)`: the active per-lane speed as the rounded rate the IB generations are
/// known by (EDR is 25.78125 Gb/s on the wire, 25.0 in this table), with its raw value.
pub fn speed(s: PortSpeed) -> String {
    let gbps = match s {
        PortSpeed::Sdr => "2.5",
        PortSpeed::Ddr => "5.0",
        PortSpeed::Qdr | PortSpeed::Fdr10 => "10.0",
        PortSpeed::Fdr => "14.0",
        PortSpeed::Edr => "25.0",
        PortSpeed::Hdr => "50.0",
        PortSpeed::Ndr => "100.0",
        PortSpeed::Xdr => "200.0",
        _ => return format!("invalid speed ({})", u32::from(s)),
    };
    format!("{gbps} Gbps ({})", u32::from(s))
}

/// `LINK_UP (5)`: the physical port state (InfiniBand spec names) with its raw value.
pub fn phys_state(state: u8) -> String {
    let name = match state {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION_TRAINING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY_TEST",
        _ => "invalid physical state",
    };
    format!("{name} ({state})")
}

/// `4 (3)`: the number of data virtual lanes that a `max_vl_num` code stands for, with the
/// code.
pub fn vl_count(code: u8) -> String {
    let lanes = match code {
        1 => 1,
        2 => 2,
        3 => 4,
        4 => 8,
        5 => 15,
        _ => return format!("invalid value ({code})"),
    };
    format!("{lanes} ({code})")
}

/// `Ethernet` or `InfiniBand` (an unspecified link layer is InfiniBand on old drivers).
pub fn link_layer(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::Ethernet => "Ethernet",
        LinkLayer::Infiniband | LinkLayer::Unspecified => "InfiniBand",
        _ => "Unknown",
    }
}

/// The names of the set bits of `bits` that `names` knows, in table order, and the bits it
/// does not know.
pub fn named_bits<'a>(bits: u64, names: &[(&'a str, u64)]) -> (Vec<&'a str>, u64) {
    let mut unknown = bits;
    let mut found = Vec::new();
    for &(name, bit) in names {
        if bit != 0 && bits & bit == bit {
            found.push(name);
            unknown &= !bit;
        }
    }
    (found, unknown)
}

/// The classic device capability flags (the low 32 bits) by their verbs.h names without the
/// `IBV_DEVICE_` prefix, as `ibv_devinfo` lists them.
pub fn device_cap_flag_names() -> Vec<(&'static str, u64)> {
    DeviceCapFlags::all()
        .iter_names()
        .map(|(name, flag)| (name, flag.bits()))
        .filter(|&(_, bit)| bit <= u64::from(u32::MAX))
        .collect()
}

/// The extended device capability flags (above bit 31) that this program can name.
pub const DEVICE_CAP_FLAGS_EX_NAMES: &[(&str, u64)] = &[
    ("RAW_SCATTER_FCS", sideway::sys::IBV_DEVICE_RAW_SCATTER_FCS),
    (
        "PCI_WRITE_END_PADDING",
        sideway::sys::IBV_DEVICE_PCI_WRITE_END_PADDING,
    ),
];

/// QP types in the `supported_qpts` masks of the TSO, RSS and packet pacing capabilities
/// (bit `1 << ibv_qp_type`).
pub const QP_TYPE_NAMES: &[(&str, u64)] = {
    use sideway::sys::ibv_qp_type as t;
    &[
        ("SUPPORT_RC", 1 << t::IBV_QPT_RC),
        ("SUPPORT_UC", 1 << t::IBV_QPT_UC),
        ("SUPPORT_UD", 1 << t::IBV_QPT_UD),
        ("SUPPORT_RAW_PACKET", 1 << t::IBV_QPT_RAW_PACKET),
        ("SUPPORT_XRC_SEND", 1 << t::IBV_QPT_XRC_SEND),
        ("SUPPORT_XRC_RECV", 1 << t::IBV_QPT_XRC_RECV),
    ]
};

/// General on-demand-paging capabilities (`ibv_odp_general_caps`).
pub const ODP_GENERAL_NAMES: &[(&str, u64)] = &[
    (
        "ODP_SUPPORT",
        sideway::sys::ibv_odp_general_caps::IBV_ODP_SUPPORT as u64,
    ),
    (
        "ODP_SUPPORT_IMPLICIT",
        sideway::sys::ibv_odp_general_caps::IBV_ODP_SUPPORT_IMPLICIT as u64,
    ),
];

/// Per-transport on-demand-paging capabilities (`ibv_odp_transport_cap_bits`).
pub const ODP_TRANSPORT_NAMES: &[(&str, u64)] = {
    use sideway::sys::ibv_odp_transport_cap_bits as b;
    &[
        ("SUPPORT_SEND", b::IBV_ODP_SUPPORT_SEND as u64),
        ("SUPPORT_RECV", b::IBV_ODP_SUPPORT_RECV as u64),
        ("SUPPORT_WRITE", b::IBV_ODP_SUPPORT_WRITE as u64),
        ("SUPPORT_READ", b::IBV_ODP_SUPPORT_READ as u64),
        ("SUPPORT_ATOMIC", b::IBV_ODP_SUPPORT_ATOMIC as u64),
        ("SUPPORT_SRQ", b::IBV_ODP_SUPPORT_SRQ_RECV as u64),
    ]
};

/// The lines that list the set flags of `bits` under a field: one name a line at
/// `DEVICE_COLUMN`, then `Unknown flags: 0x...` for the bits without a name, and `NO SUPPORT`
/// when nothing is set and `empty_says_no_support` asks for it.
pub fn flag_lines(bits: u64, names: &[(&str, u64)], empty_says_no_support: bool) -> Vec<String> {
    let indent = "\t".repeat(DEVICE_COLUMN / TAB);
    let (found, unknown) = named_bits(bits, names);
    let mut lines: Vec<String> = found.iter().map(|n| format!("{indent}{n}")).collect();
    if unknown != 0 {
        lines.push(format!("{indent}Unknown flags: {unknown:#X}"));
    }
    if bits == 0 && empty_says_no_support {
        lines.push(format!("{indent}NO SUPPORT"));
    }
    lines
}

/// A GID as `ibv_devinfo` prints it: IPv6 text (`::ffff:198.18.0.1`,
/// `fe80::486f:a4ff:fec6:629c`), followed by `, RoCE v2` on an Ethernet port.
pub fn gid_value(entry: &GidEntry, link: LinkLayer) -> String {
    let text = Ipv6Addr::from(entry.gid).to_string();
    match (link, entry.gid_type) {
        (LinkLayer::Ethernet, t) | (_, t @ (GidType::RoceV1 | GidType::RoceV2)) => {
            format!("{text}, {t}")
        }
        _ => text,
    }
}

/// The `VER` column of `show_gids`: `v1`, `v2`, or `IB` for an InfiniBand GID.
pub fn gid_version(t: GidType) -> String {
    match t {
        GidType::RoceV1 => "v1".to_owned(),
        GidType::RoceV2 => "v2".to_owned(),
        GidType::Ib => "IB".to_owned(),
        other => format!("?({})", u32::from(other)),
    }
}

/// Lays out rows as columns separated by two spaces, each as wide as its widest cell; the
/// last column is not padded.
pub fn columns(rows: &[Vec<String>]) -> Vec<String> {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
                }
            }
            line.trim_end().to_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_align_to_tab_columns_like_ibv_devinfo() {
        // Lines as rdma-core 56's ibv_devinfo prints them for rxe0.
        assert_eq!(
            field(1, "max_qp:", 1048560, DEVICE_COLUMN),
            "\tmax_qp:\t\t\t\t1048560"
        );
        assert_eq!(
            field(1, "transport:", "x", DEVICE_COLUMN),
            "\ttransport:\t\t\tx"
        );
        assert_eq!(
            field(1, "max_res_rd_atom:", 0, DEVICE_COLUMN),
            "\tmax_res_rd_atom:\t\t0"
        );
        assert_eq!(
            field(1, "max_total_mcast_qp_attach:", 0, DEVICE_COLUMN),
            "\tmax_total_mcast_qp_attach:\t0"
        );
        assert_eq!(field(3, "state:", "s", PORT_COLUMN), "\t\t\tstate:\t\t\ts");
        assert_eq!(
            field(3, "max_mtu:", "m", PORT_COLUMN),
            "\t\t\tmax_mtu:\t\tm"
        );
        assert_eq!(
            field(3, "init_type_reply:", 0, PORT_COLUMN),
            "\t\t\tinit_type_reply:\t0"
        );
        assert_eq!(
            field(3, "GID[  1]:", "g", PORT_COLUMN),
            "\t\t\tGID[  1]:\t\tg"
        );
        // Past the column: still one tab.
        assert_eq!(
            field(0, &"x".repeat(50), 1, DEVICE_COLUMN),
            format!("{}\t1", "x".repeat(50))
        );
    }

    #[test]
    fn guids_are_four_groups() {
        assert_eq!(guid(0x486f_a4ff_fec6_629c), "486f:a4ff:fec6:629c");
        assert_eq!(guid(1), "0000:0000:0000:0001");
    }

    #[test]
    fn enums_print_name_and_raw_value() {
        assert_eq!(port_state(PortState::from(4)), "PORT_ACTIVE (4)");
        assert_eq!(port_state(PortState::from(9)), "invalid state (9)");
        assert_eq!(mtu(Mtu::from(5)), "4096 (5)");
        assert_eq!(mtu(Mtu::from(3)), "1024 (3)");
        assert_eq!(mtu(Mtu::from(0)), "invalid MTU (0)");
        assert_eq!(transport(TransportType::from(0)), "InfiniBand (0)");
        assert_eq!(transport(TransportType::from(77)), "invalid transport (77)");
        assert_eq!(atomic_cap(AtomicCap::from(1)), "ATOMIC_HCA (1)");
        assert_eq!(atomic_cap(AtomicCap::from(2)), "ATOMIC_GLOB (2)");
        assert_eq!(link_layer(LinkLayer::from(2)), "Ethernet");
        assert_eq!(link_layer(LinkLayer::from(0)), "InfiniBand");
        assert_eq!(link_layer(LinkLayer::from(9)), "Unknown");
    }

    #[test]
    fn widths_and_speeds() {
        assert_eq!(width(PortWidth::from(1)), "1X (1)");
        assert_eq!(width(PortWidth::from(2)), "4X (2)");
        assert_eq!(width(PortWidth::from(16)), "2X (16)");
        assert_eq!(width(PortWidth::from(3)), "invalid width (3)");
        assert_eq!(speed(PortSpeed::from(1)), "2.5 Gbps (1)");
        assert_eq!(speed(PortSpeed::from(8)), "10.0 Gbps (8)");
        assert_eq!(speed(PortSpeed::from(32)), "25.0 Gbps (32)");
        assert_eq!(speed(PortSpeed::from(128)), "100.0 Gbps (128)");
        assert_eq!(speed(PortSpeed::from(3)), "invalid speed (3)");
    }

    #[test]
    fn physical_states_and_virtual_lanes() {
        assert_eq!(phys_state(5), "LINK_UP (5)");
        assert_eq!(phys_state(3), "DISABLED (3)");
        assert_eq!(phys_state(0), "invalid physical state (0)");
        assert_eq!(vl_count(1), "1 (1)");
        assert_eq!(vl_count(3), "4 (3)");
        assert_eq!(vl_count(5), "15 (5)");
        assert_eq!(vl_count(6), "invalid value (6)");
    }

    #[test]
    fn flags_are_named_and_unknown_bits_kept() {
        // rxe0's device_cap_flags on rdma-core 56.
        let names = device_cap_flag_names();
        let (found, unknown) = named_bits(0x0122_3c76, &names);
        assert_eq!(
            found,
            [
                "BAD_PKEY_CNTR",
                "BAD_QKEY_CNTR",
                "AUTO_PATH_MIG",
                "CHANGE_PHY_PORT",
                "UD_AV_PORT_ENFORCE",
                "PORT_ACTIVE_EVENT",
                "SYS_IMAGE_GUID",
                "RC_RNR_NAK_GEN",
                "SRQ_RESIZE",
                "MEM_WINDOW",
                "MEM_MGT_EXTENSIONS",
                "MEM_WINDOW_TYPE_2B",
            ]
        );
        assert_eq!(unknown, 0);
        let lines = flag_lines(0x01C0_0000_0000 | 1 << 34, DEVICE_CAP_FLAGS_EX_NAMES, false);
        assert_eq!(
            lines,
            [
                "\t\t\t\t\tRAW_SCATTER_FCS",
                "\t\t\t\t\tUnknown flags: 0x1C000000000"
            ]
        );
        assert_eq!(
            flag_lines(0, ODP_TRANSPORT_NAMES, true),
            ["\t\t\t\t\tNO SUPPORT"]
        );
        assert!(flag_lines(0, ODP_GENERAL_NAMES, false).is_empty());
        assert_eq!(
            flag_lines(0b10_0001, ODP_TRANSPORT_NAMES, true),
            ["\t\t\t\t\tSUPPORT_SEND", "\t\t\t\t\tSUPPORT_SRQ"]
        );
    }

    fn entry(gid: &str, gid_type: GidType) -> GidEntry {
        GidEntry {
            gid: gid.parse().unwrap(),
            index: 1,
            port: 1,
            gid_type,
            netdev: Some("eth0".into()),
        }
    }

    #[test]
    fn gids_print_as_ipv6_with_their_type() {
        let v2 = entry("::ffff:198.18.0.1", GidType::RoceV2);
        assert_eq!(
            gid_value(&v2, LinkLayer::Ethernet),
            "::ffff:198.18.0.1, RoCE v2"
        );
        let ib = entry("fe80::2:c903:0:1", GidType::Ib);
        assert_eq!(gid_value(&ib, LinkLayer::Infiniband), "fe80::2:c903:0:1");
        assert_eq!(gid_version(GidType::RoceV1), "v1");
        assert_eq!(gid_version(GidType::RoceV2), "v2");
        assert_eq!(gid_version(GidType::from(9)), "?(9)");
    }

    #[test]
    fn columns_pad_all_but_the_last() {
        let rows = vec![
            vec!["DEV".to_owned(), "INDEX".to_owned(), "IPv4".to_owned()],
            vec!["rxe0".to_owned(), "1".to_owned(), String::new()],
        ];
        assert_eq!(columns(&rows), ["DEV   INDEX  IPv4", "rxe0  1"]);
    }
}
