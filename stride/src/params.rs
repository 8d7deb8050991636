//! Test parameters: the command line with perftest's defaults filled in, checked for
//! combinations that cannot work, and compared between the two sides before a run.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::buffer::BufferKind;
use crate::cli::{AtomicType, Connection, RateUnit, RunArgs, Test, Verb};

/// The largest size of an `-a` sweep: 8 MiB.
pub const MAX_SWEEP_SIZE: u64 = 8 << 20;

/// The most memory a counted run (`-n`) may set aside for its per-message timestamps:
/// 2 GiB. A latency test keeps one 8-byte stamp per round trip; a bandwidth test keeps
/// [`BW_STAMP_BYTES`] per message and QP, twice with `-b`. All of it is allocated before the
/// run, so a larger `-n` is refused rather than left to fail the allocation.
pub const MAX_STAMP_BYTES: u64 = 2 << 30;

/// The bytes a bandwidth test records per message and direction: the post time and the
/// completion's (index, time).
pub const BW_STAMP_BYTES: u64 =
    (std::mem::size_of::<f64>() + std::mem::size_of::<(usize, f64)>()) as u64;

/// The bytes a latency test records per round trip: one post stamp.
pub const LAT_STAMP_BYTES: u64 = std::mem::size_of::<u64>() as u64;

/// Everything that defines a run, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestParams {
    /// The verb.
    pub verb: Verb,
    /// Bandwidth or latency.
    pub test: Test,
    /// Transport.
    pub connection: Connection,
    /// Message sizes, in run order (one unless `-a`).
    pub sizes: Vec<u64>,
    /// Iterations per size (ignored in duration mode).
    pub iterations: u64,
    /// Seconds per size, in duration mode.
    pub duration: Option<u64>,
    /// Outstanding work requests per QP.
    pub tx_depth: u32,
    /// Receive queue depth (send tests).
    pub rx_depth: u32,
    /// One signaled completion every `cq_mod` work requests.
    pub cq_mod: u32,
    /// Work requests per doorbell.
    pub post_list: u32,
    /// Queue pairs.
    pub qps: u32,
    /// Requested path MTU in bytes, if any.
    pub mtu: Option<u32>,
    /// Inline threshold in bytes (`-I`). Without `-I`, latency tests get perftest's default
    /// once [`TestParams::fit_device`] knows the device.
    pub inline_size: u32,
    /// Both directions at once.
    pub bidirectional: bool,
    /// Atomic operation (atomic tests).
    pub atomic_type: AtomicType,
    /// Outstanding READs/atomics per QP (`-o`). [`TestParams::resolve`] leaves 0 here when
    /// `-o` was not given, meaning "the device's most"; [`TestParams::fit_device`] puts the
    /// device's number in. Always 1 for SEND and WRITE, as in perftest.
    pub outstanding: u32,
    /// Sleep on completion events.
    pub events: bool,
    /// Connection setup through rdmacm.
    pub rdma_cm: bool,
    /// QP timeout exponent.
    pub qp_timeout: u8,
    /// Check every byte that arrives (`--data-validation`). Absent from an older peer's
    /// parameters: off.
    #[serde(default)]
    pub data_validation: bool,
    /// Run until the client is interrupted (`--run-infinitely`). Absent from an older
    /// peer's parameters: off.
    #[serde(default)]
    pub run_infinitely: bool,
    /// Seconds between interval reports of a timed run (`--report-interval`); this side's
    /// own choice, not agreed.
    #[serde(default = "default_report_interval")]
    pub report_interval: f64,
    /// The sender's pace (`--rate-limit`); this side's own choice, not agreed: with `-b`
    /// each side paces its own direction.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// The GRH traffic class of this side's packets (`--tclass`); its own choice.
    #[serde(default)]
    pub traffic_class: Option<u8>,
    /// One shared receive queue for every QP's receives (`--use-srq`); the receiver's own
    /// choice.
    #[serde(default)]
    pub use_srq: bool,
    /// One memory region per QP (`--mr-per-qp`) rather than one shared by all; this side's
    /// own choice.
    #[serde(default)]
    pub mr_per_qp: bool,
    /// An unmeasured round before each size (`--perform-warm-up`); the sender's own choice.
    #[serde(default)]
    pub warm_up: bool,
    /// The rdma_cm type of service (`--tos`); this side's own choice.
    #[serde(default)]
    pub tos: Option<u8>,
    /// Measure CPU utilization (`--cpu-util`); this side's own choice.
    #[serde(default)]
    pub cpu_util: bool,
}

fn default_report_interval() -> f64 {
    1.0
}

/// The rate limiter's setting: a rate in a unit, and the burst.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RateLimit {
    /// The rate, in `unit`.
    pub rate: f64,
    /// Its unit.
    pub unit: RateUnit,
    /// Messages per burst.
    pub burst: u32,
}

impl RateLimit {
    /// Messages per second for `bytes`-byte messages.
    pub fn messages_per_sec(&self, bytes: u64) -> f64 {
        let bytes = bytes.max(1) as f64;
        match self.unit {
            RateUnit::G => self.rate * 1e9 / 8.0 / bytes,
            RateUnit::M => self.rate * f64::from(1u32 << 20) / bytes,
            RateUnit::P => self.rate,
        }
    }

    /// The setting as printed: `2 Gb/s in bursts of 1 message`.
    pub fn describe(&self) -> String {
        format!(
            "{} {} in bursts of {} message{}",
            self.rate,
            self.unit.as_str(),
            self.burst,
            if self.burst == 1 { "" } else { "s" }
        )
    }
}

/// A combination of options that cannot work, with what to do instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError(pub String);

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParamError {}

/// The IEEE OUI that Mellanox (NVIDIA) devices report as `vendor_id`.
const MELLANOX_VENDOR_ID: u32 = 0x02c9;

