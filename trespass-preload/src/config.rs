//! What the environment asks for: which connections to carry, how long to try, where the
//! counters go. Read once, on the first connect, listen or accept.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// `TRESPASS_PRELOAD`: `off` (or `0`) leaves every socket alone.
pub(crate) const ENV_SWITCH: &str = "TRESPASS_PRELOAD";
/// `TRESPASS_PRELOAD_PORTS`: ports and ranges (`5201,6379,8000-8099`); unset: every port.
pub(crate) const ENV_PORTS: &str = "TRESPASS_PRELOAD_PORTS";
/// `TRESPASS_PRELOAD_NETS`: address ranges (`198.18.0.0/15,fd00::/8`); unset: every address.
pub(crate) const ENV_NETS: &str = "TRESPASS_PRELOAD_NETS";
/// `TRESPASS_PRELOAD_TIMEOUT_MS`: how long a connect tries RDMA before TCP (1 to 60000).
pub(crate) const ENV_TIMEOUT: &str = "TRESPASS_PRELOAD_TIMEOUT_MS";
/// `TRESPASS_PRELOAD_CONNECT_WAIT_MS`: how long a connect on a non-blocking socket waits
/// for the RDMA attempt's answer before it returns `EINPROGRESS` (0 to 60000).
pub(crate) const ENV_CONNECT_WAIT: &str = "TRESPASS_PRELOAD_CONNECT_WAIT_MS";
/// `TRESPASS_PRELOAD_STATS`: `stderr` (or `1`) prints the counters at exit; anything else
/// is a file the counters are appended to, one line per process.
pub(crate) const ENV_STATS: &str = "TRESPASS_PRELOAD_STATS";
/// `TRESPASS_PRELOAD_BUSY_POLL_US`: how long the pump spins on a quiet connection before it
/// sleeps (0 to 1000000 microseconds; default 0).
pub(crate) const ENV_BUSY_POLL: &str = "TRESPASS_PRELOAD_BUSY_POLL_US";
/// `TRESPASS_PRELOAD_DIRECT`: `off` (or `0`) makes every byte go through the pump; on by
/// default (the program's reads and writes reach the trespass stream themselves when they
/// can: see `direct`).
pub(crate) const ENV_DIRECT: &str = "TRESPASS_PRELOAD_DIRECT";
/// `TRESPASS_PRELOAD_STAND_IN`: `off` (or `0`) makes a blocking direct read wait on the
/// stream's readiness fd beside the pump (both woken by each arrival) rather than in the
/// pump's place; on by default.
pub(crate) const ENV_STAND_IN: &str = "TRESPASS_PRELOAD_STAND_IN";
/// `TRESPASS_PRELOAD_LOG`: `1` says on stderr why each connection went where it went.
pub(crate) const ENV_LOG: &str = "TRESPASS_PRELOAD_LOG";

/// The default of [`ENV_TIMEOUT`]: a peer served by trespass answers within milliseconds and
/// one with RDMA but no trespass listener refuses as fast; this bounds the case of a peer
/// whose host does not answer RDMA connection requests at all.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(2000);

/// The default of [`ENV_CONNECT_WAIT`]: long enough for a served peer's answer or a
/// refusal on one network (the connection is then set up as a blocking connect's would be:
/// RDMA carried, or a plain TCP connect), short enough that an event loop barely feels a
/// peer that does not answer (its attempt goes on in the pump).
pub(crate) const DEFAULT_CONNECT_WAIT: Duration = Duration::from_millis(50);

/// Where the counters go at exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stats {
    /// Nowhere.
    Off,
    /// A line on stderr.
    Stderr,
    /// A line appended to this file.
    File(PathBuf),
}

/// An address range, `IP/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Net {
    ip: IpAddr,
    prefix: u8,
}

