//! The command line: perftest's flag letters and defaults, English long names, and the
//! rules that say which combinations make sense, checked before anything touches a device.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

/// A perftest-style RDMA benchmark built on sideway.
///
/// Run the server first (no address), then the client with the server's address; both print
/// the results. `stride-perf write bw` measures RDMA WRITE bandwidth, `stride-perf send lat`
/// SEND/RECV latency, and so on.
///
/// Whole clusters: start one rank per host (or several) with the launcher, e.g.
/// `srun -N 8 stride-perf write bw --cluster` or `mpirun -np 8 stride-perf write bw
/// --cluster`; rank 0 prints one report of every pair (see --cluster, --pattern).
#[derive(Debug, Parser)]
#[command(name = "stride-perf", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs to measure, trespass's streams, and the plot tool.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// SEND/RECV.
    Send(RunArgs),
    /// RDMA WRITE.
    Write(RunArgs),
    /// RDMA READ.
    Read(RunArgs),
    /// Atomic fetch-and-add or compare-and-swap.
    Atomic(RunArgs),
    /// Plot results: bandwidth or latency against message size, one line per JSON file.
    Plot(PlotArgs),
    /// trespass byte streams and messages over RDMA (rdma_cm), measured like the verbs:
    /// `stream lat` a ping-pong (one round trip / 2, as ib_send_lat), `stream bw` one-way
    /// streaming.
    Stream(StreamArgs),
}

impl Command {
    /// The verb and its arguments, or `None` for `plot` and `stream`.
    pub fn run_args(&self) -> Option<(Verb, &RunArgs)> {
        match self {
            Command::Send(a) => Some((Verb::Send, a)),
            Command::Write(a) => Some((Verb::Write, a)),
            Command::Read(a) => Some((Verb::Read, a)),
            Command::Atomic(a) => Some((Verb::Atomic, a)),
            Command::Plot(_) | Command::Stream(_) => None,
        }
    }
}

/// The verb under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// SEND/RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// Atomics.
    Atomic,
}

impl Verb {
    /// The verb as typed on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Send => "send",
            Verb::Write => "write",
            Verb::Read => "read",
            Verb::Atomic => "atomic",
        }
    }
}

/// Bandwidth or latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Test {
    /// Bandwidth and message rate.
    Bw,
    /// Latency.
    Lat,
}

impl Test {
    /// The test as typed on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Test::Bw => "bw",
            Test::Lat => "lat",
        }
    }
}

/// The transport of the queue pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[value(rename_all = "UPPER")]
#[serde(rename_all = "UPPERCASE")]
pub enum Connection {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// Dynamically Connected (mlx5 only): a DC initiator (DCI) per QP on the side that posts,
    /// a DC target (DCT, receiving through a shared receive queue) per QP on the side its
    /// operations reach; every request names its target's DCT number and access key, which
    /// the sides trade in their exchange. Any other device is refused before a QP is made.
    /// Not yet run on mlx5 hardware by this project (tested against a test double of
    /// libmlx5 only).
    Dc,
}

/// The atomic operation of `atomic` tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[value(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AtomicType {
    /// Fetch-and-add.
    FetchAndAdd,
    /// Compare-and-swap.
    CmpAndSwap,
}