/// perftest's default receive queue depth for SEND tests (`-r`).
const DEFAULT_RX_DEPTH: u32 = 512;
/// The most receives a UD or UC SEND run posts by default (perftest's limit).
const UD_UC_MAX_RX_DEPTH: u32 = 16_000;

fn bail<T>(msg: impl Into<String>) -> Result<T, ParamError> {
    Err(ParamError(msg.into()))
}

/// Refuses a counted run whose per-message timestamps would take more than
/// [`MAX_STAMP_BYTES`], naming `-n`, its largest value for this run and `-D`.
fn check_stamp_memory(
    iterations: u64,
    qps: u32,
    bw: bool,
    bidirectional: bool,
) -> Result<(), ParamError> {
    let per_iteration = if bw {
        BW_STAMP_BYTES * u64::from(qps.max(1)) * if bidirectional { 2 } else { 1 }
    } else {
        LAT_STAMP_BYTES
    };
    let most = MAX_STAMP_BYTES / per_iteration;
    if iterations > most {
        bail(format!(
            "-n {iterations} is more than stride-perf records: each iteration keeps \
             {per_iteration} bytes of timestamps, allocated before the run, and it allows \
             {} GiB (at most -n {most} here); use a smaller -n, or -D SECONDS for a longer run",
            MAX_STAMP_BYTES >> 30
        ))?;
    }
    Ok(())
}

/// Refuses a verb on a transport that cannot carry it, and what `-c DC` does not support.
fn check_connection(verb: Verb, a: &RunArgs) -> Result<(), ParamError> {
    use Connection::*;
    match (verb, a.connection) {
        (Verb::Read, Uc | Ud) => {
            bail("RDMA READ needs a reliable connection: use -c RC (the default)")?
        }
        (Verb::Atomic, Uc | Ud) => {
            bail("atomic operations need a reliable connection: use -c RC (the default)")?
        }
        (Verb::Write, Ud) => bail("RDMA WRITE is not possible on UD: use -c RC or -c UC")?,
        _ => {}
    }
    if a.connection == Dc {
        if a.rdma_cm {
            bail(
                "-R connects QPs through rdma_cm, which makes RC and UD QPs only; DC QPs are \
                 made with mlx5dv_create_qp and connected by stride-perf's own exchange: \
                 drop -R with -c DC",
            )?;
        }
        if a.inline_size.is_some_and(|i| i > 0) {
            bail(
                "-I: stride-perf's DC initiators post from registered memory, not inline \
                 data; drop -I with -c DC",
            )?;
        }
        if a.use_old_post_send {
            bail(
                "--use-old-post-send: a DC request names its target with \
                 mlx5dv_wr_set_dc_addr, which only the ibv_wr_* API has; drop it with -c DC",
            )?;
        }
    }
    Ok(())
}

/// Refuses what the test buffers' memory does not allow: `--staging` without a plain
/// `--use-cuda` GPU, and, with the NIC in GPU memory, write lat's polling and inline data.
fn check_memory(verb: Verb, a: &RunArgs, bw: bool) -> Result<(), ParamError> {
    if a.staging {
        if a.use_cuda_dmabuf.is_some() {
            bail(
                "--staging copies between the GPU and registered host memory, so nothing \
                 on the GPU is registered, by dma-buf or otherwise: use --use-cuda GPU \
                 --staging",
            )?;
        }
        if a.use_cuda.is_none() {
            bail(
                "--staging copies each message between a GPU buffer and host memory, and \
                 this run has no GPU buffer: add --use-cuda GPU, or drop --staging",
            )?;
        }
    }
    // With --staging the NIC works in host memory: every test and -I work.
    if let Some(gpu) = a.gpu_option().filter(|_| !a.staging) {
        if verb == Verb::Write && !bw {
            bail(format!(
                "write lat polls the last byte of the receive buffer in host memory, which \
                 a GPU buffer is not; use send lat or read lat with {gpu}, or drop {gpu}"
            ))?;
        }
        if a.inline_size.is_some_and(|i| i > 0) {
            bail(format!(
                "-I (inline data) copies the message from host memory, which a GPU buffer \
                 is not; drop -I with {gpu}"
            ))?;
        }
    }
    Ok(())
}

/// Refuses options that do not fit the test (`bw`: a bandwidth test) or each other, and
/// counts of zero.
fn check_options(verb: Verb, a: &RunArgs, bw: bool) -> Result<(), ParamError> {
    if !bw {
        if a.qps != 1 {
            bail("latency tests use one QP: drop -q")?;
        }
        if a.bidirectional {
            bail("-b (bidirectional) is for bandwidth tests only")?;
        }
        if a.post_list != 1 {
            bail("-l (post list) is for bandwidth tests only")?;
        }
    }
    if a.data_validation && verb == Verb::Atomic && (a.duration.is_some() || a.run_infinitely) {
        bail(
            "--data-validation of atomics checks the target's final value against the \
             number of operations, which a timed run does not fix: use -n",
        )?;
    }
    if a.run_infinitely && !bw {
        bail("--run-infinitely is for bandwidth tests: use -D with latency tests")?;
    }
    if a.rate_limit.is_some() && !bw {
        bail("--rate-limit paces bandwidth tests; a latency test sends one message at a time")?;
    }
    if a.tclass.is_some() && a.rdma_cm {
        bail(
            "--tclass sets the GRH of the QPs stride connects itself; with -R rdma_cm \
             builds the path: use --tos (perftest's way with -R)",
        )?;
    }
    if a.use_srq {
        if verb != Verb::Send || !bw {
            bail(
                "--use-srq shares the receive queue of SEND bandwidth tests: the other \
                 tests post no receives to share",
            )?;
        }
        if a.data_validation && a.qps > 1 {
            bail(
                "--data-validation compares each QP's buffer with that QP's pattern, and \
                 with --use-srq a message may land in any QP's receive: use -q 1, or drop \
                 one",
            )?;
        }
    }
    if a.mr_per_qp && !bw {
        bail(
            "--mr-per-qp gives each of -q's QPs its own memory region, and a latency test \
             runs one QP: use it with a bandwidth test",
        )?;
    }
    if a.perform_warm_up {
        if !bw || verb == Verb::Send {
            bail(
                "--perform-warm-up warms up one-sided bandwidth tests (write, read, atomic \
                 bw): a SEND's receiver counts every message, and a latency test's first \
                 samples are its own",
            )?;
        }
        if verb == Verb::Atomic && a.data_validation {
            bail(
                "--perform-warm-up's atomics would change the target whose final value \
                 --data-validation checks: drop one",
            )?;
        }
    }
    if a.cpu_util && !bw {
        bail("--cpu-util measures bandwidth tests (perftest's --cpu_util does too)")?;
    }
    if a.burst_size == Some(0) {
        bail("--burst-size must be at least 1")?;
    }
    if let Some(burst) = a.burst_size {
        if burst < a.post_list {
            bail(format!(
                "--burst-size {burst} is smaller than the post list (-l {}): a burst holds \
                 at least one post list",
                a.post_list
            ))?;
        }
    }
    for (flag, value) in [
        ("-q", a.qps),
        ("-l", a.post_list),
        ("-r", a.rx_depth),
        ("-o", a.outstanding.unwrap_or(1)),
    ] {
        if value == 0 {
            bail(format!("{flag} must be at least 1"))?;
        }
    }
    Ok(())
}