impl Net {
    fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.ip, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The parsed environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// Off: every socket is left alone.
    pub(crate) enabled: bool,
    ports: Option<Vec<(u16, u16)>>,
    nets: Option<Vec<Net>>,
    pub(crate) timeout: Duration,
    /// How long a non-blocking connect waits for the RDMA answer (at most `timeout`).
    pub(crate) connect_wait: Duration,
    pub(crate) stats: Stats,
    pub(crate) log: bool,
    /// How long the pump spins before sleeping: 0 by default, because the pump is a thread
    /// beside the program's own; spinning there takes a core from the program when cores are
    /// few (a spinning pump made round trips slower, not faster, on the 2-core test guest).
    pub(crate) busy_poll: Duration,
    /// Whether the program's own data calls use the direct path.
    pub(crate) direct: bool,
    /// Whether a blocking direct read waits on the stream in the pump's place.
    pub(crate) tenure: bool,
}

impl Config {
    /// Everything on, no counters: what an empty environment means.
    pub(crate) fn everything() -> Config {
        Config {
            enabled: true,
            ports: None,
            nets: None,
            timeout: DEFAULT_TIMEOUT,
            connect_wait: DEFAULT_CONNECT_WAIT,
            stats: Stats::Off,
            log: false,
            busy_poll: Duration::ZERO,
            direct: true,
            tenure: true,
        }
    }

    /// Reads the environment through `var`. A value that does not parse turns carrying off
    /// (every connection goes over TCP) and is named in the returned message, which the
    /// caller prints once; the counters still work, so the user sees the fallback.
    pub(crate) fn from_env(var: impl Fn(&str) -> Option<String>) -> (Config, Option<String>) {
        let mut c = Config::everything();
        let mut problems = Vec::new();
        if let Some(v) = var(ENV_STATS) {
            c.stats = match v.trim() {
                "" | "0" | "off" => Stats::Off,
                "1" | "stderr" => Stats::Stderr,
                path => Stats::File(PathBuf::from(path)),
            };
        }
        if let Some(v) = var(ENV_LOG) {
            c.log = !matches!(v.trim(), "" | "0" | "off");
        }
        if let Some(v) = var(ENV_SWITCH) {
            match v.trim() {
                "off" | "0" => c.enabled = false,
                "" | "on" | "1" => {}
                other => problems.push(format!("{ENV_SWITCH}={other:?} is not on, off, 1 or 0")),
            }
        }
        if let Some(v) = var(ENV_DIRECT) {
            match v.trim() {
                "off" | "0" => c.direct = false,
                "" | "on" | "1" => {}
                other => problems.push(format!("{ENV_DIRECT}={other:?} is not on, off, 1 or 0")),
            }
        }
        if let Some(v) = var(ENV_STAND_IN) {
            match v.trim() {
                "off" | "0" => c.tenure = false,
                "" | "on" | "1" => {}
                other => problems.push(format!("{ENV_STAND_IN}={other:?} is not on, off, 1 or 0")),
            }
        }
        if let Some(v) = var(ENV_PORTS) {
            match parse_ports(&v) {
                Ok(p) => c.ports = Some(p),
                Err(e) => problems.push(format!("{ENV_PORTS}={v:?}: {e}")),
            }
        }
        if let Some(v) = var(ENV_NETS) {
            match parse_nets(&v) {
                Ok(n) => c.nets = Some(n),
                Err(e) => problems.push(format!("{ENV_NETS}={v:?}: {e}")),
            }
        }
        if let Some(v) = var(ENV_TIMEOUT) {
            match v.trim().parse::<u64>() {
                Ok(ms @ 1..=60_000) => c.timeout = Duration::from_millis(ms),
                _ => problems.push(format!(
                    "{ENV_TIMEOUT}={v:?} is not a number of milliseconds from 1 to 60000"
                )),
            }
        }
        if let Some(v) = var(ENV_CONNECT_WAIT) {
            match v.trim().parse::<u64>() {
                Ok(ms @ 0..=60_000) => c.connect_wait = Duration::from_millis(ms),
                _ => problems.push(format!(
                    "{ENV_CONNECT_WAIT}={v:?} is not a number of milliseconds from 0 to 60000"
                )),
            }
        }
        if let Some(v) = var(ENV_BUSY_POLL) {
            match v.trim().parse::<u64>() {
                Ok(us @ 0..=1_000_000) => c.busy_poll = Duration::from_micros(us),
                _ => problems.push(format!(
                    "{ENV_BUSY_POLL}={v:?} is not a number of microseconds from 0 to 1000000"
                )),
            }
        }
        if problems.is_empty() {
            return (c, None);
        }
        c.enabled = false;
        let msg = format!(
            "trespass-preload: {}; every connection goes over TCP (fix or unset the variable)",
            problems.join("; ")
        );
        (c, Some(msg))
    }