/// Options of a measurement, with perftest's letters.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Measure bandwidth (bw) or latency (lat).
    pub test: Test,

    /// The server to connect to; without it, this side is the server.
    pub server: Option<String>,

    /// RDMA device (default: the first one).
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,

    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,

    /// GID index (default: the best one, preferring an IPv4-mapped RoCE v2 GID).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u8>,

    /// Message size in bytes (default: bw 65536, lat 2, atomic 8).
    #[arg(short = 's', long)]
    pub size: Option<u64>,

    /// Run every size from 2 B to 8 MiB in powers of two.
    #[arg(short = 'a', long = "all", conflicts_with = "size")]
    pub all_sizes: bool,

    /// Iterations (default 1000; 5000 for write bw).
    #[arg(short = 'n', long = "iters", conflicts_with = "duration")]
    pub iterations: Option<u64>,

    /// Run for this many seconds instead of a number of iterations. Bandwidth tests print
    /// the bandwidth and message rate of every reporting interval (--report-interval) as
    /// they go, the minimum, median and maximum interval after the row, and report the best
    /// interval as the peak (which perftest leaves at 0 under -D).
    #[arg(short = 'D', long = "duration", value_name = "SECONDS", value_parser = parse_duration)]
    pub duration: Option<u64>,

    /// Bandwidth tests: run until the client gets SIGINT (Ctrl-C) or SIGTERM, printing every
    /// reporting interval, then end the run on both sides and print the summary as -D does
    /// (perftest's --run_infinitely, which prints every -D seconds; here --report-interval
    /// sets the period).
    #[arg(
        long = "run-infinitely",
        alias = "run_infinitely",
        conflicts_with_all = ["duration", "iterations", "all_sizes"]
    )]
    pub run_infinitely: bool,

    /// Seconds between two interval reports of a -D or --run-infinitely run (decimals
    /// allowed; 0.01 to 3600).
    #[arg(long = "report-interval", value_name = "SECS", default_value_t = 1.0,
          value_parser = parse_interval)]
    pub report_interval: f64,

    /// Most outstanding work requests per QP (default: bw 128, lat 1; never more than -n).
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,

    /// Receive queue depth for send tests (never more than -n; UD and UC default to one
    /// receive per message, up to 16000).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    pub rx_depth: u32,

    /// Signal one completion every this many work requests (default 100; 1 above 8 KiB,
    /// except with -a, -e or UD; the post list's size with -l).
    #[arg(short = 'Q', long = "cq-mod")]
    pub cq_mod: Option<u32>,

    /// Post this many work requests with one doorbell.
    #[arg(short = 'l', long = "post-list", default_value_t = 1)]
    pub post_list: u32,

    /// Number of queue pairs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,

    /// Transport: RC, UC, UD, or DC (mlx5 devices only; never run on mlx5 hardware here),
    /// where the verb allows it.
    #[arg(short = 'c', long = "connection", value_enum, default_value_t = Connection::Rc)]
    pub connection: Connection,

    /// Path MTU in bytes (default: the smaller active MTU of the two ports).
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,

    /// QP ack timeout exponent: unacknowledged packets are resent after 4.096 µs × 2^N, 7
    /// times, before the operation fails (0: never).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14,
          value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,

    /// Send messages up to this size inline (default, as perftest: none, except latency
    /// tests on Mellanox/NVIDIA devices: 220 B for WRITE, 236 B for SEND, 188 B on UD).
    #[arg(short = 'I', long = "inline-size")]
    pub inline_size: Option<u32>,

    /// Measure both directions at once (bandwidth tests).
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,

    /// Check the data: the sender fills its messages with a pattern of the size and QP, the
    /// side they land on clears its buffer before each size and compares every byte after
    /// it, naming the first bad offset; a difference ends the run on both sides. Every verb
    /// and test, RC, UC and UD, any -q: write lat leaves out each message's last byte (the
    /// ping-pong's counter); atomics (-n runs) check the target's final value and the last
    /// value fetched. The timings include nothing of it.
    #[arg(long = "data-validation", alias = "data_validation")]
    pub data_validation: bool,

    /// Pace the sender to at most this rate, in --rate-units (perftest's --rate_limit with
    /// --rate_limit_type SW): bandwidth tests, every QP together. The limiter keeps a
    /// schedule of bursts (--burst-size messages each) and never drifts from it; a sender
    /// that falls more than a burst (or a millisecond) behind, because the link is slower
    /// than the target, starts the schedule afresh instead of flooding to catch up.
    #[arg(long = "rate-limit", alias = "rate_limit", value_name = "RATE",
          value_parser = parse_rate)]
    pub rate_limit: Option<f64>,

    /// Unit of --rate-limit, as perftest's --rate_units: g (Gb/s, 10^9 bit; the default),
    /// M (MiB/s, 2^20 bytes, stride's default bandwidth unit) or p (messages per second).
    #[arg(long = "rate-units", alias = "rate_units", value_enum, default_value_t = RateUnit::G,
          requires = "rate_limit")]
    pub rate_units: RateUnit,

    /// Messages posted back to back per burst of the rate limiter (perftest's --burst_size;
    /// default: the post list, -l). At least -l.
    #[arg(long = "burst-size", alias = "burst_size", requires = "rate_limit")]
    pub burst_size: Option<u32>,

    /// SEND bandwidth tests: the receives of every QP come from one shared receive queue
    /// (perftest's --use_srq) of -r × -q entries, posted and reposted there.
    #[arg(long = "use-srq", alias = "use_srq")]
    pub use_srq: bool,

    /// Register one memory region per QP (perftest's --mr_per_qp). By default, as in
    /// perftest, one region holds every QP's buffer, each QP using its own slice of it.
    #[arg(long = "mr-per-qp", alias = "mr_per_qp")]
    pub mr_per_qp: bool,

    /// Before each size's measured loop, post one unmeasured round of -t messages per QP
    /// and wait for them (perftest's --perform_warm_up), so that the first measured
    /// messages find the caches, the TLB and the device's context warm. One-sided bandwidth
    /// tests (write, read, atomic): a SEND's receiver counts every message.
    #[arg(long = "perform-warm-up", alias = "perform_warm_up")]
    pub perform_warm_up: bool,

    /// Traffic class in the GRH of this side's packets (perftest's --tclass; 0-255; RoCE,
    /// or InfiniBand with -x). Each side sets its own; the banner reads it back from the QP.
    #[arg(long = "tclass", value_name = "TC")]
    pub tclass: Option<u8>,

    /// Type of service of the rdma_cm connections (perftest's --tos; 0-255; needs -R):
    /// rdma_cm puts it into the path's traffic class, which the banner reads back from QP 0.
    #[arg(long = "tos", value_name = "TOS", requires = "rdma_cm")]
    pub tos: Option<u8>,

    /// Pin the process to these CPU cores before anything runs: a list such as 0,2-3 (as
    /// taskset -c and perftest users do by hand; the measured loop is one thread).
    #[arg(long = "pin-cores", value_name = "LIST", conflicts_with = "numa_node")]
    pub pin_cores: Option<String>,

    /// Pin the process to the cores of this NUMA node (from
    /// /sys/devices/system/node/nodeN/cpulist), such as the one nearest the NIC.
    #[arg(long = "numa-node", value_name = "NODE")]
    pub numa_node: Option<u32>,

    /// Report the CPU utilization of the host during each size's measured loop (perftest's
    /// --cpu_util): the busy share of all CPUs from /proc/stat, in the row's summary and the
    /// JSON file. Bandwidth tests.
    #[arg(long = "cpu-util", alias = "cpu_util")]
    pub cpu_util: bool,

    /// Also print the peer's results, and with -b the two directions' sum (perftest's
    /// --report-both, which reports RX and TX separately on bidirectional tests).
    #[arg(long = "report-both", alias = "report_both")]
    pub report_both: bool,

    /// Atomic operation.
    #[arg(short = 'A', long = "atomic-type", value_enum, default_value_t = AtomicType::FetchAndAdd)]
    pub atomic_type: AtomicType,

    /// Most outstanding RDMA READ and atomic operations per QP (default: the most the
    /// device allows, its max_qp_rd_atom, as perftest; a larger value is lowered to that).
    #[arg(short = 'o', long = "outs")]
    pub outstanding: Option<u32>,

    /// Post with classic ibv_post_send on classic QPs (perftest's --use_old_post_send).
    /// Without it or --use-wr-api, stride does what perftest does on the device: ibv_wr_* on
    /// extended QPs on mlx5-family and EFA devices, ibv_post_send elsewhere (rxe included).
    #[arg(
        long = "use-old-post-send",
        alias = "use_old_post_send",
        conflicts_with = "use_wr_api"
    )]
    pub use_old_post_send: bool,

    /// Post through ibv_wr_* on extended QPs whatever the device (perftest uses them only on
    /// the devices it knows); a device without extended QPs gets classic ones, and the banner
    /// says so.
    #[arg(long = "use-wr-api")]
    pub use_wr_api: bool,

    /// Create extended CQs (ibv_create_cq_ex) and poll them with ibv_start_poll and
    /// ibv_next_poll instead of ibv_poll_cq (perftest always polls with ibv_poll_cq). A
    /// device without extended CQs gets classic ones, and the banner says so.
    #[arg(long = "extended-poll")]
    pub extended_poll: bool,

    /// Sleep on completion events instead of polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,

    /// Set up connections with rdmacm instead of the TCP exchange.
    #[arg(short = 'R', long = "rdma-cm")]
    pub rdma_cm: bool,

    /// TCP port of the out-of-band exchange (or of rdmacm with -R).
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,

    /// Report bandwidth in Gb/s (10^9 bit) instead of MiB/s.
    #[arg(long = "report-gbits")]
    pub report_gbits: bool,

    /// Allocate the buffers in huge pages (reserve some first, as root:
    /// `echo 64 > /proc/sys/vm/nr_hugepages`).
    #[arg(long = "use-hugepages")]
    pub use_hugepages: bool,

    /// Allocate the buffers on this GPU (CUDA index) and register them with plain reg_mr:
    /// GPUDirect RDMA, which needs the nvidia-peermem module and a NIC that supports it.
    #[arg(
        long = "use-cuda",
        value_name = "GPU",
        conflicts_with_all = ["use_cuda_dmabuf", "use_hugepages"]
    )]
    pub use_cuda: Option<u32>,

    /// With --use-cuda: the NIC works in host memory, and the data is copied from the GPU
    /// before each transfer and to the GPU after each (cuMemcpyDtoH, cuMemcpyHtoD), as a
    /// program without GPUDirect RDMA moves it: run it beside plain --use-cuda to see what
    /// GPUDirect buys. perftest has no such option.
    #[arg(long = "staging")]
    pub staging: bool,

    /// Allocate the buffers on this GPU (CUDA index), export them as dma-buf and register
    /// that (needs a 5.12+ kernel and a NIC driver with dma-buf support).
    #[arg(
        long = "use-cuda-dmabuf",
        value_name = "GPU",
        conflicts_with = "use_hugepages"
    )]
    pub use_cuda_dmabuf: Option<u32>,

    /// Also write the results, both sides', as JSON to this file (with --cluster: the whole
    /// run's, written by rank 0).
    #[arg(long = "json")]
    pub json: Option<PathBuf>,

    /// Cluster mode: one rank of a run started by srun or mpirun.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

