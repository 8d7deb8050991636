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
//! Only RC bandwidth tests of write, read and send are checked (the parameters refuse the
//! rest): RC delivers every message or fails the run, so the last message of a size is
//! certain to be in place; a latency ping-pong rewrites its buffer as it goes.

use super::setup::Resources;
use super::RunError;
use crate::cli::Verb;
use crate::params::TestParams;

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
}

impl DataRoles {
    /// The roles of the client (`is_client`) or the server in a run of `params`.
    pub(super) fn of(params: &TestParams, is_client: bool) -> Self {
        let active = is_client || params.bidirectional;
        let passive = !is_client || params.bidirectional;
        let moves = matches!(params.verb, Verb::Write | Verb::Send);
        let read = params.verb == Verb::Read;
        DataRoles {
            sends: moves && active,
            lands: moves && passive,
            is_read: read && passive,
            reads: read && active,
        }
    }

    /// True when this side compares anything.
    pub(super) fn checks(self) -> bool {
        self.lands || self.reads
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
    for (q, buf) in res.bufs.iter_mut().enumerate() {
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
            buf.write(half, &cleared)?;
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
    let n = usize::try_from(size).unwrap_or(usize::MAX);
    let mut checked = 0;
    for (q, buf) in res.bufs.iter().enumerate() {
        let theirs = pattern(tag(!is_client), q, size);
        let (at, what) = match (roles.lands, roles.reads) {
            (true, _) => (half, "the peer's data"),
            (_, true) => (0, "the data this side read"),
            _ => continue,
        };
        let got = buf.read(at..at + n)?;
        if let Some(diff) = compare(&theirs, &got) {
            return Err(RunError::new(format!(
                "data validation failed: size {size}, QP {q}: {what}: {diff}"
            )));
        }
        checked += size;
    }
    Ok(checked)
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
    fn only_rc_bandwidth_tests_of_data_verbs_validate() {
        let refuse = |args: &[&str]| crate::params::from_args(args).unwrap_err().to_string();
        assert!(refuse(&["write", "lat", "--data-validation"]).contains("bandwidth tests"));
        assert!(refuse(&["atomic", "bw", "--data-validation"]).contains("atomic"));
        assert!(refuse(&["send", "bw", "-c", "UD", "--data-validation"]).contains("-c RC"));
        assert!(params(&["send", "bw", "--data_validation"]).data_validation);
        let a = params(&["write", "bw", "--data-validation"]);
        let b = params(&["write", "bw"]);
        assert_eq!(a.mismatches(&b), ["data validation: here true, peer false"]);
    }
}
