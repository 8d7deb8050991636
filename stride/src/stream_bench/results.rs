//! What `stride-perf stream` measured: each size's result, the JSON file, the pooling of
//! the connections' runs, and the table's rows.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::plan::Transfer;
use crate::bandwidth::BandwidthResult;
use crate::latency::LatencySummary;
use crate::report::{self, LatencyResult, RULE};

/// One size's latency result: perftest's columns and the round trips per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StreamLatency {
    /// Message size in bytes.
    pub bytes: u64,
    /// Round trips measured, all connections together.
    pub iterations: u64,
    /// The statistics of one round trip / 2, in microseconds.
    pub summary: LatencySummary,
    /// Round trips per second: every connection's round trips over the run's wall time
    /// (from the common start to the last connection's end).
    pub round_trips_per_sec: f64,
}

/// One size's result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum StreamResult {
    /// `stream lat`.
    Latency(StreamLatency),
    /// `stream bw`: the average over the run (no peak).
    Bandwidth(BandwidthResult),
}

impl StreamResult {
    /// The message size.
    pub fn bytes(&self) -> u64 {
        match self {
            StreamResult::Latency(r) => r.bytes,
            StreamResult::Bandwidth(r) => r.bytes,
        }
    }
}

/// The JSON file of `stride-perf stream --json`: the client's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamReport {
    /// Always "stride-perf".
    pub tool: String,
    /// The tool's version.
    pub version: String,
    /// "stream lat" or "stream bw".
    pub test: String,
    /// Stream bytes or messages.
    pub transfer: Transfer,
    /// Parallel connections.
    pub connections: u32,
    /// This side's busy poll in microseconds; `None`: trespass's default.
    pub busy_poll_us: Option<u64>,
    /// This side's limit of the adaptive spin in microseconds; `None`: trespass's default.
    #[serde(default)]
    pub busy_poll_max_us: Option<u64>,
    /// Whether this side's nodelay was on.
    pub nodelay: bool,
    /// Whether this side drove its connections through trespass's tokio front end
    /// (`--tokio`).
    #[serde(default)]
    pub tokio: bool,
    /// This side's shared receive queue depth (`--shared-receive-queue`); `None`: a
    /// receive queue per connection.
    #[serde(default)]
    pub shared_receive_queue: Option<u32>,
    /// The server's address.
    pub server: String,
    /// How the samples were stamped (`tsc` or the monotonic clock).
    pub clock: String,
    /// One entry per size, in run order.
    pub results: Vec<StreamResult>,
}

impl StreamReport {
    /// Writes the report as pretty JSON, replacing `path` atomically.
    pub fn write_json(&self, path: &Path) -> io::Result<()> {
        report::write_json_file(self, path)
    }

    /// Reads a report written by [`StreamReport::write_json`].
    pub fn read_json(path: &Path) -> Result<Self, String> {
        report::read_json_file(path, "a stride-perf stream result file")
    }
}

/// What one connection measured of one size: its samples (lat, microseconds per round
/// trip) and its start and end in seconds from the run's common origin.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConnectionRun {
    /// Round-trip samples in microseconds (lat); empty for bw.
    pub samples: Vec<f64>,
    /// When this connection started, in seconds from the common origin.
    pub start_s: f64,
    /// When it finished.
    pub end_s: f64,
    /// Messages it moved.
    pub messages: u64,
}

/// The wall time of connections run together: from the first start to the last end.
fn span(runs: &[ConnectionRun]) -> f64 {
    let start = runs.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let end = runs
        .iter()
        .map(|r| r.end_s)
        .fold(f64::NEG_INFINITY, f64::max);
    end - start
}

/// The latency result of `size` from every connection's samples, pooled.
pub fn pool_latency(size: u64, runs: &[ConnectionRun]) -> Result<StreamLatency, String> {
    let mut samples: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.samples.iter().copied())
        .collect();
    let iterations = samples.len() as u64;
    let summary = LatencySummary::from_samples(&mut samples, 2.0).map_err(|e| e.to_string())?;
    let wall = span(runs);
    if !(wall > 0.0 && wall.is_finite()) {
        return Err("the run took no measurable time".into());
    }
    Ok(StreamLatency {
        bytes: size,
        iterations,
        summary,
        round_trips_per_sec: iterations as f64 / wall,
    })
}

/// The bandwidth result of `size` from every connection: all bytes over the wall time.
pub fn sum_bandwidth(size: u64, runs: &[ConnectionRun]) -> Result<BandwidthResult, String> {
    let messages: u64 = runs.iter().map(|r| r.messages).sum();
    let wall = span(runs);
    if messages == 0 {
        return Err("no message was moved".into());
    }
    if !(wall > 0.0 && wall.is_finite()) {
        return Err("the run took no measurable time: raise -n or -s".into());
    }
    Ok(BandwidthResult {
        bytes: size,
        iterations: messages,
        peak_bytes_per_sec: None,
        avg_bytes_per_sec: size as f64 * messages as f64 / wall,
        msg_rate_mpps: messages as f64 / wall / 1e6,
        intervals: None,
        cpu_util_percent: None,
    })
}

/// The latency table's header: perftest's columns and the round trips per second.
pub fn latency_header() -> String {
    format!("{}  round trips/sec", report::latency_header().trim_end())
}

/// One latency row.
pub fn latency_row(r: &StreamLatency) -> String {
    let row = report::latency_row(&LatencyResult {
        bytes: r.bytes,
        iterations: r.iterations,
        summary: r.summary,
    });
    format!("{row}\t\t{:.0}", r.round_trips_per_sec)
}

/// The bandwidth table's header: MiB/s (2^20 bytes, perftest's "MB/sec") and Gb/s.
pub fn bandwidth_header() -> String {
    format!(
        "{RULE}\n #bytes     #iterations    BW average[MiB/sec]    BW average[Gb/sec]    MsgRate[Mpps]"
    )
}

/// One bandwidth row.
pub fn bandwidth_row(r: &BandwidthResult) -> String {
    format!(
        " {:<7}    {:<10}       {:<10.2}             {:<10.3}            {:<7.6}",
        r.bytes,
        r.iterations,
        r.avg(false),
        r.avg(true),
        r.msg_rate_mpps
    )
}

pub(super) fn row(r: &StreamResult) -> String {
    match r {
        StreamResult::Latency(l) => latency_row(l),
        StreamResult::Bandwidth(b) => bandwidth_row(b),
    }
}
