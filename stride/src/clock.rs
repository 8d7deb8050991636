//! The clock stride-perf timestamps with, and what one reading of it costs.
//!
//! Every post and every completion gets a timestamp from the monotonic clock
//! ([`std::time::Instant`], `clock_gettime(CLOCK_MONOTONIC)`). With a TSC clocksource the
//! kernel serves that from user space in tens of nanoseconds; with another (HPET, ACPI PM,
//! some hypervisors' clocks) every reading is a system call and a device read, often a
//! microsecond or more, and short messages then measure the clock as much as the network.
//! The kernel can also switch clocksources mid-run, when its watchdog decides the TSC is
//! unstable. stride-perf measures the cost before a run, says which clocksource it is, warns
//! when it is slow, and says so when the clocksource changed by the end of the run.

use std::hint::black_box;

use crate::cli::Test;
use std::time::Instant;

/// Where Linux names the clocksource in use.
pub const CLOCKSOURCE_PATH: &str =
    "/sys/devices/system/clocksource/clocksource0/current_clocksource";

/// A reading slower than this gets a warning: a TSC read through the vDSO is well below
/// it, even in an emulated guest, and a system call with a device read is well above it.
pub const SLOW_READ_NS: f64 = 400.0;

const READS_PER_ROUND: u32 = 1000;
const ROUNDS: u32 = 5;

/// The clock as found before a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ClockCheck {
    /// The kernel's clocksource (`tsc`, `hpet`, ...); `None` where it cannot be read.
    pub source: Option<String>,
    /// What one reading of the monotonic clock costs, in nanoseconds: the fastest of a few
    /// rounds, so that a round the scheduler interrupted does not count.
    pub read_ns: f64,
    /// Whether the latency loops stamp their posts with the TSC
    /// ([`crate::post_clock`]): the clocksource is `tsc` and the process may read it.
    pub tsc_stamps: bool,
}

impl ClockCheck {
    /// Reads the clocksource's name and times `5 × 1000` clock readings (a few
    /// milliseconds even with a slow clock).
    pub fn measure() -> Self {
        let mut best = f64::INFINITY;
        for _ in 0..ROUNDS {
            let start = Instant::now();
            for _ in 0..READS_PER_ROUND {
                black_box(Instant::now());
            }
            let per_read = start.elapsed().as_secs_f64() * 1e9 / f64::from(READS_PER_ROUND);
            best = best.min(per_read);
        }
        let source = current_source();
        ClockCheck {
            tsc_stamps: crate::post_clock::tsc_usable(source.as_deref()),
            source,
            read_ns: best,
        }
    }

    /// For the banner and the JSON report: `tsc, 23 ns per read` (see also
    /// [`ClockCheck::description_for`]).
    pub fn description(&self) -> String {
        format!(
            "{}, {:.0} ns per read",
            self.source.as_deref().unwrap_or("clocksource unknown"),
            self.read_ns
        )
    }

    /// The description for a run of `test`: a latency test's adds how it stamps its posts,
    /// `tsc, 23 ns per read, posts stamped by RDTSC`.
    pub fn description_for(&self, test: Test) -> String {
        match (test, self.tsc_stamps) {
            (Test::Bw, _) => self.description(),
            (Test::Lat, true) => format!("{}, posts stamped by RDTSC", self.description()),
            (Test::Lat, false) => format!("{}, posts stamped by this clock", self.description()),
        }
    }

    /// A warning when reading the clock is slow enough to distort the results.
    pub fn warning(&self) -> Option<String> {
        if self.read_ns <= SLOW_READ_NS {
            return None;
        }
        let source = match &self.source {
            Some(s) => format!("the kernel's clocksource is {s}"),
            None => "the kernel's clocksource could not be read".to_owned(),
        };
        Some(format!(
            "warning: one reading of the clock takes {:.0} ns here ({source}); stride-perf \
             timestamps every post and completion, so small messages will measure the clock \
             as well as the network. A TSC clocksource reads in tens of ns: see {} and \
             available_clocksource beside it",
            self.read_ns, CLOCKSOURCE_PATH
        ))
    }

    /// When the kernel's clocksource is no longer the one found before the run: a warning
    /// that names both (the results after the switch used the other clock).
    pub fn switched(&self, now: Option<&str>) -> Option<String> {
        match (self.source.as_deref(), now) {
            (Some(before), Some(now)) if before != now => Some(format!(
                "warning: the kernel switched its clocksource from {before} to {now} during \
                 the run (its kernel log says why: usually the watchdog found the TSC \
                 unstable); timings after the switch were read through {now}"
            )),
            _ => None,
        }
    }
}

/// The kernel's clocksource now, where Linux says it.
pub fn current_source() -> Option<String> {
    parse_source(&std::fs::read_to_string(CLOCKSOURCE_PATH).ok()?)
}

fn parse_source(text: &str) -> Option<String> {
    let name = text.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(source: Option<&str>, read_ns: f64) -> ClockCheck {
        ClockCheck {
            source: source.map(str::to_owned),
            read_ns,
            tsc_stamps: source == Some("tsc"),
        }
    }

    #[test]
    fn parses_the_sysfs_name() {
        assert_eq!(parse_source("tsc\n").as_deref(), Some("tsc"));
        assert_eq!(parse_source("  hpet \n").as_deref(), Some("hpet"));
        assert_eq!(parse_source("\n"), None);
        assert_eq!(parse_source(""), None);
    }

    #[test]
    fn describes_source_and_cost() {
        assert_eq!(
            check(Some("tsc"), 23.4).description(),
            "tsc, 23 ns per read"
        );
        assert_eq!(
            check(None, 1500.0).description(),
            "clocksource unknown, 1500 ns per read"
        );
        assert_eq!(
            check(Some("tsc"), 23.4).description_for(Test::Lat),
            "tsc, 23 ns per read, posts stamped by RDTSC"
        );
        assert_eq!(
            check(Some("hpet"), 900.0).description_for(Test::Lat),
            "hpet, 900 ns per read, posts stamped by this clock"
        );
        assert_eq!(
            check(Some("tsc"), 23.4).description_for(Test::Bw),
            "tsc, 23 ns per read"
        );
    }

    #[test]
    fn warns_only_above_the_threshold() {
        assert_eq!(check(Some("tsc"), 30.0).warning(), None);
        assert_eq!(check(Some("tsc"), SLOW_READ_NS).warning(), None);
        let w = check(Some("hpet"), 2300.0).warning().unwrap();
        assert!(w.contains("2300 ns"), "{w}");
        assert!(w.contains("clocksource is hpet"), "{w}");
        assert!(w.contains(CLOCKSOURCE_PATH), "{w}");
        let w = check(None, 2300.0).warning().unwrap();
        assert!(w.contains("could not be read"), "{w}");
    }

    #[test]
    fn notices_a_switch() {
        let c = check(Some("tsc"), 30.0);
        assert_eq!(c.switched(Some("tsc")), None);
        assert_eq!(c.switched(None), None);
        let w = c.switched(Some("hpet")).unwrap();
        assert!(w.contains("from tsc to hpet"), "{w}");
        assert_eq!(check(None, 30.0).switched(Some("hpet")), None);
    }

    #[test]
    fn measures_a_positive_cost() {
        let c = ClockCheck::measure();
        assert!(c.read_ns.is_finite() && c.read_ns > 0.0, "{c:?}");
        // Where Linux names the clocksource, the check reads it.
        if std::path::Path::new(CLOCKSOURCE_PATH).exists() {
            assert!(c.source.is_some(), "{c:?}");
        }
    }
}