impl RunArgs {
    /// The option that puts the buffers on a GPU, when one does.
    pub fn gpu_option(&self) -> Option<&'static str> {
        match (self.use_cuda, self.use_cuda_dmabuf) {
            (Some(_), _) => Some("--use-cuda"),
            (None, Some(_)) => Some("--use-cuda-dmabuf"),
            (None, None) => None,
        }
    }
}

/// The unit of `--rate-limit`, with perftest's letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
pub enum RateUnit {
    /// Gb/s (10^9 bit per second).
    #[value(name = "g", alias = "Gbps")]
    G,
    /// MiB/s (2^20 bytes per second).
    #[value(name = "M", alias = "MBps", alias = "MiBps")]
    M,
    /// Messages per second.
    #[value(name = "p", alias = "pps")]
    P,
}

impl RateUnit {
    /// The unit as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            RateUnit::G => "Gb/s",
            RateUnit::M => "MiB/s",
            RateUnit::P => "messages/s",
        }
    }
}

/// The longest `-D`: a year, in seconds.
pub const MAX_DURATION_S: u64 = 365 * 24 * 3600;

/// A duration (`-D`): whole seconds from 1 to [`MAX_DURATION_S`].
fn parse_duration(text: &str) -> Result<u64, String> {
    let rule = format!("-D takes whole seconds, from 1 to {MAX_DURATION_S} (a year)");
    match text.parse::<u64>() {
        Ok(v) if (1..=MAX_DURATION_S).contains(&v) => Ok(v),
        Ok(_) => Err(format!("{text} s is out of range: {rule}")),
        Err(_) => Err(format!("'{text}' is not a whole number of seconds: {rule}")),
    }
}