    /// Whether a connection to `peer` is tried over RDMA.
    pub(crate) fn covers(&self, peer: SocketAddr) -> bool {
        self.enabled && self.covers_port(peer.port()) && self.covers_ip(peer.ip())
    }

    /// Whether a listener on `local` also listens for RDMA (an unspecified address is
    /// covered whenever the port is: it includes the configured ranges).
    pub(crate) fn covers_listener(&self, local: SocketAddr) -> bool {
        self.enabled
            && self.covers_port(local.port())
            && (local.ip().is_unspecified() || self.covers_ip(local.ip()))
    }

    fn covers_port(&self, port: u16) -> bool {
        self.ports
            .as_ref()
            .is_none_or(|r| r.iter().any(|&(lo, hi)| (lo..=hi).contains(&port)))
    }

    fn covers_ip(&self, ip: IpAddr) -> bool {
        self.nets
            .as_ref()
            .is_none_or(|n| n.iter().any(|net| net.contains(ip)))
    }
}

fn parse_ports(v: &str) -> Result<Vec<(u16, u16)>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim) {
        let port = |s: &str| -> Result<u16, String> {
            match s.trim().parse::<u16>() {
                Ok(p) if p > 0 => Ok(p),
                _ => Err(format!("{s:?} is not a port from 1 to 65535")),
            }
        };
        let range = match item.split_once('-') {
            Some((lo, hi)) => (port(lo)?, port(hi)?),
            None => (port(item)?, port(item)?),
        };
        if range.0 > range.1 {
            return Err(format!("the range {item:?} is backwards"));
        }
        out.push(range);
    }
    Ok(out)
}

