//! Pre-flight diagnosis: before the QPs move to RTR, both sides trade a description of their
//! port (link layer, active MTU, the GID they chose and the port's other GIDs) and compare
//! them. A pair that cannot reach each other (an InfiniBand port against an Ethernet one, a
//! RoCE v1 GID against a RoCE v2 one, an IPv4-mapped GID against an IPv6 one) ends here with
//! an error that says which option to change on which side, instead of hanging at the first
//! message or failing with "retry exceeded" (status 12) and no hint, the most common report
//! from perftest's users. Differences that work but cost something (active MTUs) are notes.

use std::fmt;
use std::net::Ipv6Addr;

use serde::{Deserialize, Serialize};
use sideway::device::GidType;

use crate::gid_select::GidCandidate;

/// The most GID entries a profile lists (the suggestions look for a matching one there).
pub const MAX_GIDS: usize = 64;

/// A port's link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkKind {
    /// Ethernet: RoCE.
    Ethernet,
    /// InfiniBand.
    InfiniBand,
    /// Something else.
    Other,
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkKind::Ethernet => "Ethernet (RoCE)",
            LinkKind::InfiniBand => "InfiniBand",
            LinkKind::Other => "an unknown link layer",
        })
    }
}

/// A GID's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GidKind {
    /// InfiniBand.
    Ib,
    /// RoCE v1.
    RoceV1,
    /// RoCE v2.
    RoceV2,
}

impl fmt::Display for GidKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GidKind::Ib => "IB",
            GidKind::RoceV1 => "RoCE v1",
            GidKind::RoceV2 => "RoCE v2",
        })
    }
}

/// The address family of a GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Family {
    /// IPv4-mapped (`::ffff:a.b.c.d`).
    Ipv4,
    /// IPv6 link-local (`fe80::/10`).
    Ipv6LinkLocal,
    /// Any other IPv6 address.
    Ipv6,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "IPv4",
            Family::Ipv6LinkLocal => "link-local IPv6",
            Family::Ipv6 => "IPv6",
        })
    }
}

/// One GID as the diagnosis sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidInfo {
    /// Index in the port's GID table.
    pub index: u8,
    /// Type.
    pub kind: GidKind,
    /// Address family.
    pub family: Family,
    /// The address as text.
    pub address: String,
}

impl GidInfo {
    /// The description of a GID table entry.
    pub fn of(c: &GidCandidate) -> Self {
        let b = *c.gid.as_bytes();
        let (family, address) = match c.gid.to_ipv4_mapped() {
            Some(v4) => (Family::Ipv4, format!("::ffff:{v4}")),
            None if b[0] == 0xfe && (b[1] & 0xc0) == 0x80 => {
                (Family::Ipv6LinkLocal, Ipv6Addr::from(b).to_string())
            }
            None => (Family::Ipv6, Ipv6Addr::from(b).to_string()),
        };
        let kind = match c.gid_type {
            GidType::RoceV1 => GidKind::RoceV1,
            GidType::RoceV2 => GidKind::RoceV2,
            _ => GidKind::Ib,
        };
        GidInfo {
            index: c.index,
            kind,
            family,
            address,
        }
    }

    /// How good a choice it is, as [`crate::gid_select`] scores it.
    fn score(&self) -> u8 {
        match (self.kind, self.family) {
            (GidKind::RoceV2, Family::Ipv4) => 4,
            (GidKind::RoceV2, Family::Ipv6) => 3,
            (GidKind::RoceV2, Family::Ipv6LinkLocal) => 2,
            _ => 1,
        }
    }

    fn matches(&self, other: &GidInfo) -> bool {
        self.kind == other.kind && self.family == other.family
    }
}

impl fmt::Display for GidInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GID index {} ({}, {}, {})",
            self.index, self.address, self.family, self.kind
        )
    }
}

/// What one side tells the other about its port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortProfile {
    /// "server" or "client".
    pub role: String,
    /// Device name.
    pub device: String,
    /// Port number.
    pub port: u8,
    /// Link layer.
    pub link: LinkKind,
    /// Active MTU in bytes.
    pub active_mtu: u32,
    /// The GID this side sends from (`None`: InfiniBand, LID-routed).
    pub gid: Option<GidInfo>,
    /// Whether that GID came from `-x` (else chosen automatically).
    pub gid_from_x: bool,
    /// The port's other usable (non-zero) GIDs, at most [`MAX_GIDS`].
    pub table: Vec<GidInfo>,
}

