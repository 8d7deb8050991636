//! The timestamps of the latency loops' posts: one `RDTSC` where the kernel itself keeps
//! time with the TSC, the monotonic clock elsewhere; turned into microseconds after the loop.
//!
//! A latency loop stamps each post between seeing what it waited for (a completion, the
//! peer's message) and ringing the doorbell, so the stamp's cost sits on the measured path.
//! perftest reads the TSC there (`get_cycles`). stride-perf read the monotonic clock
//! (`Instant::now()`, a vDSO `clock_gettime`): in the SoftRoCE guest that was enough to
//! put 8-byte READs into SoftRoCE's slow regime (a post that comes more than about a
//! microsecond after the completion runs the QP's kernel work itself), 1.4 times perftest's
//! latency, and at parity with the TSC (docs/compare-perftest-notes.md).
//!
//! The TSC is used only where Linux keeps time with it (clocksource `tsc`: the kernel found
//! it invariant and synchronised across CPUs; see [`crate::clock`]) and where this process
//! may read it (`PR_GET_TSC`, else `RDTSC` faults). Its rate is measured against the
//! monotonic clock over the whole run, from [`PostClock::start`] to each conversion, rather than
//! taken from /proc/cpuinfo as perftest does (which is right only to within the 2 % perftest
//! tolerates).

// RDTSC and prctl(PR_GET_TSC) are an intrinsic and a libc call.
#![allow(unsafe_code)]

use std::fmt;
use std::time::Instant;

/// Whether the posts of a run can be stamped with the TSC: on x86_64, with the kernel's
/// clocksource `source` being `tsc`, and the process allowed to read it.
pub fn tsc_usable(source: Option<&str>) -> bool {
    cfg!(target_arch = "x86_64") && source == Some("tsc") && tsc_permitted()
}

#[cfg(target_os = "linux")]
fn tsc_permitted() -> bool {
    let mut mode: libc::c_int = 0;
    // SAFETY: PR_GET_TSC stores one int through its second argument, which points at `mode`,
    // alive for the call.
    let r = unsafe { libc::prctl(libc::PR_GET_TSC, &mut mode as *mut libc::c_int) };
    r == 0 && mode == libc::PR_TSC_ENABLE
}

#[cfg(not(target_os = "linux"))]
fn tsc_permitted() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC reads a counter and touches no memory; every x86_64 CPU has it, and it
    // is called only by a PostClock made after tsc_usable() saw that this process may run
    // it (with PR_TSC_SIGSEGV it would fault).
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn rdtsc() -> u64 {
    0
}

/// The most post stamps a latency run keeps for one size when it is timed (`-D`): 8 Mi
/// stamps, 64 MiB, allocated before the run. A run timed by the clock has no count to size
/// its stamps by, so past this its statistics (minimum, median, average, deviation,
/// percentiles) are those of its first `DURATION_STAMPS_MAX` iterations, which on a fast
/// device are its first few seconds; its iteration count is still every iteration.
pub const DURATION_STAMPS_MAX: usize = 8 << 20;

/// The post stamps of one size of a latency run: at most `cap` of them are kept (the first
/// ones), and every stamp is counted. Its room is allocated before the run (the measured
/// loop allocates only past it), and a run of any length holds at most `cap` stamps.
#[derive(Debug, Clone, Default)]
pub struct StampLog {
    kept: Vec<u64>,
    cap: usize,
    total: u64,
}

impl StampLog {
    /// A log that keeps at most `cap` stamps, with room for all of them.
    pub fn with_cap(cap: usize) -> Self {
        Self::with_room(cap, cap)
    }

    /// A log that keeps at most `cap` stamps, with room for `room` of them at first.
    pub fn with_room(room: usize, cap: usize) -> Self {
        StampLog {
            kept: Vec::with_capacity(room.min(cap)),
            cap,
            total: 0,
        }
    }

    /// Counts a stamp, and keeps it while there is room.
    #[inline(always)]
    pub fn push(&mut self, stamp: u64) {
        self.total += 1;
        if self.kept.len() < self.cap {
            self.kept.push(stamp);
        }
    }

    /// Forgets every stamp (a new size), keeping the room.
    pub fn clear(&mut self) {
        self.kept.clear();
        self.total = 0;
    }

    /// The stamps kept, in order: the first [`StampLog::cap`] ones.
    pub fn kept(&self) -> &[u64] {
        &self.kept
    }

    /// How many stamps were pushed, kept or not.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The most stamps kept.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The room allocated, in stamps.
    pub fn capacity(&self) -> usize {
        self.kept.capacity()
    }
}

/// The clock the latency loops stamp their posts with; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct PostClock {
    tsc: bool,
    base: Instant,
    base_tsc: u64,
}

/// Why stamps could not be turned into intervals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClockError {
    /// A stamp is below the one before it: the TSC is not synchronised across the CPUs the
    /// run moved between.
    Backwards,
    /// No TSC ticks between the start of the run and now.
    NoTicks,
}

impl fmt::Display for ClockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClockError::Backwards => write!(
                f,
                "the TSC went backwards between two posts: its CPUs are not synchronised, \
                 although the kernel's clocksource is tsc; pin the run to one CPU \
                 (taskset -c N) or boot with another clocksource"
            ),
            ClockError::NoTicks => write!(
                f,
                "the TSC did not advance during the run; the latency cannot be computed"
            ),
        }
    }
}

