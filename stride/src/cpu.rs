//! The host's CPUs: pinning the process (`--pin-cores`, `--numa-node`) and the utilization
//! of a measured loop (`--cpu-util`, from `/proc/stat`, as perftest's `--cpu_util` reads it).

// sched_setaffinity and sched_getaffinity are libc calls.
#![allow(unsafe_code)]

use std::fmt;

/// Parses a CPU list as the kernel and `taskset -c` write it: `0,2-3,8`.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').map(str::trim) {
        if part.is_empty() {
            return Err(format!(
                "'{text}' is not a CPU list (such as 0,2-3): an empty entry"
            ));
        }
        let bad = || format!("'{part}' in '{text}' is not a CPU number or range (such as 2-3)");
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (
                a.trim().parse::<usize>().map_err(|_| bad())?,
                b.trim().parse::<usize>().map_err(|_| bad())?,
            ),
            None => {
                let n = part.parse::<usize>().map_err(|_| bad())?;
                (n, n)
            }
        };
        if lo > hi || hi >= MAX_CPUS {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The most CPUs a set may name: the size of libc's `cpu_set_t`.
pub const MAX_CPUS: usize = 1024;

/// The CPUs of NUMA node `node`, from sysfs.
pub fn numa_node_cpus(node: u32) -> Result<Vec<usize>, String> {
    let path = format!("/sys/devices/system/node/node{node}/cpulist");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!("NUMA node {node} does not exist here ({path}: {e}); see /sys/devices/system/node")
    })?;
    let cpus = parse_cpu_list(&text)?;
    if cpus.is_empty() {
        return Err(format!("NUMA node {node} has no CPUs"));
    }
    Ok(cpus)
}

/// Pins the calling process (its one measuring thread) to `cpus`, then reads the mask
/// back and returns it.
pub fn pin_to(cpus: &[usize]) -> Result<Vec<usize>, String> {
    // SAFETY: cpu_set_t is plain bits; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= MAX_CPUS {
            return Err(format!("CPU {c} is past the {MAX_CPUS} a CPU set holds"));
        }
        // SAFETY: c < MAX_CPUS, the bits of a cpu_set_t.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: set is a valid cpu_set_t of the size passed; pid 0 is this thread.
    let ret = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if ret != 0 {
        return Err(format!(
            "cannot pin to CPUs {}: {} (are they online and allowed here? see nproc and \
             /sys/devices/system/cpu/online)",
            CpuList(cpus),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: cpu_set_t is plain bits; zeroed is the empty set.
    let mut got: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: got is a valid cpu_set_t of the size passed, which the kernel fills.
    let ret =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut got) };
    if ret != 0 {
        return Err(format!(
            "pinned, but cannot read the CPU mask back: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok((0..MAX_CPUS)
        // SAFETY: c < MAX_CPUS, within the set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &got) })
        .collect())
}

/// A CPU list printed the way it is typed: `0,2-3`.
pub struct CpuList<'a>(pub &'a [usize]);

impl fmt::Display for CpuList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let v = self.0;
        let mut first = true;
        while i < v.len() {
            let mut j = i;
            while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
                j += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if j == i {
                write!(f, "{}", v[i])?;
            } else {
                write!(f, "{}-{}", v[i], v[j])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

/// The aggregate CPU times of `/proc/stat`'s first line, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every state together.
    pub total: u64,
    /// Idle and waiting for I/O.
    pub idle: u64,
}

impl CpuTimes {
    /// Parses the `cpu ...` line of `/proc/stat` (user nice system idle iowait irq softirq
    /// steal ...; guest time is already in user).
    pub fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if v.len() < 4 {
            return None;
        }
        let idle = v[3] + v.get(4).copied().unwrap_or(0);
        Some(CpuTimes {
            total: v.iter().sum(),
            idle,
        })
    }

    /// Reads `/proc/stat` now.
    pub fn now() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The busy share of every CPU between `self` and a later reading, in percent.
    pub fn util_since(&self, later: &CpuTimes) -> Option<f64> {
        let total = later.total.checked_sub(self.total)?;
        let idle = later.idle.checked_sub(self.idle)?;
        if total == 0 {
            return None;
        }
        Some(100.0 * total.saturating_sub(idle) as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0").unwrap(), [0]);
        assert_eq!(parse_cpu_list("0,2-3,8\n").unwrap(), [0, 2, 3, 8]);
        assert_eq!(parse_cpu_list("3,1-2,2").unwrap(), [1, 2, 3]);
        for bad in ["", "a", "1,,2", "3-1", "1-", "-1", "99999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad}");
        }
        assert_eq!(CpuList(&[0, 2, 3, 4, 8]).to_string(), "0,2-4,8");
        assert_eq!(CpuList(&[1]).to_string(), "1");
    }

    #[test]
    fn proc_stat() {
        let a = CpuTimes::parse(
            "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\nintr 1\n",
        )
        .unwrap();
        assert_eq!(
            a,
            CpuTimes {
                total: 1000,
                idle: 850
            }
        );
        let b = CpuTimes::parse("cpu  300 0 150 900 50 0 0 0 0 0\n").unwrap();
        // 400 more ticks, 100 of them idle: 75 % busy.
        let u = a.util_since(&b).unwrap();
        assert!((u - 75.0).abs() < 1e-9, "{u}");
        assert_eq!(a.util_since(&a), None);
        assert_eq!(b.util_since(&a), None, "time never runs back");
        assert_eq!(CpuTimes::parse("intr 1\n"), None);
        assert_eq!(CpuTimes::parse("cpu 1 x 3\n"), None);
    }
}