/// A reporting interval: a number of seconds from 0.01 to 3600.
fn parse_interval(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number of seconds"))?;
    if !(0.01..=3600.0).contains(&v) {
        return Err(format!(
            "{text} s is not a reporting interval: use 0.01 to 3600 seconds"
        ));
    }
    Ok(v)
}

/// A rate: a positive, finite number.
fn parse_rate(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number (the unit goes in --rate-units)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("{text} is not a rate: it must be above 0"));
    }
    Ok(v)
}

/// Options of `plot`.
#[derive(Debug, Clone, Args)]
pub struct PlotArgs {
    /// JSON result files written with --json.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,

    /// The SVG file to write.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,

    /// Plot bandwidth against time from the reporting intervals of -D or --run-infinitely
    /// runs (one line per file and size) instead of against message size.
    #[arg(long = "intervals")]
    pub intervals: bool,
}

// Cluster mode's options (`stride::cluster` runs them). They are here so that the command
// line names no mode that uses them.

/// Which pairs a cluster run measures, and how many at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Every ordered pair in turn, one at a time: the full pair matrix.
    Pairs,
    /// Rank i to rank i+1 (the last to rank 0), all at once.
    Ring,
    /// Every ordered pair, all at once.
    AllToAll,
}

impl Pattern {
    /// The name as typed after `--pattern`.
    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::Pairs => "pairs",
            Pattern::Ring => "ring",
            Pattern::AllToAll => "all-to-all",
        }
    }
}