fn parse_nets(v: &str) -> Result<Vec<Net>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim) {
        let (ip, prefix) = match item.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (item, None),
        };
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("{item:?} is not an address or ADDRESS/PREFIX"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => return Err(format!("{item:?}: the prefix is not 0 to {max}")),
            },
        };
        out.push(Net { ip, prefix });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> (Config, Option<String>) {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_env(|k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn nothing_set_carries_everything() {
        let (c, msg) = env(&[]);
        assert_eq!(msg, None);
        assert!(c.covers(sa("198.18.0.1:1")) && c.covers(sa("[fd00::1]:65535")));
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert_eq!(c.stats, Stats::Off);
    }

    #[test]
    fn ports_and_nets_narrow_it() {
        let (c, msg) = env(&[
            (ENV_PORTS, "5201, 6379,8000-8099"),
            (ENV_NETS, "198.18.0.0/15,fd00::/8,10.1.2.3"),
        ]);
        assert_eq!(msg, None);
        assert!(c.covers(sa("198.19.255.254:6379")));
        assert!(c.covers(sa("198.18.0.1:8099")));
        assert!(!c.covers(sa("198.18.0.1:8100")));
        assert!(!c.covers(sa("198.20.0.1:5201")));
        assert!(
            c.covers(sa("[::ffff:198.18.0.9]:5201")),
            "v4-mapped is matched as v4"
        );
        assert!(c.covers(sa("[fd12::1]:5201")));
        assert!(!c.covers(sa("[fe80::1]:5201")));
        assert!(c.covers(sa("10.1.2.3:5201")) && !c.covers(sa("10.1.2.4:5201")));
        assert!(c.covers_listener(sa("0.0.0.0:5201")));
        assert!(c.covers_listener(sa("[::]:6379")));
        assert!(!c.covers_listener(sa("127.0.0.1:6379")));
        assert!(!c.covers_listener(sa("0.0.0.0:22")));
    }

    #[test]
    fn a_zero_prefix_is_everything_of_its_family() {
        let (c, _) = env(&[(ENV_NETS, "0.0.0.0/0")]);
        assert!(c.covers(sa("203.0.113.1:1")));
        assert!(!c.covers(sa("[fd00::1]:1")));
    }

    #[test]
    fn bad_values_turn_carrying_off_with_one_message_naming_each() {
        for (k, v) in [
            (ENV_PORTS, "http"),
            (ENV_PORTS, "0"),
            (ENV_PORTS, "9-3"),
            (ENV_PORTS, "70000"),
            (ENV_PORTS, ""),
            (ENV_NETS, "198.18.0.0/33"),
            (ENV_NETS, "fd00::/129"),
            (ENV_NETS, "example.com"),
            (ENV_TIMEOUT, "0"),
            (ENV_TIMEOUT, "60001"),
            (ENV_TIMEOUT, "1s"),
            (ENV_SWITCH, "maybe"),
            (ENV_DIRECT, "sometimes"),
            (ENV_STAND_IN, "yes"),
            (ENV_BUSY_POLL, "2000000"),
            (ENV_BUSY_POLL, "fast"),
            (ENV_CONNECT_WAIT, "60001"),
            (ENV_CONNECT_WAIT, "-1"),
        ] {
            let (c, msg) = env(&[(k, v), (ENV_STATS, "stderr")]);
            let msg = msg.unwrap_or_else(|| panic!("{k}={v} was accepted"));
            assert!(msg.contains(k) && msg.contains("over TCP"), "{msg}");
            assert!(!c.enabled && !c.covers(sa("198.18.0.1:1")), "{k}={v}");
            assert_eq!(
                c.stats,
                Stats::Stderr,
                "the counters still report the fallback"
            );
        }
        let (_, msg) = env(&[(ENV_PORTS, "x"), (ENV_NETS, "y")]);
        let msg = msg.unwrap();
        assert!(msg.contains(ENV_PORTS) && msg.contains(ENV_NETS), "{msg}");
    }

    #[test]
    fn switches_and_outputs() {
        assert!(!env(&[(ENV_SWITCH, "off")]).0.enabled);
        assert!(env(&[(ENV_SWITCH, "1")]).0.enabled);
        assert!(env(&[]).0.direct);
        assert!(!env(&[(ENV_DIRECT, "off")]).0.direct);
        assert!(env(&[(ENV_DIRECT, "on")]).0.direct);
        assert!(env(&[]).0.tenure);
        assert!(!env(&[(ENV_STAND_IN, "0")]).0.tenure);
        assert!(env(&[(ENV_STAND_IN, "on")]).0.tenure);
        assert_eq!(env(&[(ENV_STATS, "1")]).0.stats, Stats::Stderr);
        assert_eq!(
            env(&[(ENV_STATS, "/tmp/x.stats")]).0.stats,
            Stats::File("/tmp/x.stats".into())
        );
        assert_eq!(
            env(&[(ENV_TIMEOUT, "250")]).0.timeout,
            Duration::from_millis(250)
        );
        assert!(env(&[(ENV_LOG, "1")]).0.log);
        assert_eq!(
            env(&[(ENV_BUSY_POLL, "50")]).0.busy_poll,
            Duration::from_micros(50)
        );
        assert_eq!(env(&[]).0.busy_poll, Duration::ZERO);
        assert_eq!(env(&[]).0.connect_wait, DEFAULT_CONNECT_WAIT);
        assert_eq!(
            env(&[(ENV_CONNECT_WAIT, "0")]).0.connect_wait,
            Duration::ZERO
        );
    }
}