/// The outcome: errors (the run cannot work) and notes (it works, at a cost).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnosis {
    /// What makes the pair unable to talk, each with what to change.
    pub errors: Vec<String>,
    /// What works but is worth knowing.
    pub notes: Vec<String>,
}

/// Which side should change its GID, and to what: the side whose choice is worse moves to
/// an entry of its own table that matches the other side's choice; when it has none, the
/// other side tries.
fn suggest(a: &PortProfile, ga: &GidInfo, b: &PortProfile, gb: &GidInfo) -> String {
    let (first, second) = if ga.score() < gb.score() {
        ((a, gb), (b, ga))
    } else {
        ((b, ga), (a, gb))
    };
    for (side, want) in [first, second] {
        if let Some(e) = side.table.iter().find(|e| e.matches(want)) {
            return format!("pass -x {} on the {}", e.index, side.role);
        }
    }
    format!(
        "neither port has a GID of the other's kind: give both network interfaces addresses of \
         one family (IPv4 on both, say) and pass -x with a {} GID on both sides",
        GidKind::RoceV2
    )
}

/// Compares the two sides' ports; `rdma_cm` (`-R`) leaves the GIDs to rdma_cm.
pub fn diagnose(ours: &PortProfile, theirs: &PortProfile, rdma_cm: bool) -> Diagnosis {
    let mut d = Diagnosis::default();
    let (s, c) = if ours.role == "server" {
        (ours, theirs)
    } else {
        (theirs, ours)
    };
    if s.link != c.link {
        d.errors.push(format!(
            "the server's port ({} port {}) is {}, the client's ({} port {}) {}: RDMA cannot \
             cross between them; choose ports of one link layer with -d and -i",
            s.device, s.port, s.link, c.device, c.port, c.link
        ));
        return d;
    }
    if s.active_mtu != c.active_mtu {
        d.notes.push(format!(
            "active MTU: server {} B, client {} B: the path uses {} B",
            s.active_mtu,
            c.active_mtu,
            s.active_mtu.min(c.active_mtu)
        ));
    }
    if rdma_cm || s.link != LinkKind::Ethernet {
        return d;
    }
    let (Some(gs), Some(gc)) = (&s.gid, &c.gid) else {
        return d;
    };
    if gs.matches(gc) {
        return d;
    }
    let what = match (gs.kind == gc.kind, gs.family == gc.family) {
        (false, false) => "the GID types and address families differ",
        (false, true) => "the GID types differ (RoCE v1 and v2 packets are not the same)",
        _ => "the address families differ (one side's packets never reach the other)",
    };
    d.errors.push(format!(
        "the server uses {gs}, the client {gc}: {what}; {}",
        suggest(s, gs, c, gc)
    ));
    d
}

impl PortProfile {
    /// The peer's profile as received, made safe to print and to trust: its text printable
    /// ([`sideway::peer_text::printable`]), its table cut to [`MAX_GIDS`], and its role the
    /// one opposite `our_role` (the peer does not get to name it).
    pub fn from_peer(mut self, our_role: &str) -> Self {
        use sideway::peer_text::{printable, PEER_TEXT_MAX};
        self.role = if our_role == "server" {
            "client"
        } else {
            "server"
        }
        .to_owned();
        self.device = printable(&self.device, PEER_TEXT_MAX);
        self.table.truncate(MAX_GIDS);
        for g in self.gid.iter_mut().chain(self.table.iter_mut()) {
            g.address = printable(&g.address, PEER_TEXT_MAX);
        }
        self
    }

