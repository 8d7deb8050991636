//! `--data-validation`: every byte that lands is the byte that was sent.
//!
//! Each QP's buffer has two halves: operations go out of (or, for READ, land in) the first,
//! and the peer's operations land in (or READ from) the second. Before each size, at the
//! barrier that starts it, the side whose data travels fills its half with a pattern of its
//! role, the QP and the size; the side the data lands on fills the landing half with the
//! pattern's complement, so that every byte must change. After the size (after the barrier
//! that ends it, when the peer's operations have completed), the landing side compares every
//! byte. The pattern differs per size and QP, so data from another size or QP, or data that
//! never came, shows. Nothing of this happens inside the measured loop.
//!
//! The end-to-end check proves the comparison sees a wrong byte: with the test hook
//! `STRIDE_TEST_FLIP_BYTE=N` in its environment, the side whose data travels flips byte N
//! of it after filling it (scripts/e2e/stride-validation.sh).
//!
//! Every verb and test is checked, on every transport and with any `-q`:
//!
//! - WRITE and SEND (bandwidth and latency, RC, UC and UD): every message of a size carries
//!   the same pattern, so the landing half holds it once any message arrived, and its
//!   complement if none did (which UC and UD, which may lose messages, then say). A UD
//!   message lands after the 40-byte GRH. In `write lat` the last byte of each message is the
//!   ping-pong's counter: every byte but that one is compared.
//! - READ: the side that reads compares what landed in its first half.
//! - Atomics (`-n` runs): the target of each QP starts at a 64-bit value of the target's
//!   pattern. After the size the target side checks it: fetch-and-add by 1, `-n` times,
//!   leaves start + n; compare-and-swap (compare 0, swap 0) leaves it unchanged. The side
//!   that posted them checks the value its last operation fetched (start + n - 1, or start),
//!   since RC executes a QP's atomics in order.

use super::error::RunError;
use super::setup::Resources;
use crate::cli::{AtomicType, Connection, Test, Verb};
use crate::params::TestParams;
use sideway::address_handle::GRH_LEN;

/// The test hook that makes the data source send one wrong byte (at this offset).
const FLIP_BYTE_ENV: &str = "STRIDE_TEST_FLIP_BYTE";

/// What one side does with the data of a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DataRoles {
    /// Its first half is the data of its WRITEs or SENDs.
    sends: bool,
    /// The peer's WRITEs or SENDs land in its second half.
    lands: bool,
    /// Its second half is what the peer READs.
    is_read: bool,
    /// Its READs land in its first half.
    reads: bool,
    /// Its second half's first 8 bytes are the peer's atomics' target.
    atomic_target: bool,
    /// Its atomics' fetched values land in its first 8 bytes.
    atomics: bool,
    /// Where the peer's data starts in the landing half: after the GRH on UD.
    landing_offset: usize,
    /// Bytes at the end of each message that are not data (`write lat`'s counter).
    trailer: u64,
    /// The operations per QP and size (atomics), when the run counts them.
    ops: u64,
    /// Fetch-and-add (else compare-and-swap).
    fetch_add: bool,
}

impl DataRoles {
    /// The roles of the client (`is_client`) or the server in a run of `params`.
    pub(super) fn of(params: &TestParams, is_client: bool) -> Self {
        let moves = matches!(params.verb, Verb::Write | Verb::Send);
        // The WRITE and SEND ping-pongs send both ways.
        let both = params.bidirectional || (params.test == Test::Lat && moves);
        let active = is_client || both;
        let passive = !is_client || both;
        let read = params.verb == Verb::Read;
        let atomic = params.verb == Verb::Atomic;
        DataRoles {
            sends: moves && active,
            lands: moves && passive,
            is_read: read && passive,
            reads: read && active,
            atomic_target: atomic && passive,
            atomics: atomic && active,
            landing_offset: if params.connection == Connection::Ud {
                GRH_LEN
            } else {
                0
            },
            trailer: u64::from(params.test == Test::Lat && params.verb == Verb::Write),
            ops: params.iterations,
            fetch_add: params.atomic_type == AtomicType::FetchAndAdd,
        }
    }

    /// True when this side compares anything.
    pub(super) fn checks(self) -> bool {
        self.lands || self.reads || self.atomic_target || self.atomics
    }
}

