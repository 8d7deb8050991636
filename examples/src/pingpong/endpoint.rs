//! The endpoints on the wire: the starting PSN, the endpoint lines each variant prints,
//! and the SRQ variant's endpoint lines.

use super::*;

/// A pseudo-random 24-bit starting PSN, different per process and run.
pub(super) fn random_psn() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id().rotate_left(16)).wrapping_mul(0x9e37_79b1) >> 8
}

pub(super) fn print_endpoint(which: &str, ep: &Endpoint) {
    let gid = std::net::Ipv6Addr::from(*ep.gid.as_bytes());
    println!(
        "  {which:<16}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {gid}",
        ep.lid, ep.qp_num, ep.psn
    );
}

/// The Q_Key both sides of a UD pingpong use, as `ibv_ud_pingpong` does.
pub const UD_QKEY: u32 = 0x1111_1111;

/// `ibv_ud_pingpong` separates the PSN and the GID with a colon.
pub(super) fn print_ud_endpoint(which: &str, ep: &Endpoint) {
    let gid = std::net::Ipv6Addr::from(*ep.gid.as_bytes());
    println!(
        "  {which:<16}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}: GID {gid}",
        ep.lid, ep.qp_num, ep.psn
    );
}

/// How many endpoint lines `ibv_srq_pingpong` sends and reads, whatever its `-q`: the
/// first `-q` are the QPs', the rest all zero (observed on rdma-core 56).
pub const SRQ_WIRE_LINES: usize = 256;

/// The endpoints of the peer's QPs among the `SRQ_WIRE_LINES` lines it sent (the first
/// ones; the rest are all zero, QP number 0 included), one for each of this side's `n_qp`.
/// A peer with another `-q` sent fewer or more: that ends the run here, with both counts,
/// rather than as a QP modify error about QP number 0 or a stall.
pub(super) fn srq_peer_endpoints(
    wire: &[Endpoint],
    n_qp: usize,
) -> Result<Vec<Endpoint>, CliError> {
    let sent = wire.iter().take_while(|ep| ep.qp_num != 0).count();
    if sent != n_qp {
        let fewer = if sent < n_qp { "fewer" } else { "more" };
        return Err(CliError::run(format!(
            "the peer sent {sent} QP endpoints, {fewer} than this side's {n_qp} (-q {n_qp}): \
             it runs with -q {sent}; both sides need the same -q"
        )));
    }
    Ok(wire[..n_qp].to_vec())
}