/// The message sizes: `-s`, every power of two with `-a`, or the test's default; checked.
fn resolve_sizes(verb: Verb, a: &RunArgs, bw: bool) -> Result<Vec<u64>, ParamError> {
    let sizes = if a.all_sizes {
        if verb == Verb::Atomic {
            vec![8]
        } else {
            (1..=23).map(|p| 1u64 << p).collect()
        }
    } else {
        vec![a.size.unwrap_or(match (verb, bw) {
            (Verb::Atomic, _) => 8,
            (_, true) => 65536,
            (_, false) => 2,
        })]
    };
    if verb == Verb::Atomic && sizes != [8] {
        bail("atomic operations move 8 bytes: use -s 8 (the default)")?;
    }
    if sizes.contains(&0) {
        bail("-s must be at least 1 byte")?;
    }
    if sizes.iter().any(|&s| s > u64::from(u32::MAX)) {
        bail("-s must fit in 32 bits (at most 4294967295 bytes)")?;
    }
    Ok(sizes)
}

/// A run's counts: iterations, send and receive queue depths, and CQ moderation.
struct Counts {
    iterations: u64,
    tx_depth: u32,
    rx_depth: u32,
    cq_mod: u32,
}

/// The iterations (`-n`), queue depths (`-t`, `-r`) and CQ moderation (`-Q`), with
/// perftest's defaults and limits, for a run of `sizes`; checked.
fn resolve_counts(verb: Verb, a: &RunArgs, bw: bool, sizes: &[u64]) -> Result<Counts, ParamError> {
    use Connection::*;
    let iterations = a.iterations.unwrap_or(match (verb, bw) {
        (Verb::Write, true) => 5000,
        _ => 1000,
    });
    if iterations == 0 {
        bail("-n must be at least 1")?;
    }
    if a.duration.is_none() && !a.run_infinitely {
        check_stamp_memory(iterations, a.qps, bw, a.bidirectional)?;
    }
    if !bw && a.duration.is_none() && iterations < 3 {
        bail("latency statistics need at least 3 iterations (-n 3)")?;
    }
    if a.duration == Some(0) {
        bail("-D must be at least 1 second")?;
    }
    let tx_depth = a.tx_depth.unwrap_or(if bw { 128 } else { 1 });
    if tx_depth == 0 {
        bail("-t must be at least 1")?;
    }
    if a.post_list > tx_depth {
        bail(format!(
            "-l {} needs -t of at least {}",
            a.post_list, a.post_list
        ))?;
    }
    // As perftest: a run of a fixed number of iterations never keeps more in flight
    // than it has messages, nor (SEND) posts more receives than it will use; UD and UC
    // SENDs, which lose what finds no receive, get one receive per message by default.
    let iters_u32 = u32::try_from(iterations).unwrap_or(u32::MAX);
    let (tx_depth, rx_depth) = if a.duration.is_none() && !a.run_infinitely {
        let rx_depth = match a.connection {
            Ud | Uc if a.rx_depth == DEFAULT_RX_DEPTH => iters_u32.min(UD_UC_MAX_RX_DEPTH),
            _ => a.rx_depth.min(iters_u32),
        };
        // A post list still fits (its last batch may be shorter).
        (tx_depth.min(iters_u32).max(a.post_list), rx_depth)
    } else {
        (tx_depth, a.rx_depth)
    };
    // As perftest: one signaled completion per 100 messages, but every message signaled
    // above 8 KiB (where moderation buys nothing and a lost completion would skew the
    // time), except for UD, for -a sweeps (one setting for every size) and with -e; with
    // a post list, one per list.
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let default_cq_mod = if a.post_list > 1 {
        a.post_list
    } else if largest > 8192 && a.connection != Ud && !a.all_sizes && !a.events {
        1
    } else {
        100
    };
    let cq_mod = a.cq_mod.unwrap_or(default_cq_mod).min(tx_depth);
    if cq_mod == 0 {
        bail("-Q must be at least 1")?;
    }
    Ok(Counts {
        iterations,
        tx_depth,
        rx_depth,
        cq_mod,
    })
}

impl TestParams {
    /// How the QPs share registered memory (`--mr-per-qp`).
    pub fn mr_layout(&self) -> crate::buffer::MrLayout {
        crate::buffer::MrLayout::from_flag(self.mr_per_qp)
    }