/// The tag of a side's pattern: each direction of a bidirectional run has its own.
fn tag(client: bool) -> u8 {
    if client {
        0x3c
    } else {
        0xc3
    }
}

/// The pattern byte `i` of the data of side `tag`, QP `q`, size `size`: a mix of all four,
/// so that neighbouring bytes, sizes and QPs differ.
pub(crate) fn pattern_byte(tag: u8, q: usize, size: u64, i: usize) -> u8 {
    let mut x =
        (i as u64) ^ size.rotate_left(24) ^ (q as u64).rotate_left(44) ^ (u64::from(tag) << 56);
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    (x >> 24) as u8
}

/// The starting value of an atomic target of side `tag`, QP `q`, size `size`: never 0, so
/// that a compare-and-swap of 0 never matches and a target that was never set shows.
pub(crate) fn atomic_start(tag: u8, q: usize, size: u64) -> u64 {
    let b: [u8; 8] = std::array::from_fn(|i| pattern_byte(tag, q, size, i));
    u64::from_ne_bytes(b) | 1
}

/// The first `size` bytes of a pattern.
pub(crate) fn pattern(tag: u8, q: usize, size: u64) -> Vec<u8> {
    let n = usize::try_from(size).unwrap_or(usize::MAX);
    (0..n).map(|i| pattern_byte(tag, q, size, i)).collect()
}

/// How the landing bytes differ from the pattern, as a sentence; `None` when they do not.
pub(crate) fn compare(expected: &[u8], got: &[u8]) -> Option<String> {
    let wrong: Vec<usize> = expected
        .iter()
        .zip(got)
        .enumerate()
        .filter(|(_, (e, g))| e != g)
        .map(|(i, _)| i)
        .collect();
    let &first = wrong.first()?;
    let untouched =
        wrong.len() == expected.len() && expected.iter().zip(got).all(|(e, g)| *g == !*e);
    let last = wrong.last().copied().unwrap_or(first);
    Some(format!(
        "{} of {} bytes are not what the peer sent{}; the first at offset {first} (expected \
         {:#04x}, found {:#04x}), the last at offset {last}",
        wrong.len(),
        expected.len(),
        if untouched {
            " (none of its data arrived: the buffer still holds what it was cleared to)"
        } else {
            ""
        },
        expected[first],
        got[first],
    ))
}

