//! Credits: cumulative counters that the peer reports modulo 2^30, checked before use.

use crate::wire::COUNTER_MASK;

/// A cumulative count (bytes consumed, receives posted again) that the peer reports in 30
/// bits. The full 64-bit value is rebuilt from the last one known; a report that would move
/// it backwards or past what is possible is refused, so a lying peer cannot grant itself
/// (or this side) credit that does not exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cumulative(u64);

/// A credit report that cannot be true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CreditOverrun {
    /// What the report amounts to (the rebuilt 64-bit value).
    pub(crate) claimed: u64,
    /// The most it could be.
    pub(crate) limit: u64,
}

impl Cumulative {
    pub(crate) fn get(self) -> u64 {
        self.0
    }

    /// Takes the peer's report `wire` (modulo 2^30), which may not exceed `limit`; returns
    /// how much it grew. The counter never moves backwards: a report is read as the
    /// smallest value at or above the current one that matches it modulo 2^30.
    pub(crate) fn advance(&mut self, wire: u32, limit: u64) -> Result<u64, CreditOverrun> {
        let wire = u64::from(wire & COUNTER_MASK);
        let modulus = u64::from(COUNTER_MASK) + 1;
        let delta = (wire + modulus - (self.0 & u64::from(COUNTER_MASK))) % modulus;
        let claimed = self.0 + delta;
        if claimed > limit {
            return Err(CreditOverrun { claimed, limit });
        }
        self.0 = claimed;
        Ok(delta)
    }
}

/// The value a cumulative count travels as.
pub(crate) fn wire_value(count: u64) -> u32 {
    (count & u64::from(COUNTER_MASK)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_wrap_modulo_two_to_the_thirty() {
        let mut c = Cumulative((1 << 30) - 2);
        assert_eq!(c.advance(3, u64::MAX), Ok(5));
        assert_eq!(c.get(), (1 << 30) + 3);
        assert_eq!(
            c.advance(3, u64::MAX),
            Ok(0),
            "a repeated report grants nothing"
        );
    }

    #[test]
    fn a_report_beyond_the_limit_is_refused_and_changes_nothing() {
        let mut c = Cumulative(100);
        assert_eq!(
            c.advance(150, 120),
            Err(CreditOverrun {
                claimed: 150,
                limit: 120
            })
        );
        assert_eq!(c.get(), 100);
        // A "backwards" report reads as a jump of almost 2^30: refused too.
        assert!(c.advance(99, 1 << 20).is_err());
    }

    #[test]
    fn wire_values_are_the_low_thirty_bits() {
        assert_eq!(wire_value((1 << 30) + 7), 7);
        let mut c = Cumulative::default();
        assert_eq!(c.advance(wire_value(12345), 12345), Ok(12345));
    }
}