    /// Resolves the command line for `verb`, or says which options do not fit together.
    pub fn resolve(verb: Verb, a: &RunArgs) -> Result<Self, ParamError> {
        check_connection(verb, a)?;
        let bw = a.test == Test::Bw;
        check_memory(verb, a, bw)?;
        check_options(verb, a, bw)?;
        let sizes = resolve_sizes(verb, a, bw)?;
        let Counts {
            iterations,
            tx_depth,
            rx_depth,
            cq_mod,
        } = resolve_counts(verb, a, bw, &sizes)?;
        if let Some(mtu) = a.mtu {
            if ![256, 512, 1024, 2048, 4096].contains(&mtu) {
                bail(format!(
                    "-m {mtu} is not a path MTU: use 256, 512, 1024, 2048 or 4096"
                ))?;
            }
        }
        Ok(TestParams {
            verb,
            test: a.test,
            connection: a.connection,
            sizes,
            iterations,
            duration: a.duration,
            tx_depth,
            rx_depth,
            cq_mod,
            post_list: a.post_list,
            qps: a.qps,
            mtu: a.mtu,
            inline_size: a.inline_size.unwrap_or(0),
            bidirectional: a.bidirectional,
            atomic_type: a.atomic_type,
            // As perftest: -o counts for READ and atomics only, and defaults to the device's
            // most (filled in by fit_device once the device is open).
            outstanding: match verb {
                Verb::Read | Verb::Atomic => a.outstanding.unwrap_or(0),
                Verb::Send | Verb::Write => 1,
            },
            events: a.events,
            rdma_cm: a.rdma_cm,
            qp_timeout: a.qp_timeout,
            data_validation: a.data_validation,
            run_infinitely: a.run_infinitely,
            report_interval: a.report_interval,
            traffic_class: a.tclass,
            cpu_util: a.cpu_util,
            tos: a.tos,
            warm_up: a.perform_warm_up,
            use_srq: a.use_srq,
            mr_per_qp: a.mr_per_qp,
            rate_limit: a.rate_limit.map(|rate| RateLimit {
                rate,
                unit: a.rate_units,
                burst: a.burst_size.unwrap_or(a.post_list),
            }),
        })
    }

    /// Fills in what depends on the device: `-o` defaults to the most outstanding READs
    /// and atomics a QP of the device may have (`max_qp_rd_atom`), and a larger `-o` is
    /// lowered to it, as perftest does. Returns a warning when it lowered one.
    ///
    /// Without `-I` (`inline_given` false), a latency test on a device whose vendor perftest
    /// recognises as able to inline (`vendor_id`: Mellanox/NVIDIA, 0x02c9) inlines as
    /// perftest does there: WRITE up to 220 bytes, SEND up to 236 (188 on UD); everything
    /// else, and every other device, none.
    pub fn fit_device(
        &mut self,
        device: &str,
        max_qp_rd_atom: u32,
        vendor_id: u32,
        inline_given: bool,
    ) -> Option<String> {
        if self.connection == Connection::Dc {
            // DC initiators post from registered memory only (the parameter check refused -I).
            self.inline_size = 0;
        } else if !inline_given && self.test == Test::Lat && vendor_id == MELLANOX_VENDOR_ID {
            self.inline_size = match (self.verb, self.connection) {
                (Verb::Write, _) => 220,
                (Verb::Send, Connection::Ud) => 188,
                (Verb::Send, _) => 236,
                (Verb::Read | Verb::Atomic, _) => 0,
            };
        }
        let max = max_qp_rd_atom.max(1);
        if self.outstanding == 0 {
            self.outstanding = max;
            None
        } else if self.outstanding > max {
            let asked = std::mem::replace(&mut self.outstanding, max);
            Some(format!(
                "stride-perf: -o {asked} is more outstanding READs/atomics than {device} allows \
                 per QP (max_qp_rd_atom {max}): using {max}"
            ))
        } else {
            None
        }
    }

    /// The settings on which the two sides must agree, each with its name, as text, for
    /// [`TestParams::mismatches`].
    fn agreed(&self) -> Vec<(&'static str, String)> {
        vec![
            ("verb", self.verb.as_str().to_owned()),
            ("test", self.test.as_str().to_owned()),
            (
                "connection type (-c)",
                format!("{:?}", self.connection).to_uppercase(),
            ),
            ("message size (-s/-a)", format!("{:?}", self.sizes)),
            ("iterations (-n)", self.iterations.to_string()),
            ("duration (-D)", format!("{:?}", self.duration)),
            ("number of QPs (-q)", self.qps.to_string()),
            (
                "path MTU (-m)",
                self.mtu
                    .map_or_else(|| "not given".to_owned(), |m| m.to_string()),
            ),
            ("post list (-l)", self.post_list.to_string()),
            ("bidirectional (-b)", self.bidirectional.to_string()),
            ("atomic type (-A)", format!("{:?}", self.atomic_type)),
            ("rdmacm setup (-R)", self.rdma_cm.to_string()),
            ("completion events (-e)", self.events.to_string()),
            ("data validation", self.data_validation.to_string()),
            ("run infinitely", self.run_infinitely.to_string()),
        ]
    }

    /// Where this side's parameters and the peer's differ, as lines such as
    /// `message size (-s/-a): here [65536], peer [4096]`. Empty when they agree.
    pub fn mismatches(&self, peer: &TestParams) -> Vec<String> {
        self.agreed()
            .into_iter()
            .zip(peer.agreed())
            .filter(|((_, a), (_, b))| a != b)
            .map(|((name, a), (_, b))| format!("{name}: here {a}, peer {b}"))
            .collect()
    }