/// Before size `size`: fills what this side sends or serves with its pattern, and what the
/// peer's data lands in with the complement of the peer's.
pub(super) fn prepare(
    res: &mut Resources,
    roles: DataRoles,
    is_client: bool,
    size: u64,
) -> Result<(), RunError> {
    let half = res.half;
    let flip = std::env::var(FLIP_BYTE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    let landing = half + roles.landing_offset;
    for q in 0..res.bufs.qps() {
        let mut buf = res.bufs.qp_mut(q);
        if roles.atomic_target {
            let mut start = atomic_start(tag(is_client), q, size).to_ne_bytes();
            if let Some(b) = flip.map(|i| i % 8).and_then(|i| start.get_mut(i)) {
                *b = !*b;
            }
            buf.write(half, &start)?;
        }
        if roles.atomics {
            let expected = atomic_start(tag(!is_client), q, size);
            buf.write(0, &(!expected).to_ne_bytes())?;
        }
        if roles.atomic_target || roles.atomics {
            continue;
        }
        let mut ours = pattern(tag(is_client), q, size);
        if let Some(b) = flip.and_then(|i| ours.get_mut(i)) {
            *b = !*b;
        }
        if roles.sends {
            buf.write(0, &ours)?;
        }
        if roles.is_read {
            buf.write(half, &ours)?;
        }
        let cleared: Vec<u8> = pattern(tag(!is_client), q, size)
            .into_iter()
            .map(|b| !b)
            .collect();
        if roles.lands {
            buf.write(landing, &cleared)?;
            if roles.trailer > 0 {
                // write lat spins on this byte for its counter (1 first): it must start at
                // 0, as the reset after each size leaves it, not at a pattern byte that may
                // look like a counter.
                let last = usize::try_from(size - 1).unwrap_or(0);
                buf.write(landing + last, &[0])?;
            }
        }
        if roles.reads {
            buf.write(0, &cleared)?;
        }
    }
    Ok(())
}

/// After size `size`: compares what landed on this side with the peer's pattern. Returns how
/// many bytes were checked.
pub(super) fn check(
    res: &Resources,
    roles: DataRoles,
    is_client: bool,
    size: u64,
) -> Result<u64, RunError> {
    let half = res.half;
    let data = size.saturating_sub(roles.trailer);
    let n = usize::try_from(data).unwrap_or(usize::MAX);
    let mut checked = 0;
    for q in 0..res.bufs.qps() {
        let buf = res.bufs.qp(q);
        if roles.atomic_target || roles.atomics {
            checked += check_atomic(buf, roles, is_client, q, size, half)?;
            continue;
        }
        let theirs = pattern(tag(!is_client), q, size);
        let (at, what) = match (roles.lands, roles.reads) {
            (true, _) => (half + roles.landing_offset, "the peer's data"),
            (_, true) => (0, "the data this side read"),
            _ => continue,
        };
        let got = buf.read(at..at + n)?;
        if let Some(diff) = compare(&theirs[..n], &got) {
            return Err(RunError::new(format!(
                "data validation failed: size {size}, QP {q}: {what}: {diff}"
            )));
        }
        checked += data;
    }
    Ok(checked)
}

/// The value an atomic target should hold after `ops` operations from `start`, and the value
/// the last operation fetched.
pub(crate) fn atomic_outcome(start: u64, ops: u64, fetch_add: bool) -> (u64, u64) {
    if fetch_add {
        (
            start.wrapping_add(ops),
            start.wrapping_add(ops.saturating_sub(1)),
        )
    } else {
        (start, start)
    }
}

/// Checks QP `q`'s atomic target (the target side) or last fetched value (the side that
/// posted them). Returns the bytes checked.
fn check_atomic(
    buf: crate::buffer::QpBuffer<'_>,
    roles: DataRoles,
    is_client: bool,
    q: usize,
    size: u64,
    half: usize,
) -> Result<u64, RunError> {
    let mut checked = 0;
    let value_at = |at: usize| -> Result<u64, RunError> {
        let b = buf.read(at..at + 8)?;
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[..8]);
        Ok(u64::from_ne_bytes(v))
    };
    let op = if roles.fetch_add {
        "fetch-and-add"
    } else {
        "compare-and-swap"
    };
    if roles.atomic_target {
        let start = atomic_start(tag(is_client), q, size);
        let (want, _) = atomic_outcome(start, roles.ops, roles.fetch_add);
        let got = value_at(half)?;
        if got != want {
            return Err(RunError::new(format!(
                "data validation failed: QP {q}: the target of the peer's {} {op} operations \
                 holds {got:#018x}, expected {want:#018x} (it started at {start:#018x}); the \
                 first wrong byte at offset {}",
                roles.ops,
                first_diff(want, got)
            )));
        }
        checked += 8;
    }
    if roles.atomics {
        let start = atomic_start(tag(!is_client), q, size);
        let (_, want) = atomic_outcome(start, roles.ops, roles.fetch_add);
        let got = value_at(0)?;
        if got != want {
            return Err(RunError::new(format!(
                "data validation failed: QP {q}: the last of {} {op} operations fetched \
                 {got:#018x}, expected {want:#018x} (the target started at {start:#018x}); the \
                 first wrong byte at offset {}",
                roles.ops,
                first_diff(want, got)
            )));
        }
        checked += 8;
    }
    Ok(checked)
}