/// The options of cluster mode.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Run as one rank of a cluster run started by srun or mpirun (no address): the rank
    /// and world size come from SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_RANK/_SIZE or
    /// PMI_RANK/PMI_SIZE; rank 0 prints and writes (--json, --heatmap) the whole run's
    /// report. No perftest equivalent (perftest tests one pair per invocation).
    #[arg(long = "cluster", conflicts_with = "server")]
    pub cluster: bool,

    /// With --cluster, which pairs run: `pairs`, every ordered pair in turn (the pair
    /// matrix); `ring`, rank i to rank i+1, all at once; `all-to-all`, every ordered pair
    /// at once.
    #[arg(long = "pattern", value_enum, default_value_t = Pattern::Pairs)]
    pub pattern: Pattern,

    /// With --cluster, rank 0's address HOST:PORT, where every rank registers (default: the
    /// first host of Slurm's node list, or loopback when every rank runs on this host, at
    /// the -p port).
    #[arg(long = "rendezvous", value_name = "HOST:PORT")]
    pub rendezvous: Option<String>,

    /// With --cluster, how long in seconds a rank may stay silent (it sends a heartbeat
    /// every second) or take to arrive before the run stops on every rank, naming it.
    #[arg(long = "cluster-timeout", value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(2..=86_400))]
    pub cluster_timeout: u64,

    /// With --cluster, write the pair matrix's heatmap (SVG) to this file (rank 0).
    #[arg(long = "heatmap", value_name = "FILE")]
    pub heatmap: Option<PathBuf>,
}

impl ClusterArgs {
    /// The silence and arrival bound.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.cluster_timeout)
    }
}

// `stride-perf stream`'s options (`stride::stream_bench` runs them), here for the same reason.

/// The rdma_cm port of `stride-perf stream` unless `--port` says otherwise.
pub const STREAM_DEFAULT_PORT: u16 = 18600;
/// The largest size of `stride-perf stream`, 4 MiB (the top of `--all`).
pub const STREAM_MAX_SIZE: u64 = 4 << 20;
/// The most connections of one `stride-perf stream` run.
pub const STREAM_MAX_CONNECTIONS: u32 = 64;
/// The longest busy poll `stream --busy-poll-us` takes (one second).
pub const STREAM_MAX_BUSY_POLL_US: u64 = 1_000_000;

/// Options of `stride-perf stream`.
#[derive(Debug, Clone, Args)]
pub struct StreamArgs {
    /// Measure latency (lat: a ping-pong; each sample is one round trip / 2, as ib_send_lat)
    /// or bandwidth (bw: one-way streaming, the server answering one byte at the end).
    pub test: Test,

    /// The server to connect to (an address of its RDMA device: rdma_cm resolves it); without
    /// it, this side is the server, which serves one client run and exits.
    pub server: Option<String>,

    /// Message size in bytes, 1 to 4194304 (default: lat 64, bw 65536): what the client
    /// writes per round trip (lat) or per write (bw). A server given -s serves only clients
    /// with the same size.
    #[arg(short = 's', long, value_parser = clap::value_parser!(u64).range(1..=STREAM_MAX_SIZE))]
    pub size: Option<u64>,

    /// Run every size from 1 B to 4 MiB in powers of two (2^0 to 2^22).
    #[arg(short = 'a', long = "all", conflicts_with = "size")]
    pub all_sizes: bool,

    /// Iterations per size and connection (default 1000): round trips for lat (at least 3:
    /// the statistics drop the two largest samples, as perftest), messages for bw. A server
    /// given -n serves only clients with the same count.
    #[arg(short = 'n', long = "iters", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,

    /// rdma_cm port (in the TCP port space) the server listens on and the client connects to.
    #[arg(short = 'p', long = "port", default_value_t = STREAM_DEFAULT_PORT)]
    pub port: u16,