    /// True when peak bandwidth is reported: perftest leaves it out above 20,000
    /// iterations and in duration mode.
    pub fn reports_peak(&self) -> bool {
        !self.timed() && self.iterations <= 20_000
    }

    /// True for a run timed by the clock rather than counted in messages: `-D` or
    /// `--run-infinitely`. Such a bandwidth run reports intervals, and its peak is the best
    /// interval's.
    pub fn timed(&self) -> bool {
        self.duration.is_some() || self.run_infinitely
    }
}

/// What one side decides alone, from its own command line: where the peer is, which device,
/// port, GID, memory and cores this side uses, how it posts and polls, and how it reports.
/// Unlike [`TestParams`] it is never sent to the peer, and the two sides need not agree on
/// it. The engine reads these, not the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct SideParams {
    /// The server's address: this side is the client when it is set.
    pub server: Option<String>,
    /// The out-of-band TCP port (`-p`), also rdma_cm's with `-R`.
    pub port: u16,
    /// The RDMA device (`-d`); the first one when `None`.
    pub device: Option<String>,
    /// The device's port (`-i`).
    pub ib_port: u8,
    /// The GID index (`-x`); chosen here when `None`.
    pub gid_index: Option<u8>,
    /// The memory the test buffers live in (`--use-hugepages`, `--use-cuda`, ...).
    pub buffer: BufferKind,
    /// The cores to pin to (`--pin-cores`), a CPU list.
    pub pin_cores: Option<String>,
    /// The NUMA node whose cores to pin to (`--numa-node`), without `--pin-cores`.
    pub numa_node: Option<u32>,
    /// Whether `-I` was given (else a latency test on some devices inlines by default).
    pub inline_given: bool,
    /// `--use-old-post-send`: post with `ibv_post_send`.
    pub use_old_post_send: bool,
    /// `--use-wr-api`: post with `ibv_wr_*`.
    pub use_wr_api: bool,
    /// `--extended-poll`: poll extended CQs.
    pub extended_poll: bool,
    /// `--report-gbits`: bandwidth in Gb/s.
    pub report_gbits: bool,
    /// `--report-both`: print the peer's table too.
    pub report_both: bool,
    /// `--json`: the file the report is written to.
    pub json: Option<PathBuf>,
}

impl SideParams {
    /// This side's choices, read from its command line.
    pub fn from_args(a: &RunArgs) -> Self {
        SideParams {
            server: a.server.clone(),
            port: a.port,
            device: a.device.clone(),
            ib_port: a.ib_port,
            gid_index: a.gid_index,
            buffer: BufferKind::from_args(a),
            pin_cores: a.pin_cores.clone(),
            numa_node: a.numa_node,
            inline_given: a.inline_size.is_some(),
            use_old_post_send: a.use_old_post_send,
            use_wr_api: a.use_wr_api,
            extended_poll: a.extended_poll,
            report_gbits: a.report_gbits,
            report_both: a.report_both,
            json: a.json.clone(),
        }
    }

    /// True on the client side (the one given the server's address).
    pub fn is_client(&self) -> bool {
        self.server.is_some()
    }
}

