//! Choosing the GID a run sends from when `-x` is not given.
//!
//! perftest's users keep tripping over a default GID index that differs between hosts (a
//! RoCE v1 entry on one, a link-local one on the other). The rule here scores every non-zero
//! GID of the port and takes the best, lowest index first on a tie:
//!
//! | score | GID |
//! | --- | --- |
//! | 4 | RoCE v2, IPv4-mapped (`::ffff:a.b.c.d`): routable, and what IPv4 networks use |
//! | 3 | RoCE v2, a global IPv6 address |
//! | 2 | RoCE v2, link-local (`fe80::/10`) |
//! | 1 | RoCE v1 or InfiniBand |
//!
//! Zero GIDs (unused entries) are never chosen.

use std::fmt;
use std::net::Ipv6Addr;

use sideway::device::GidType;
use sideway::gid::Gid;

/// One GID table entry, as far as the choice needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidCandidate {
    /// The index in the port's GID table.
    pub index: u8,
    /// The GID.
    pub gid: Gid,
    /// Its type.
    pub gid_type: GidType,
}

impl GidCandidate {
    /// How good a choice this GID is (see the module docs); 0 for a GID never to choose.
    pub fn score(&self) -> u8 {
        if self.gid.is_zero() {
            return 0;
        }
        match self.gid_type {
            GidType::RoceV2 if self.gid.to_ipv4_mapped().is_some() => 4,
            GidType::RoceV2 if is_link_local(&self.gid) => 2,
            GidType::RoceV2 => 3,
            _ => 1,
        }
    }
}

impl fmt::Display for GidCandidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self.gid.to_ipv4_mapped() {
            Some(v4) => format!("::ffff:{v4}"),
            None => Ipv6Addr::from(*self.gid.as_bytes()).to_string(),
        };
        write!(f, "index {} ({}, {text})", self.index, self.gid_type)
    }
}

fn is_link_local(gid: &Gid) -> bool {
    let b = gid.as_bytes();
    b[0] == 0xfe && (b[1] & 0xc0) == 0x80
}

/// The best GID among `candidates`, or `None` when every one is zero (or there are none).
pub fn best_gid(candidates: &[GidCandidate]) -> Option<GidCandidate> {
    candidates
        .iter()
        .filter(|c| c.score() > 0)
        // max_by_key keeps the last of equal maxima: reverse the index so the lowest wins.
        .max_by_key(|c| (c.score(), std::cmp::Reverse(c.index)))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(index: u8, gid: &str, gid_type: GidType) -> GidCandidate {
        GidCandidate {
            index,
            gid: gid.parse().unwrap(),
            gid_type,
        }
    }

    #[test]
    fn prefers_ipv4_mapped_roce_v2() {
        // The usual SoftRoCE table: link-local v1 and v2, then the IPv4 address as v1 and v2.
        let table = [
            cand(0, "fe80::5054:ff:fe12:3456", GidType::RoceV1),
            cand(1, "fe80::5054:ff:fe12:3456", GidType::RoceV2),
            cand(2, "::ffff:198.18.0.1", GidType::RoceV1),
            cand(3, "::ffff:198.18.0.1", GidType::RoceV2),
        ];
        assert_eq!(best_gid(&table).unwrap().index, 3);
        // Without the IPv4 address, link-local v2 beats v1.
        assert_eq!(best_gid(&table[..2]).unwrap().index, 1);
    }

    #[test]
    fn global_ipv6_beats_link_local_and_ties_go_to_the_lowest_index() {
        let table = [
            cand(4, "fe80::1", GidType::RoceV2),
            cand(7, "2001:db8::1", GidType::RoceV2),
            cand(5, "2001:db8::2", GidType::RoceV2),
        ];
        assert_eq!(best_gid(&table).unwrap().index, 5);
    }

    #[test]
    fn zero_gids_are_never_chosen() {
        let table = [cand(0, "::", GidType::RoceV2), cand(1, "::", GidType::Ib)];
        assert_eq!(table[0].score(), 0);
        assert_eq!(best_gid(&table), None);
        assert_eq!(best_gid(&[]), None);
        let ib = [
            cand(0, "::", GidType::Ib),
            cand(1, "fe80::2:c903:0:1", GidType::Ib),
        ];
        assert_eq!(best_gid(&ib).unwrap().index, 1);
    }

    #[test]
    fn display_names_index_type_and_address() {
        let c = cand(3, "::ffff:198.18.0.1", GidType::RoceV2);
        let text = c.to_string();
        assert!(text.starts_with("index 3 ("), "{text}");
        assert!(text.contains("::ffff:198.18.0.1"), "{text}");
    }
}