/// The offset of the first byte (in memory order) where two 64-bit values differ.
fn first_diff(a: u64, b: u64) -> usize {
    a.to_ne_bytes()
        .iter()
        .zip(b.to_ne_bytes())
        .position(|(x, y)| *x != y)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(args: &[&str]) -> TestParams {
        crate::params::from_args(args).unwrap()
    }

    #[test]
    fn every_byte_that_travels_is_checked_by_the_side_it_lands_on() {
        let w = params(&["write", "bw", "--data-validation"]);
        let (c, s) = (DataRoles::of(&w, true), DataRoles::of(&w, false));
        assert!(c.sends && !c.checks());
        assert!(s.lands && s.checks() && !s.sends);
        let r = params(&["read", "bw", "--data-validation"]);
        let (c, s) = (DataRoles::of(&r, true), DataRoles::of(&r, false));
        assert!(c.reads && c.checks() && !c.is_read);
        assert!(s.is_read && !s.checks());
        let b = params(&["send", "bw", "-b", "--data-validation"]);
        for side in [true, false] {
            let roles = DataRoles::of(&b, side);
            assert!(roles.sends && roles.lands);
        }
    }

    #[test]
    fn patterns_differ_by_side_qp_and_size() {
        let base = pattern(tag(true), 0, 4096);
        assert_eq!(base.len(), 4096);
        for other in [
            pattern(tag(false), 0, 4096),
            pattern(tag(true), 1, 4096),
            pattern(tag(true), 0, 8192)[..4096].to_vec(),
        ] {
            let same = base.iter().zip(&other).filter(|(a, b)| a == b).count();
            assert!(same < 4096 / 32, "{same} of 4096 bytes alike");
        }
        // Neighbouring bytes differ, so a shifted copy shows.
        let shifted = base.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(shifted < 4096 / 32, "{shifted} neighbours alike");
    }

    #[test]
    fn differences_are_counted_and_placed() {
        let expected = pattern(tag(true), 3, 64);
        assert_eq!(compare(&expected, &expected), None);
        let mut got = expected.clone();
        got[5] ^= 0xff;
        got[40] ^= 1;
        let text = compare(&expected, &got).unwrap();
        assert!(
            text.starts_with("2 of 64 bytes are not what the peer sent; the first at offset 5"),
            "{text}"
        );
        assert!(text.ends_with("the last at offset 40"), "{text}");
        let cleared: Vec<u8> = expected.iter().map(|b| !b).collect();
        let text = compare(&expected, &cleared).unwrap();
        assert!(text.contains("none of its data arrived"), "{text}");
    }

    #[test]
    fn every_verb_validates() {
        let refuse = |args: &[&str]| crate::params::from_args(args).unwrap_err().to_string();
        assert!(refuse(&["atomic", "bw", "-D", "2", "--data-validation"]).contains("-n"));
        assert!(params(&["send", "bw", "--data_validation"]).data_validation);
        // UD data lands after the GRH.
        let ud = DataRoles::of(
            &params(&["send", "bw", "-c", "UD", "--data-validation"]),
            false,
        );
        assert!(ud.lands && ud.landing_offset == 40);
        let uc = DataRoles::of(
            &params(&["write", "bw", "-c", "UC", "--data-validation"]),
            false,
        );
        assert!(uc.lands && uc.landing_offset == 0);
        // The WRITE ping-pong: both sides send and land, the counter byte left out.
        let wl = params(&["write", "lat", "--data-validation"]);
        for side in [true, false] {
            let r = DataRoles::of(&wl, side);
            assert!(r.sends && r.lands && r.trailer == 1);
        }
        let sl = DataRoles::of(&params(&["send", "lat", "--data-validation"]), true);
        assert!(sl.sends && sl.lands && sl.trailer == 0);
        let rl = params(&["read", "lat", "--data-validation"]);
        assert!(DataRoles::of(&rl, true).reads && DataRoles::of(&rl, false).is_read);
        // Atomics: the server holds the target, the client checks what it fetched.
        let a = params(&["atomic", "bw", "-n", "500", "--data-validation"]);
        let (c, s) = (DataRoles::of(&a, true), DataRoles::of(&a, false));
        assert!(c.atomics && !c.atomic_target && c.checks() && c.ops == 500);
        assert!(s.atomic_target && !s.atomics && s.checks());
    }

    #[test]
    fn atomic_outcomes() {
        let start = atomic_start(tag(false), 0, 8);
        assert_eq!(start & 1, 1, "never 0");
        assert_ne!(start, atomic_start(tag(false), 1, 8));
        assert_eq!(atomic_outcome(10, 500, true), (510, 509));
        assert_eq!(atomic_outcome(10, 500, false), (10, 10));
        assert_eq!(atomic_outcome(u64::MAX, 2, true), (1, 0));
        assert_eq!(
            first_diff(0x100, 0x200),
            if cfg!(target_endian = "little") { 1 } else { 6 }
        );
    }

    #[test]
    fn both_sides_must_ask_for_it() {
        let a = params(&["write", "bw", "--data-validation"]);
        let b = params(&["write", "bw"]);
        assert_eq!(a.mismatches(&b), ["data validation: here true, peer false"]);
    }
}