/// The parameters of a command line (without the program name), for unit tests.
#[cfg(test)]
pub(crate) fn from_args(args: &[&str]) -> Result<TestParams, ParamError> {
    use clap::Parser;
    let mut argv = vec!["stride-perf"];
    argv.extend_from_slice(args);
    let cli = crate::cli::Cli::try_parse_from(argv).expect("a valid command line");
    let (verb, a) = cli.command.run_args().expect("a run command");
    TestParams::resolve(verb, a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(args: &[&str]) -> Result<TestParams, ParamError> {
        from_args(args)
    }

    #[test]
    fn perftest_defaults() {
        let p = params(&["write", "bw"]).unwrap();
        assert_eq!(
            (p.sizes.as_slice(), p.iterations, p.tx_depth),
            (&[65536][..], 5000, 128)
        );
        assert_eq!(p.cq_mod, 1, "CQ moderation is 1 above 8 KiB");
        let p = params(&["send", "bw", "-s", "64"]).unwrap();
        assert_eq!((p.iterations, p.cq_mod, p.rx_depth), (1000, 100, 512));
        let p = params(&["write", "lat"]).unwrap();
        assert_eq!((p.sizes.as_slice(), p.tx_depth, p.cq_mod), (&[2][..], 1, 1));
        let p = params(&["atomic", "bw"]).unwrap();
        assert_eq!(p.sizes, [8]);
        let p = params(&["read", "bw", "-a"]).unwrap();
        assert_eq!(p.sizes.first(), Some(&2));
        assert_eq!(p.sizes.last(), Some(&MAX_SWEEP_SIZE));
        assert_eq!(p.sizes.len(), 23);
    }

    #[test]
    fn depths_and_moderation_follow_perftest() {
        // Depths never exceed the number of messages.
        let p = params(&["send", "bw", "-s", "64", "-n", "200"]).unwrap();
        assert_eq!((p.tx_depth, p.rx_depth, p.cq_mod), (128, 200, 100));
        let p = params(&["send", "bw", "-s", "64", "-n", "50"]).unwrap();
        assert_eq!((p.tx_depth, p.rx_depth, p.cq_mod), (50, 50, 50));
        // ... but a post list still fits.
        let p = params(&["write", "bw", "-n", "10", "-l", "16"]).unwrap();
        assert_eq!((p.tx_depth, p.cq_mod), (16, 16));
        // Duration runs keep the depths asked for.
        let p = params(&["send", "bw", "-s", "64", "-D", "2", "-r", "600"]).unwrap();
        assert_eq!((p.tx_depth, p.rx_depth), (128, 600));
        // UD and UC: one receive per message by default, up to 16000.
        let p = params(&["send", "bw", "-c", "UD", "-s", "64", "-n", "5000"]).unwrap();
        assert_eq!(p.rx_depth, 5000);
        let p = params(&["send", "bw", "-c", "UC", "-s", "64", "-n", "90000"]).unwrap();
        assert_eq!(p.rx_depth, 16_000);
        let p = params(&["send", "bw", "-c", "UD", "-s", "64", "-r", "64"]).unwrap();
        assert_eq!(p.rx_depth, 64);
        // Moderation: off above 8 KiB, except for -a sweeps, -e and UD.
        assert_eq!(params(&["write", "bw", "-s", "8192"]).unwrap().cq_mod, 100);
        assert_eq!(params(&["write", "bw", "-s", "8193"]).unwrap().cq_mod, 1);
        assert_eq!(params(&["write", "bw", "-a"]).unwrap().cq_mod, 100);
        assert_eq!(params(&["write", "bw", "-e"]).unwrap().cq_mod, 100);
        assert_eq!(params(&["write", "bw", "-Q", "10"]).unwrap().cq_mod, 10);
        // A post list sets it unless -Q does.
        assert_eq!(params(&["write", "bw", "-l", "8"]).unwrap().cq_mod, 8);
        assert_eq!(
            params(&["write", "bw", "-l", "8", "-Q", "4"])
                .unwrap()
                .cq_mod,
            4
        );
    }

    #[test]
    fn impossible_combinations_are_refused() {
        for (args, want) in [
            (
                &["read", "bw", "-c", "UD"][..],
                "READ needs a reliable connection",
            ),
            (&["write", "bw", "-c", "UD"][..], "not possible on UD"),
            (
                &["atomic", "bw", "-c", "UC"][..],
                "need a reliable connection",
            ),
            (&["atomic", "bw", "-s", "16"][..], "use -s 8"),
            (&["write", "lat", "-q", "2"][..], "one QP"),
            (&["send", "lat", "-b"][..], "bandwidth tests only"),
            (
                &["write", "bw", "-l", "200"][..],
                "needs -t of at least 200",
            ),
            (&["write", "bw", "-m", "1500"][..], "not a path MTU"),
            (&["write", "bw", "-s", "0"][..], "at least 1 byte"),
            (&["write", "bw", "-c", "DC", "-R"][..], "drop -R with -c DC"),
            (
                &["send", "lat", "-c", "DC", "-I", "64"][..],
                "drop -I with -c DC",
            ),
            (
                &["read", "bw", "-c", "DC", "--use-old-post-send"][..],
                "drop it with -c DC",
            ),
            (&["write", "lat", "-n", "2"][..], "at least 3 iterations"),
            (
                &["write", "lat", "--use-cuda", "0"][..],
                "write lat polls the last byte of the receive buffer in host memory, which a \
                 GPU buffer is not; use send lat or read lat with --use-cuda, or drop --use-cuda",
            ),
            (
                &["write", "lat", "--use-cuda-dmabuf", "1"][..],
                "use send lat or read lat with --use-cuda-dmabuf",
            ),
            (
                &["send", "bw", "--use-cuda", "0", "-I", "64"][..],
                "drop -I with --use-cuda",
            ),
        ] {
            let err = params(args).unwrap_err().to_string();
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }

    #[test]
    fn a_zero_count_names_its_own_flag() {
        for flag in ["-q", "-l", "-r", "-o"] {
            let err = params(&["read", "bw", flag, "0"]).unwrap_err().to_string();
            assert_eq!(err, format!("{flag} must be at least 1"));
        }
    }

    #[test]
    fn an_iteration_count_whose_timestamps_cannot_fit_is_refused() {
        // Once a 'capacity overflow' panic and an 8 GB allocation that aborted.
        for args in [
            &["write", "lat", "-n", "9223372036854775808"][..],
            &["write", "lat", "-n", "1000000000"][..],
            &["write", "bw", "-n", "18446744073709551615"][..],
            &["send", "bw", "-n", "100000000", "-q", "4"][..],
        ] {
            let err = params(args).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("-n {} ", args[3])),
                "{args:?}: {err}"
            );
            assert!(
                err.contains("at most -n") && err.contains("-D"),
                "{args:?}: {err}"
            );
        }
        // The bound is exact, and counts QPs and both directions.
        let lat_most = MAX_STAMP_BYTES / LAT_STAMP_BYTES;
        assert_eq!(lat_most, 1 << 28);
        assert!(params(&["send", "lat", "-n", &lat_most.to_string()]).is_ok());
        let err = params(&["send", "lat", "-n", &(lat_most + 1).to_string()]).unwrap_err();
        assert!(err.0.contains(&format!("at most -n {lat_most} ")), "{err}");
        let bw_most = MAX_STAMP_BYTES / (BW_STAMP_BYTES * 2 * 2);
        let n = bw_most.to_string();
        assert!(params(&["write", "bw", "-q", "2", "-b", "-n", &n]).is_ok());
        let n = (bw_most + 1).to_string();
        let err = params(&["write", "bw", "-q", "2", "-b", "-n", &n]).unwrap_err();
        assert!(err.0.contains(&format!("at most -n {bw_most} ")), "{err}");
        // Timed runs keep bounded timestamps for bandwidth and are not counted in -n.
        assert!(params(&["write", "bw", "-D", "5"]).is_ok());
    }

    #[test]
    fn gpu_buffers_fit_the_other_tests() {
        for args in [
            &["send", "lat", "--use-cuda", "0"][..],
            &["read", "lat", "--use-cuda-dmabuf", "0"][..],
            &["write", "bw", "--use-cuda", "0", "-I", "0"][..],
            &["atomic", "bw", "--use-cuda", "0"][..],
            &["write", "lat", "--use-hugepages"][..],
        ] {
            assert!(params(args).is_ok(), "{args:?}");
        }
        // Staged, the NIC works in host memory: write lat and -I work too.
        for args in [
            &["write", "lat", "--use-cuda", "0", "--staging"][..],
            &["send", "bw", "--use-cuda", "0", "--staging", "-I", "64"][..],
            &["read", "bw", "--use-cuda", "1", "--staging", "-q", "2"][..],
        ] {
            assert!(params(args).is_ok(), "{args:?}");
        }
        for (args, want) in [
            (
                &["write", "bw", "--staging"][..],
                "this run has no GPU buffer: add --use-cuda GPU, or drop --staging",
            ),
            (
                &["write", "bw", "--staging", "--use-hugepages"][..],
                "add --use-cuda GPU",
            ),
            (
                &["write", "bw", "--use-cuda-dmabuf", "0", "--staging"][..],
                "use --use-cuda GPU --staging",
            ),
        ] {
            let e = params(args).unwrap_err().to_string();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        // Each side may use its own memory: the buffer kind is not agreed.
        let gpu = params(&["send", "bw", "--use-cuda", "0"]).unwrap();
        let host = params(&["send", "bw"]).unwrap();
        assert!(gpu.mismatches(&host).is_empty());
    }

    #[test]
    fn mismatches_name_the_setting() {
        let a = params(&["write", "bw", "-s", "65536"]).unwrap();
        let b = params(&["write", "bw", "-s", "4096"]).unwrap();
        assert_eq!(
            a.mismatches(&b),
            ["message size (-s/-a): here [65536], peer [4096]"]
        );
        assert!(a.mismatches(&a).is_empty());
        let c = params(&["send", "bw", "-s", "65536", "-q", "2"]).unwrap();
        let m = a.mismatches(&c);
        assert!(
            m.iter()
                .any(|l| l.starts_with("verb: here write, peer send")),
            "{m:?}"
        );
        assert!(
            m.iter().any(|l| l.starts_with("number of QPs (-q)")),
            "{m:?}"
        );
    }

    #[test]
    fn a_different_path_mtu_is_named_with_both_values() {
        let a = params(&["send", "bw", "-m", "1024"]).unwrap();
        let b = params(&["send", "bw", "-m", "512"]).unwrap();
        assert_eq!(a.mismatches(&b), ["path MTU (-m): here 1024, peer 512"]);
        let c = params(&["send", "bw"]).unwrap();
        assert_eq!(
            a.mismatches(&c),
            ["path MTU (-m): here 1024, peer not given"]
        );
    }

    #[test]
    fn outstanding_reads_default_to_the_device_most() {
        // Not given: 0 until the device is known, then its max_qp_rd_atom.
        let mut p = params(&["read", "bw"]).unwrap();
        assert_eq!(p.outstanding, 0);
        assert_eq!(p.fit_device("rxe0", 128, 0, false), None);
        assert_eq!(p.outstanding, 128);
        // Given: kept when it fits, lowered (with a warning) when it does not.
        let mut p = params(&["atomic", "bw", "-o", "16"]).unwrap();
        assert_eq!(
            (p.fit_device("rxe0", 128, 0, false), p.outstanding),
            (None, 16)
        );
        let mut p = params(&["read", "lat", "-o", "300"]).unwrap();
        let w = p.fit_device("rxe0", 128, 0, false).unwrap();
        assert!(w.contains("-o 300") && w.contains("using 128"), "{w}");
        assert_eq!(p.outstanding, 128);
        // SEND and WRITE have none to speak of, as in perftest.
        let mut p = params(&["write", "bw", "-o", "8"]).unwrap();
        assert_eq!(
            (p.fit_device("rxe0", 128, 0, false), p.outstanding),
            (None, 1)
        );
        assert!(params(&["read", "bw", "-o", "0"]).is_err());
    }

    #[test]
    fn latency_inlines_as_perftest_on_devices_it_knows() {
        let fit = |args: &[&str], vendor: u32| {
            let mut p = params(args).unwrap();
            let given = args.contains(&"-I");
            p.fit_device("dev", 16, vendor, given);
            p.inline_size
        };
        assert_eq!(fit(&["write", "lat"], MELLANOX_VENDOR_ID), 220);
        assert_eq!(fit(&["send", "lat"], MELLANOX_VENDOR_ID), 236);
        assert_eq!(fit(&["send", "lat", "-c", "UD"], MELLANOX_VENDOR_ID), 188);
        assert_eq!(fit(&["read", "lat"], MELLANOX_VENDOR_ID), 0);
        assert_eq!(fit(&["write", "bw"], MELLANOX_VENDOR_ID), 0);
        assert_eq!(fit(&["write", "lat", "-I", "64"], MELLANOX_VENDOR_ID), 64);
        // rxe and other devices perftest does not recognise: none.
        assert_eq!(fit(&["write", "lat"], 0), 0);
        // DC posts from registered memory: never inline, on mlx5 too.
        assert_eq!(fit(&["write", "lat", "-c", "DC"], MELLANOX_VENDOR_ID), 0);
    }

    #[test]
    fn dc_takes_every_verb_and_test_as_perftest() {
        for verb in ["send", "write", "read", "atomic"] {
            for test in ["bw", "lat"] {
                let p = params(&[verb, test, "-c", "DC"]).unwrap();
                assert_eq!(p.connection, Connection::Dc, "{verb} {test}");
            }
        }
        let p = params(&["write", "bw", "-c", "DC", "-q", "4", "-b"]).unwrap();
        assert!(!p
            .mismatches(&params(&["write", "bw", "-q", "4", "-b"]).unwrap())
            .is_empty());
    }

    #[test]
    fn peak_rule() {
        assert!(params(&["write", "bw"]).unwrap().reports_peak());
        assert!(!params(&["write", "bw", "-n", "20001"])
            .unwrap()
            .reports_peak());
        assert!(!params(&["write", "bw", "-D", "2"]).unwrap().reports_peak());
        assert!(!params(&["write", "bw", "--run-infinitely"])
            .unwrap()
            .reports_peak());
    }

    #[test]
    fn perftest_side_options() {
        let p = params(&["send", "bw", "-q", "4", "--use-srq"]).unwrap();
        assert!(
            p.use_srq
                && p.mismatches(&params(&["send", "bw", "-q", "4"]).unwrap())
                    .is_empty()
        );
        assert!(params(&["send", "bw", "--use_srq", "--data-validation"]).is_ok());
        // --mr-per-qp is each side's own choice; the default shares one region.
        let p = params(&["write", "bw", "-q", "4", "--mr-per-qp"]).unwrap();
        assert_eq!(p.mr_layout(), crate::buffer::MrLayout::PerQp);
        assert!(p
            .mismatches(&params(&["write", "bw", "-q", "4"]).unwrap())
            .is_empty());
        assert_eq!(
            params(&["write", "bw", "-q", "4"]).unwrap().mr_layout(),
            crate::buffer::MrLayout::Shared
        );
        assert!(params(&["send", "bw", "--mr_per_qp", "--data-validation"]).is_ok());
        for (args, want) in [
            (
                &["write", "lat", "--mr-per-qp"][..],
                "a latency test runs one QP",
            ),
            (&["write", "bw", "--use-srq"][..], "SEND bandwidth tests"),
            (&["send", "lat", "--use-srq"], "SEND bandwidth tests"),
            (
                &["send", "bw", "-q", "2", "--use-srq", "--data-validation"],
                "use -q 1",
            ),
        ] {
            let e = params(args).unwrap_err().to_string();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        assert!(
            params(&["read", "bw", "--perform-warm-up"])
                .unwrap()
                .warm_up
        );
        for args in [
            &["send", "bw", "--perform-warm-up"][..],
            &["write", "lat", "--perform-warm-up"],
            &["atomic", "bw", "--perform_warm_up", "--data-validation"],
        ] {
            assert!(params(args).is_err(), "{args:?}");
        }
        let p = params(&["write", "bw", "--tclass", "96", "--cpu-util"]).unwrap();
        assert_eq!((p.traffic_class, p.cpu_util), (Some(96), true));
        // Each side's own: not agreed.
        assert!(p.mismatches(&params(&["write", "bw"]).unwrap()).is_empty());
        for (args, want) in [
            (
                &["write", "bw", "--tclass", "96", "-R"][..],
                "with -R rdma_cm builds the path",
            ),
            (
                &["send", "lat", "--cpu-util"][..],
                "measures bandwidth tests",
            ),
        ] {
            let e = params(args).unwrap_err().to_string();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        assert_eq!(
            params(&["write", "bw", "-R", "--tos", "32"]).unwrap().tos,
            Some(32)
        );
        use clap::Parser;
        for bad in [
            &["--tclass", "256"][..],
            &["--pin-cores", "0", "--numa-node", "0"],
            &["--tos", "8"],
            &["-R", "--tos", "256"],
        ] {
            let mut argv = vec!["stride-perf", "write", "bw"];
            argv.extend_from_slice(bad);
            assert!(crate::cli::Cli::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn timed_runs_and_rate_limits() {
        let p = params(&["send", "bw", "--run-infinitely", "-r", "600"]).unwrap();
        assert!(p.timed() && p.duration.is_none());
        assert_eq!((p.tx_depth, p.rx_depth), (128, 600), "no clamp to -n");
        assert!(params(&["write", "bw", "-D", "2"]).unwrap().timed());
        assert!(!params(&["write", "bw"]).unwrap().timed());
        // The client's --run-infinitely must be the server's too.
        let a = params(&["write", "bw", "--run-infinitely"]).unwrap();
        let b = params(&["write", "bw"]).unwrap();
        assert_eq!(a.mismatches(&b), ["run infinitely: here true, peer false"]);
        // The interval and the pace are each side's own.
        let c = params(&["write", "bw", "--report-interval", "2", "--rate-limit", "1"]).unwrap();
        assert!(b.mismatches(&c).is_empty());
        let r = c.rate_limit.unwrap();
        assert_eq!((r.rate, r.unit, r.burst), (1.0, RateUnit::G, 1));
        // 1 Gb/s of 64 KiB messages: 125e6 / 65536 per second.
        assert!((r.messages_per_sec(65536) - 125e6 / 65536.0).abs() < 1e-9);
        assert_eq!(r.describe(), "1 Gb/s in bursts of 1 message");
        let m = params(&[
            "write",
            "bw",
            "--rate-limit",
            "10",
            "--rate-units",
            "M",
            "-l",
            "4",
        ])
        .unwrap()
        .rate_limit
        .unwrap();
        assert_eq!(m.burst, 4, "the burst defaults to the post list");
        assert!((m.messages_per_sec(1024) - 10240.0).abs() < 1e-9);
        let p = params(&[
            "send",
            "bw",
            "--rate-limit",
            "500",
            "--rate-units",
            "p",
            "--burst-size",
            "8",
        ])
        .unwrap()
        .rate_limit
        .unwrap();
        assert_eq!(
            (p.messages_per_sec(1), p.messages_per_sec(1 << 20), p.burst),
            (500.0, 500.0, 8)
        );
        for (args, want) in [
            (
                &["write", "lat", "--run-infinitely"][..],
                "for bandwidth tests",
            ),
            (
                &["write", "lat", "--rate-limit", "1"][..],
                "paces bandwidth tests",
            ),
            (
                &["write", "bw", "--rate-limit", "1", "--burst-size", "0"][..],
                "at least 1",
            ),
            (
                &[
                    "write",
                    "bw",
                    "--rate-limit",
                    "1",
                    "-l",
                    "8",
                    "--burst-size",
                    "4",
                ][..],
                "smaller than the post list",
            ),
        ] {
            let e = params(args).unwrap_err().to_string();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