    /// Server only: the address to listen on (default 0.0.0.0: every RDMA device's
    /// addresses).
    #[arg(long = "bind", value_name = "ADDR")]
    pub bind: Option<IpAddr>,

    /// Move each `size` bytes as one trespass message (send_msg / recv_msg) instead of
    /// stream bytes (write_all / read_exact). The server follows the client unless it was
    /// given --messages itself, in which case the client must use messages too.
    #[arg(long = "messages")]
    pub messages: bool,

    /// Lend each `size` bytes as one trespass message, zero-copy (lend_msg: the receiver's
    /// recv_msg fetches it with RDMA READ; the sender takes its buffer back with reclaim,
    /// keeping up to 8 lent). The echo of `lat` is lent back the same way. The server
    /// follows the client unless it was given --lend itself.
    #[arg(long = "lend", conflicts_with = "messages")]
    pub lend: bool,

    /// Open N connections (1 to 64), one thread each, started together at every size:
    /// bandwidth is all their bytes over the time from the common start to the last
    /// connection's end; latency samples are pooled. A server given it serves only clients
    /// with the same N.
    #[arg(long = "connections", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=STREAM_MAX_CONNECTIONS as i64))]
    pub connections: Option<u32>,

    /// The least time trespass's blocking calls spin on the completion queue before they
    /// sleep on the completion channel, in microseconds (0 to 1000000; default: trespass's,
    /// 20). Above it trespass adapts the spin to how long waits take (--busy-poll-max-us).
    /// Each side sets its own.
    #[arg(long = "busy-poll-us", value_name = "USEC",
          value_parser = clap::value_parser!(u64).range(0..=STREAM_MAX_BUSY_POLL_US))]
    pub busy_poll_us: Option<u64>,

    /// The limit of trespass's adaptive spin, in microseconds (0 to 1000000; 0 turns the
    /// adaptation off; default: trespass's, 750): while a connection's waits typically end
    /// within half of it, a wait spins up to twice their average before sleeping (within a
    /// third of it except in a read after this side wrote). Each side sets its own. With
    /// --tokio it also fixes whether the spin adapts (without it, the tokio front end adapts
    /// while its runtime is not crowded, as here it never is).
    #[arg(long = "busy-poll-max-us", value_name = "USEC",
          value_parser = clap::value_parser!(u64).range(0..=STREAM_MAX_BUSY_POLL_US))]
    pub busy_poll_max_us: Option<u64>,

    /// Turn trespass's nodelay off on this side (Stream::set_nodelay(false)): small writes
    /// are held until 16 KiB are pending, a message is sent or this side blocks in a read.
    /// Default: nodelay on, every write goes out at once.
    #[arg(long = "coalesce")]
    pub coalesce: bool,

    /// Drive each connection through trespass's tokio front end (trespass::tokio::Stream)
    /// instead of the blocking calls: each connection's thread runs a current-thread tokio
    /// runtime of its own (the per-core mode), every read and write awaits in its reactor,
    /// and the measured loop runs as one future (as an application's task would). Each
    /// side sets its own.
    #[arg(long = "tokio")]
    pub tokio: bool,

    /// Draw this side's receives from one shared receive queue of DEPTH receives for all its
    /// connections (trespass's Config::shared_receive_queue, 8 to 4194304) instead of a
    /// receive queue per connection. Each side sets its own.
    #[arg(long = "shared-receive-queue", value_name = "DEPTH",
          value_parser = clap::value_parser!(u32).range(8..=(1 << 22)))]
    pub shared_receive_queue: Option<u32>,

    /// Client only: also write the results as JSON to this file.
    #[arg(long = "json", value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn perftest_letters_parse() {
        let cli = Cli::try_parse_from([
            "stride-perf",
            "write",
            "bw",
            "-d",
            "rxe0",
            "-x",
            "1",
            "-s",
            "4096",
            "-n",
            "100",
            "-q",
            "4",
            "-l",
            "16",
            "-Q",
            "8",
            "-c",
            "UC",
            "--report-gbits",
            "198.18.0.1",
        ])
        .unwrap();
        let (verb, a) = cli.command.run_args().unwrap();
        assert_eq!(verb, Verb::Write);
        assert_eq!(a.test, Test::Bw);
        assert_eq!(a.server.as_deref(), Some("198.18.0.1"));
        assert_eq!(
            (a.size, a.iterations, a.qps, a.post_list),
            (Some(4096), Some(100), 4, 16)
        );
        assert_eq!(a.connection, Connection::Uc);
        assert!(a.report_gbits);
    }

    #[test]
    fn size_and_all_conflict() {
        assert!(Cli::try_parse_from(["stride-perf", "write", "bw", "-a", "-s", "8"]).is_err());
        assert!(Cli::try_parse_from(["stride-perf", "write", "bw", "-n", "5", "-D", "2"]).is_err());
        assert!(Cli::try_parse_from(["stride-perf", "write", "fast"]).is_err());
    }

    #[test]
    fn memory_options_exclude_each_other() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["stride-perf", "write", "bw"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
        };
        for clash in [
            &["--use-cuda", "0", "--use-cuda-dmabuf", "0"][..],
            &["--use-cuda", "0", "--use-hugepages"][..],
            &["--use-cuda-dmabuf", "1", "--use-hugepages"][..],
        ] {
            let e = parse(clash).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{clash:?}"
            );
        }
        let cli = parse(&["--use-cuda-dmabuf", "2"]).unwrap();
        let (_, a) = cli.command.run_args().unwrap();
        assert_eq!(
            (a.use_cuda, a.use_cuda_dmabuf, a.gpu_option()),
            (None, Some(2), Some("--use-cuda-dmabuf"))
        );
        assert!(parse(&["--use-cuda", "x"]).is_err());
    }

    #[test]
    fn interval_and_rate_options_are_checked() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["stride-perf", "write", "bw"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
        };
        let args = |extra: &[&str]| {
            let cli = parse(extra).unwrap();
            cli.command.run_args().unwrap().1.clone()
        };
        assert_eq!(args(&[]).report_interval, 1.0);
        assert_eq!(
            args(&["-D", "3", "--report-interval", "0.25"]).report_interval,
            0.25
        );
        for bad in ["0", "-1", "x", "3601", "0.001"] {
            let arg = format!("--report-interval={bad}");
            let e = parse(&[&arg]).unwrap_err().to_string();
            assert!(e.contains("--report-interval"), "{bad}: {e}");
        }
        assert_eq!(args(&["-D", "31536000"]).duration, Some(MAX_DURATION_S));
        for (bad, want) in [
            ("1e30", "'1e30' is not a whole number of seconds"),
            ("2.5", "'2.5' is not a whole number of seconds"),
            ("-1", "'-1' is not a whole number of seconds"),
            ("0", "0 s is out of range"),
            ("31536001", "31536001 s is out of range"),
            (
                "18446744073709551615",
                "18446744073709551615 s is out of range",
            ),
        ] {
            let arg = format!("-D={bad}");
            let e = parse(&[&arg]).unwrap_err().to_string();
            assert!(
                e.contains(want) && e.contains("-D takes whole seconds, from 1 to 31536000"),
                "{bad}: {e}"
            );
            assert!(!e.contains("invalid digit"), "{bad}: {e}");
        }
        assert!(args(&["--run-infinitely"]).run_infinitely);
        assert!(args(&["--run_infinitely"]).run_infinitely);
        for clash in [
            &["--run-infinitely", "-D", "2"][..],
            &["--run-infinitely", "-n", "9"],
            &["--run-infinitely", "-a"],
        ] {
            assert_eq!(
                parse(clash).unwrap_err().kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{clash:?}"
            );
        }
        let a = args(&["--rate-limit", "1.5"]);
        assert_eq!(
            (a.rate_limit, a.rate_units, a.burst_size),
            (Some(1.5), RateUnit::G, None)
        );
        let a = args(&[
            "--rate_limit",
            "100",
            "--rate_units",
            "M",
            "--burst_size",
            "4",
        ]);
        assert_eq!(
            (a.rate_limit, a.rate_units, a.burst_size),
            (Some(100.0), RateUnit::M, Some(4))
        );
        assert_eq!(
            args(&["--rate-limit", "5000", "--rate-units", "p"]).rate_units,
            RateUnit::P
        );
        for bad in [
            &["--rate-limit", "0"][..],
            &["--rate-limit=-3"],
            &["--rate-limit", "1Gb"],
            &["--rate-limit", "inf"],
            &["--rate-limit", "1", "--rate-units", "k"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse(&["--burst-size", "4"]).unwrap_err().kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
    }
}