    /// One line for the banner when nothing is wrong: what both sides agree on.
    pub fn summary(&self, peer: &PortProfile) -> String {
        let gid = match (&self.gid, &peer.gid) {
            (Some(a), Some(b)) if a.matches(b) => format!(", {} {} GIDs", a.family, a.kind),
            _ => String::new(),
        };
        format!(
            "both {}{gid}, active MTU {} / {} B",
            self.link, self.active_mtu, peer.active_mtu
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(index: u8, kind: GidKind, family: Family) -> GidInfo {
        let address = match family {
            Family::Ipv4 => "::ffff:198.18.0.1",
            Family::Ipv6LinkLocal => "fe80::1",
            Family::Ipv6 => "2001:db8::1",
        };
        GidInfo {
            index,
            kind,
            family,
            address: address.into(),
        }
    }

    /// The usual SoftRoCE port: index 0 link-local IPv6, index 1 IPv4, both RoCE v2.
    fn rxe(role: &str, chosen: u8) -> PortProfile {
        let table = vec![
            gid(0, GidKind::RoceV2, Family::Ipv6LinkLocal),
            gid(1, GidKind::RoceV2, Family::Ipv4),
        ];
        PortProfile {
            role: role.into(),
            device: "rxe0".into(),
            port: 1,
            link: LinkKind::Ethernet,
            active_mtu: 1024,
            gid: Some(table[usize::from(chosen)].clone()),
            gid_from_x: true,
            table,
        }
    }

    #[test]
    fn matching_ports_pass() {
        let d = diagnose(&rxe("server", 1), &rxe("client", 1), false);
        assert_eq!(d, Diagnosis::default());
        assert_eq!(
            rxe("server", 1).summary(&rxe("client", 1)),
            "both Ethernet (RoCE), IPv4 RoCE v2 GIDs, active MTU 1024 / 1024 B"
        );
    }

    #[test]
    fn a_link_local_server_is_told_to_take_the_clients_kind() {
        // Seen from either side, the same advice: the server moves to index 1.
        for (ours, theirs) in [
            (rxe("server", 0), rxe("client", 1)),
            (rxe("client", 1), rxe("server", 0)),
        ] {
            let d = diagnose(&ours, &theirs, false);
            assert_eq!(d.errors.len(), 1, "{d:?}");
            let e = &d.errors[0];
            assert!(
                e.starts_with(
                    "the server uses GID index 0 (fe80::1, link-local IPv6, RoCE v2), the client \
                     GID index 1 (::ffff:198.18.0.1, IPv4, RoCE v2): the address families differ"
                ),
                "{e}"
            );
            assert!(e.ends_with("pass -x 1 on the server"), "{e}");
        }
        // And the other way round: the client moves.
        let d = diagnose(&rxe("server", 1), &rxe("client", 0), false);
        assert!(d.errors[0].ends_with("pass -x 1 on the client"), "{d:?}");
        // rdma_cm resolves the GIDs itself.
        assert!(diagnose(&rxe("server", 0), &rxe("client", 1), true)
            .errors
            .is_empty());
    }

    #[test]
    fn roce_v1_against_v2_names_the_type() {
        let mut server = rxe("server", 1);
        server.table.push(gid(2, GidKind::RoceV1, Family::Ipv4));
        server.gid = Some(gid(2, GidKind::RoceV1, Family::Ipv4));
        let d = diagnose(&server, &rxe("client", 1), false);
        let e = &d.errors[0];
        assert!(e.contains("(::ffff:198.18.0.1, IPv4, RoCE v1)"), "{e}");
        assert!(e.contains("the GID types differ"), "{e}");
        assert!(e.ends_with("pass -x 1 on the server"), "{e}");
        // A client with only v1 to offer a v2 server: the server can move to v1, then.
        let mut client = rxe("client", 1);
        client.table = vec![gid(0, GidKind::RoceV1, Family::Ipv4)];
        client.gid = Some(client.table[0].clone());
        let mut server = rxe("server", 1);
        server.table.push(gid(3, GidKind::RoceV1, Family::Ipv4));
        let d = diagnose(&server, &client, false);
        assert!(d.errors[0].ends_with("pass -x 3 on the server"), "{d:?}");
        // Nothing matching anywhere.
        server.table.pop();
        let d = diagnose(&server, &client, false);
        assert!(d.errors[0].contains("neither port has a GID"), "{d:?}");
    }

    #[test]
    fn link_layers_and_mtus() {
        let mut ib = rxe("client", 1);
        ib.link = LinkKind::InfiniBand;
        ib.gid = None;
        let d = diagnose(&rxe("server", 1), &ib, false);
        assert!(
            d.errors[0].contains("is Ethernet (RoCE), the client's (rxe0 port 1) InfiniBand"),
            "{d:?}"
        );
        let mut big = rxe("client", 1);
        big.active_mtu = 4096;
        let d = diagnose(&rxe("server", 1), &big, false);
        assert!(d.errors.is_empty());
        assert_eq!(
            d.notes,
            ["active MTU: server 1024 B, client 4096 B: the path uses 1024 B"]
        );
    }
}