impl std::error::Error for ClockError {}

/// One TSC reading and the monotonic clock read between two TSC readings, from the tightest
/// of a few tries (a preemption between the readings would skew the pair).
fn pair() -> (u64, Instant) {
    let mut best = (u64::MAX, 0u64, Instant::now());
    for _ in 0..5 {
        let a = rdtsc();
        let t = Instant::now();
        let b = rdtsc();
        let spread = b.wrapping_sub(a);
        if spread < best.0 {
            best = (spread, a + spread / 2, t);
        }
    }
    (best.1, best.2)
}

impl PostClock {
    /// A clock for a run that starts now: the TSC when `tsc` (from [`tsc_usable`]), else
    /// the monotonic clock.
    pub fn start(tsc: bool) -> Self {
        let tsc = tsc && cfg!(target_arch = "x86_64");
        let (base_tsc, base) = if tsc { pair() } else { (0, Instant::now()) };
        PostClock {
            tsc,
            base,
            base_tsc,
        }
    }

    /// Whether stamps are TSC readings.
    pub fn is_tsc(&self) -> bool {
        self.tsc
    }

    /// A stamp: TSC ticks, or nanoseconds since the start.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        if self.tsc {
            rdtsc()
        } else {
            u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
        }
    }

    /// The intervals between consecutive stamps, in microseconds (the TSC's rate measured
    /// against the monotonic clock from the start to now).
    pub fn intervals_us(&self, stamps: &[u64]) -> Result<Vec<f64>, ClockError> {
        let ns_per_tick = if self.tsc {
            let (now_tsc, now) = pair();
            let ticks = now_tsc
                .checked_sub(self.base_tsc)
                .filter(|&t| t > 0)
                .ok_or(ClockError::NoTicks)?;
            now.duration_since(self.base).as_nanos() as f64 / ticks as f64
        } else {
            1.0
        };
        stamps
            .windows(2)
            .map(|w| {
                let d = w[1].checked_sub(w[0]).ok_or(ClockError::Backwards)?;
                Ok(d as f64 * ns_per_tick / 1000.0)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn intervals_across_sleeps(clock: PostClock) -> Vec<f64> {
        let mut stamps = vec![clock.now()];
        for ms in [20u64, 40] {
            std::thread::sleep(Duration::from_millis(ms));
            stamps.push(clock.now());
        }
        clock.intervals_us(&stamps).unwrap()
    }

    #[test]
    fn the_monotonic_clock_measures_microseconds() {
        let clock = PostClock::start(false);
        assert!(!clock.is_tsc());
        let d = intervals_across_sleeps(clock);
        assert!(d[0] >= 20_000.0 && d[0] < 200_000.0, "{d:?}");
        assert!(d[1] >= 40_000.0 && d[1] < 400_000.0, "{d:?}");
    }

    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn the_tsc_measures_microseconds() {
        // Whatever the clocksource: the calibration against the monotonic clock holds for
        // any constant-rate TSC, which every x86_64 CPU of the last fifteen years has.
        assert!(
            tsc_permitted(),
            "this process may not run RDTSC (PR_TSC_SIGSEGV)"
        );
        let clock = PostClock::start(true);
        assert!(clock.is_tsc());
        let d = intervals_across_sleeps(clock);
        // Sleeps last at least what was asked; the calibrated rate is within a few percent
        // even on a loaded machine (the baseline is the whole 60 ms).
        assert!(d[0] >= 19_000.0 && d[0] < 200_000.0, "{d:?}");
        assert!(d[1] >= 38_000.0 && d[1] < 400_000.0, "{d:?}");
    }

    #[test]
    fn stamps_that_go_backwards_are_an_error_not_a_huge_interval() {
        let clock = PostClock::start(false);
        assert_eq!(
            clock.intervals_us(&[10, 5]).unwrap_err(),
            ClockError::Backwards
        );
        assert!(ClockError::Backwards.to_string().contains("taskset"));
        assert_eq!(clock.intervals_us(&[7]).unwrap(), Vec::<f64>::new());
        assert_eq!(clock.intervals_us(&[1000, 3000]).unwrap(), vec![2.0]);
    }

    #[test]
    fn only_a_tsc_clocksource_allows_tsc_stamps() {
        assert!(!tsc_usable(Some("hpet")));
        assert!(!tsc_usable(Some("kvm-clock")));
        assert!(!tsc_usable(None));
    }

    #[test]
    fn a_stamp_log_keeps_its_first_stamps_up_to_its_cap_and_counts_all() {
        let mut log = StampLog::with_cap(1000);
        let room = log.capacity();
        for t in 0..1_000_000u64 {
            log.push(t);
        }
        assert_eq!(log.total(), 1_000_000);
        assert_eq!(log.kept().len(), 1000);
        assert_eq!(log.kept()[999], 999);
        assert_eq!(log.capacity(), room, "the log never grows");
        log.clear();
        assert_eq!((log.total(), log.kept().len()), (0, 0));
        assert_eq!(log.capacity(), room);
        // Less room than the cap: it grows to the cap, never past it.
        let mut log = StampLog::with_room(10, 1000);
        for t in 0..100_000u64 {
            log.push(t);
        }
        assert_eq!((log.total(), log.kept().len()), (100_000, 1000));
    }
}
