//! The measurement engine: one side of a run, from the device to the printed table and the
//! JSON file.
//!
//! A run goes: resolve the parameters; prepare the buffers' memory (load the CUDA driver and
//! open the GPU, or check the huge page pool) so that a machine without it fails before
//! anything else; open the device, pick the GID and check the sizes fit;
//! connect the out-of-band channel and agree on the parameters (both sides refuse a mismatch,
//! naming it); create the QPs and buffers, trade endpoints, connect; then for each size meet
//! at a barrier, measure (the `bw` or `lat` module), meet again, print the row; finally trade
//! results, so that each side holds both, and write the JSON file once.
//!
//! Who measures: the client of every test; the server too in ping-pong latency tests (WRITE,
//! SEND), in SEND bandwidth tests (its receive rate), and with `-b`. A server that only
//! served one-sided operations (READ, WRITE and atomic bandwidth, READ and atomic latency)
//! measured nothing: it says so and prints the client's table, which it received.
//!
//! Any error after the channel is up is sent to the peer (`Abort`), so both sides stop with
//! the same reason.

mod bw;
mod cm;
mod completion;
mod dc;
mod error;
mod interrupt;
mod lat;
mod link;
mod setup;
mod validate;
mod watch;

pub use error::RunError;

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::bandwidth::{interval_summary, BandwidthResult, BandwidthTimes};
use crate::buffer::Memory;
use crate::cli::{RunArgs, Test, Verb};
use crate::clock::{current_source, ClockCheck};
use crate::oob::{OobChannel, QpEndpoint};
use crate::params::{SideParams, TestParams};
use crate::post_clock::{PostClock, StampLog, DURATION_STAMPS_MAX};
use crate::preflight::{self, PortProfile};
use crate::progress::Progress;
use crate::report::{self, IntervalSeries, Report, SideReport, SizeResult};
use sideway::peer_text::{printable, PEER_TEXT_MAX};

use link::LinkWatch;
use setup::{mtu_note, path_mtu, DeviceSide, Resources, VerbsApi};
use watch::{Watch, STALL};

/// How long each setup exchange may wait for the peer.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(15);

/// Refuses what this version cannot do yet, before touching anything.
fn check_supported(params: &TestParams) -> Result<(), RunError> {
    if params.events && params.verb == Verb::Write && params.test == Test::Lat {
        return Err(RunError::usage(
            "-e (completion events) does not apply to write lat: its ping-pong spins on the \
             last byte of the buffer, not on a completion queue; drop -e",
        ));
    }
    Ok(())
}

/// Runs one side of a pair test: the server when `args.server` is `None`. The command runs
/// [`crate::mode::run`], which also refuses stray cluster options and runs a rank of a
/// cluster run with `--cluster`.
pub fn run_pair(verb: Verb, args: &RunArgs) -> Result<(), RunError> {
    run_side(verb, args, false, |params| match &args.server {
        Some(host) => {
            let mut oob = OobChannel::connect(host, args.port, EXCHANGE_TIMEOUT)?;
            oob.client_handshake(params)?;
            Ok(oob)
        }
        None => {
            println!(
                "stride-perf server: waiting for a client on TCP port {}",
                args.port
            );
            let mut oob = OobChannel::accept(args.port, EXCHANGE_TIMEOUT)?;
            oob.server_handshake(params)?;
            Ok(oob)
        }
    })
    .map(drop)
}

/// One side of a pair over the out-of-band channel that `open` connects and opens (the
/// handshake done): the client when `args.server` is set. Prints nothing on standard output
/// when `quiet` (a cluster's rank runs several at once). Returns this side's report and the
/// peer's.
pub(crate) fn run_side(
    verb: Verb,
    args: &RunArgs,
    quiet: bool,
    open: impl FnOnce(&TestParams) -> Result<OobChannel, RunError>,
) -> Result<(SideReport, SideReport), RunError> {
    // The command line is read here, once: below, the engine sees the test's parameters
    // (the ones both sides agree on) and this side's own.
    let mut params = TestParams::resolve(verb, args)?;
    let side = SideParams::from_args(args);
    check_supported(&params)?;
    // Before any memory is touched, so that it comes from the pinned cores' node.
    let pinned = pin(&side)?;
    // First: with --use-cuda and no driver (or no such GPU) nothing else runs.
    let memory = Memory::prepare(side.buffer)?;
    let dev = DeviceSide::open(&side, &params)?;
    if let Some(warning) = params.fit_device(
        dev.name(),
        dev.dev_attr.max_qp_rd_atom(),
        dev.dev_attr.vendor_id(),
        side.inline_given,
    ) {
        eprintln!("{warning}");
    }
    // Before anything connects: a few milliseconds, even with a slow clock.
    let clock = ClockCheck::measure();
    if let Some(warning) = clock.warning() {
        eprintln!("{warning}");
    }
    let mut oob = open(&params)?;
    let result = run_connected(
        &dev,
        &memory,
        &clock,
        &side,
        &params,
        &mut oob,
        SideOptions { pinned, quiet },
    );
    if let Err(e) = &result {
        oob.abort(&e.to_string());
    }
    result
}

/// How one side of a pair presents itself: the CPU pinning line for its banner, and whether
/// it prints at all (a cluster's ranks do not; rank 0 reports the whole run).
struct SideOptions {
    pinned: Option<String>,
    quiet: bool,
}

/// Pins the process as `--pin-cores` or `--numa-node` ask; returns the banner's line.
fn pin(side: &SideParams) -> Result<Option<String>, RunError> {
    use crate::cpu::{numa_node_cpus, parse_cpu_list, pin_to, CpuList};
    let (cpus, why) = match (&side.pin_cores, side.numa_node) {
        (Some(list), _) => (
            parse_cpu_list(list).map_err(|e| RunError::usage(format!("--pin-cores: {e}")))?,
            "--pin-cores".to_owned(),
        ),
        (None, Some(node)) => (
            numa_node_cpus(node).map_err(|e| RunError::usage(format!("--numa-node: {e}")))?,
            format!("--numa-node {node}"),
        ),
        (None, None) => return Ok(None),
    };
    let got = pin_to(&cpus).map_err(RunError::setup)?;
    Ok(Some(format!("cores {} ({why}; read back)", CpuList(&got))))
}

/// This host's device, port and GID as a pair run would pick them: the device's name, the
/// port, and the GID line of the banner.
pub(crate) fn device_summary(verb: Verb, args: &RunArgs) -> Result<(String, u8, String), RunError> {
    let params = TestParams::resolve(verb, args)?;
    let dev = DeviceSide::open(&SideParams::from_args(args), &params)?;
    Ok((dev.name().to_owned(), dev.port, dev.gid_line()))
}

fn verb_title(verb: Verb) -> &'static str {
    match verb {
        Verb::Send => "SEND",
        Verb::Write => "RDMA WRITE",
        Verb::Read => "RDMA READ",
        Verb::Atomic => "atomic",
    }
}

/// What the banner shows: the device, the memory, the clock, the test, the resources, the
/// first QP's endpoints on both sides, the path MTU in bytes and this side's role.
#[derive(Clone, Copy)]
struct Banner<'a> {
    dev: &'a DeviceSide,
    memory: &'a Memory,
    clock: &'a ClockCheck,
    params: &'a TestParams,
    res: &'a Resources,
    ours: &'a QpEndpoint,
    theirs: &'a QpEndpoint,
    mtu: u32,
    role: &'a str,
}

fn print_banner(banner: Banner<'_>) {
    let Banner {
        dev,
        memory,
        clock,
        params,
        res,
        ours,
        theirs,
        mtu,
        role,
    } = banner;
    let test = match params.test {
        Test::Bw => "bandwidth",
        Test::Lat => "latency",
    };
    let amount = match params.duration {
        Some(d) => format!("{d} s per size"),
        None if params.run_infinitely => "until interrupted".to_owned(),
        None => format!("{} iterations", params.iterations),
    };
    println!("{}", report::RULE);
    println!(
        "                    {} {test} test (stride-perf, {role})",
        verb_title(params.verb)
    );
    println!(" Device          : {}, port {}", dev.name(), dev.port);
    println!(
        " Connection type : {:<14}Number of QPs : {}",
        format!("{:?}", params.connection).to_uppercase(),
        params.qps
    );
    println!(
        " TX depth        : {:<14}Post list     : {}",
        params.tx_depth, params.post_list
    );
    println!(
        " CQ moderation   : {:<14}Path MTU      : {mtu} B{}",
        params.cq_mod,
        mtu_note(params.mtu, mtu).unwrap_or_default()
    );
    println!(
        " Inline data     : {:<14}Run           : {amount}",
        format!("{} B", res.inline)
    );
    if matches!(params.verb, Verb::Read | Verb::Atomic) {
        println!(" Outstand reads  : {}", params.outstanding);
    }
    if params.verb == Verb::Send {
        println!(" RX depth        : {}", params.rx_depth);
    }
    match &res.dc {
        Some(dc) => {
            println!(" DC QPs          : {}", dc.describe());
            println!(" Posting         : ibv_wr_* with mlx5dv_wr_set_dc_addr (DC initiators)");
        }
        None => println!(" Posting         : {}", res.api.posting()),
    }
    println!(" Polling         : {}", res.api.polling());
    println!(" Buffers         : {}", memory.description());
    println!(
        " Memory regions  : {}",
        res.bufs.layout().describe(res.bufs.qps())
    );
    println!(" Clock           : {}", clock.description_for(params.test));
    println!(" Link type       : {}", dev.link_type());
    if params.bidirectional {
        println!(
            " Bidirectional   : each side measures its own direction; a bandwidth row is \
             both directions' sum, each direction on the line under it"
        );
    }
    if params.rdma_cm {
        println!(" QP setup        : rdma_cm (-R): path, PSNs and QP numbers from rdma_cm");
    } else {
        println!(" QP setup        : endpoints traded over TCP (no rdma_cm)");
    }
    if let Some(srq) = &res.srq {
        println!(
            " Receives        : one shared receive queue (--use-srq), {} entries",
            srq.max_wr()
        );
    }
    if params.warm_up {
        println!(" Warm-up         : one unmeasured round of -t messages per QP before each size");
    }
    if let Some(limit) = &params.rate_limit {
        println!(
            " Rate limit      : {} (software pacing of this side's posts)",
            limit.describe()
        );
    }
    if params.data_validation {
        println!(" Data validation : on: every byte that lands is compared after each size");
    }
    println!(" GID             : {}", dev.gid_line());
    for (which, ep) in [("local address ", ours), ("remote address", theirs)] {
        println!(
            " {which}  : LID {:#06x} QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
            ep.lid, ep.qpn, ep.psn, ep.rkey, ep.addr
        );
    }
}

/// A side connected to its peer: its resources, both ports' profiles, both first endpoints,
/// the path MTU, and with `-R` the rdma_cm connections, held until the end of the run
/// (dropping an id tears its connection down).
struct Connected {
    res: Resources,
    our_port: PortProfile,
    their_port: PortProfile,
    our_first: QpEndpoint,
    their_first: QpEndpoint,
    mtu: sideway::device::Mtu,
    _cm_links: Option<cm::CmLinks>,
}

/// From the pre-flight check to the "connected" barrier: checks that the two ports can
/// talk, creates the QPs and buffers, trades endpoints, connects (over rdma_cm with `-R`)
/// and fills the receive queues.
fn connect(
    dev: &DeviceSide,
    memory: &Memory,
    side_params: &SideParams,
    params: &TestParams,
    oob: &mut OobChannel,
    role_name: &str,
) -> Result<Connected, RunError> {
    let is_client = side_params.is_client();
    // Before anything is created, let alone moved to RTR: can the two ports talk at all?
    let our_port = dev.profile(role_name);
    let their_port = oob.exchange_profiles(&our_port)?;
    let diagnosis = preflight::diagnose(&our_port, &their_port, params.rdma_cm);
    for note in &diagnosis.notes {
        eprintln!("stride-perf: pre-flight: {note}");
    }
    if !diagnosis.errors.is_empty() {
        return Err(RunError::setup(format!(
            "pre-flight check, before connecting: {}",
            diagnosis.errors.join("; ")
        )));
    }
    let mut res = Resources::create(
        dev,
        memory,
        params,
        VerbsApi::from_side(side_params, dev),
        is_client,
    )?;
    for why in [&res.api.qp_fallback, &res.api.cq_fallback]
        .into_iter()
        .flatten()
    {
        eprintln!("stride-perf: {why}: using the classic verbs instead");
    }
    let ours = res.endpoints(dev);
    // With -R the server listens before the client learns anything, so that the client's
    // connection requests find the listener.
    let listener = match (params.rdma_cm, is_client) {
        (true, false) => Some(cm::CmListener::listen(
            side_params.port,
            params.qps,
            params.tos,
        )?),
        _ => None,
    };
    // Checked as it comes (one endpoint per QP, every buffer within the address space):
    // both the -R and the plain path index and offset into it.
    let theirs = oob.exchange_endpoints(&ours, res.buffer_len())?;
    let (our_first, their_first) = match (ours.first(), theirs.first()) {
        (Some(a), Some(b)) => (*a, *b),
        _ => return Err(RunError::peer_invalid("the peer sent no QP endpoints")),
    };
    let mtu = path_mtu(params, our_first.mtu, their_first.mtu)?;
    // Held until the end of the run: dropping an id tears its connection down.
    let _cm_links = if params.rdma_cm {
        res.remotes = theirs;
        let links = match (&side_params.server, listener) {
            (Some(host), _) => cm::connect_all(host, side_params.port, &res, params, dev.name())?,
            (None, Some(listener)) => listener.accept_all(&res, params, dev.name())?,
            (None, None) => return Err(RunError::usage("-R: the server has no rdma_cm listener")),
        };
        Some(links)
    } else {
        res.connect(dev, params, theirs, mtu)?;
        None
    };
    res.fill_receive_queues(params)?;
    oob.barrier("connected")?;
    Ok(Connected {
        res,
        our_port,
        their_port,
        our_first,
        their_first,
        mtu,
        _cm_links,
    })
}

/// The lines printed once the two sides are connected, unless `quiet`: the banner, the
/// pre-flight summary, the CPU pinning, and the type of service or traffic class (read back
/// from QP 0 where it can be, quiet or not).
fn print_connected(
    banner: Banner<'_>,
    our_port: &PortProfile,
    their_port: &PortProfile,
    pinned: Option<&str>,
    quiet: bool,
) -> Result<(), RunError> {
    // A cluster's rank prints nothing of a pair: rank 0 prints the whole run's report.
    macro_rules! println {
        ($($t:tt)*) => {
            if !quiet {
                std::println!($($t)*);
            }
        };
    }
    let Banner { params, res, .. } = banner;
    if !quiet {
        print_banner(banner);
    }
    println!(" Pre-flight      : {}", our_port.summary(their_port));
    if let Some(line) = pinned {
        println!(" CPU pinning     : {line}");
    }
    if let Some(tos) = params.tos {
        match res.read_traffic_class()? {
            Some(read) => println!(
                " Type of service : {tos} (--tos, through rdma_cm; QP 0's traffic class reads {read})"
            ),
            None => println!(" Type of service : {tos} (--tos, through rdma_cm)"),
        }
    }
    if let Some(tc) = params.traffic_class {
        match res.read_traffic_class()? {
            Some(read) => {
                println!(" Traffic class   : {read} (--tclass {tc}; read back from QP 0)")
            }
            None => {
                let kind = if res.dc.is_some() { "DC" } else { "UD" };
                println!(" Traffic class   : {tc} (--tclass; in each {kind} address handle)")
            }
        }
    }
    Ok(())
}

fn run_connected(
    dev: &DeviceSide,
    memory: &Memory,
    clock: &ClockCheck,
    side_params: &SideParams,
    params: &TestParams,
    oob: &mut OobChannel,
    side: SideOptions,
) -> Result<(SideReport, SideReport), RunError> {
    let SideOptions { pinned, quiet } = side;
    // A cluster's rank prints nothing of a pair: rank 0 prints the whole run's report.
    macro_rules! println {
        ($($t:tt)*) => {
            if !quiet {
                std::println!($($t)*);
            }
        };
    }
    let is_client = side_params.is_client();
    let role_name = if is_client { "client" } else { "server" };
    let Connected {
        mut res,
        our_port,
        their_port,
        our_first,
        their_first,
        mtu,
        _cm_links,
    } = connect(dev, memory, side_params, params, oob, role_name)?;
    print_connected(
        Banner {
            dev,
            memory,
            clock,
            params,
            res: &res,
            ours: &our_first,
            theirs: &their_first,
            mtu: mtu.bytes().unwrap_or(0),
            role: role_name,
        },
        &our_port,
        &their_port,
        pinned.as_deref(),
        quiet,
    )?;

    // The passive side waits at the "done" barrier for as long as the peer measures: with
    // --run-infinitely, until the peer is interrupted (a year stands for that).
    let measure_timeout = if params.run_infinitely {
        Duration::from_secs(365 * 24 * 3600)
    } else {
        Duration::from_secs(300 + 2 * params.duration.unwrap_or(0))
    };
    oob.set_timeout(measure_timeout)?;
    let mut watch = Watch::new(
        STALL,
        LinkWatch::new(std::sync::Arc::clone(&dev.ctx), dev.port, params),
    );

    let sends = is_client || params.bidirectional;
    let receives = params.verb == Verb::Send && (!is_client || params.bidirectional);
    let measures = match (params.test, params.verb) {
        (Test::Bw, _) => sends || receives,
        (Test::Lat, Verb::Write | Verb::Send) => true,
        (Test::Lat, _) => is_client,
    };
    if params.run_infinitely && sends {
        interrupt::catch_stop_signals()?;
        println!(
            " Run             : until SIGINT (Ctrl-C) or SIGTERM; an interval every {} s",
            params.report_interval
        );
    }
    let (mut tx, mut rx, mut posted) = records(params, sends, receives);
    let gbits = side_params.report_gbits;
    let header = match params.test {
        Test::Bw => report::bandwidth_header(gbits),
        Test::Lat => report::latency_header(),
    };
    // A timed bandwidth run prints its intervals first and the header just above its row.
    let header_per_row = params.timed() && params.test == Test::Bw;
    let both_directions = params.bidirectional && params.test == Test::Bw;
    if measures && !header_per_row {
        println!("{header}");
    }
    let mut progress = Progress::new(
        params.sizes.len(),
        // Only when both streams are a terminal: a progress line on a terminal between rows
        // that went down a pipe would land out of order.
        !quiet
            && params.sizes.len() > 1
            && std::io::stderr().is_terminal()
            && std::io::stdout().is_terminal(),
    );
    let mut results = Vec::with_capacity(params.sizes.len());
    let mut interval_series = Vec::new();
    let data_roles = validate::DataRoles::of(params, is_client);
    let mut validated = 0u64;
    let base = Instant::now();
    // The latency loops' post stamps; the TSC's rate is measured from here to each size's end.
    let stamps = PostClock::start(clock.tsc_stamps);
    for (k, &size) in params.sizes.iter().enumerate() {
        progress.show(k, size);
        if params.data_validation {
            validate::prepare(&mut res, data_roles, is_client, size)?;
        }
        let one_sided = params.verb != Verb::Send;
        if one_sided && res.bufs.is_staged() {
            res.stage_targets_from_gpu()?;
        }
        watch.barrier(oob, &format!("start {size}"), measure_timeout)?;
        let cpu_before = params.cpu_util.then(crate::cpu::CpuTimes::now).flatten();
        let result = match params.test {
            Test::Bw => bw::run_size(
                bw::BwSize {
                    res: &mut res,
                    params,
                    oob,
                    role: bw::BwRole {
                        sends,
                        receives,
                        gbits,
                    },
                    tx: &mut tx,
                    rx: &mut rx,
                    base,
                    watch: &mut watch,
                },
                size,
            )?
            .map(|(mut r, intervals)| {
                let cpu_after = cpu_before.and(crate::cpu::CpuTimes::now());
                r.cpu_util_percent = cpu_before
                    .zip(cpu_after)
                    .and_then(|(a, b)| a.util_since(&b));
                if !intervals.is_empty() {
                    interval_series.push(IntervalSeries {
                        bytes: size,
                        period_s: params.report_interval,
                        intervals,
                    });
                }
                SizeResult::Bandwidth(r)
            }),
            Test::Lat => lat::run_size(
                lat::LatSize {
                    res: &mut res,
                    params,
                    oob,
                    is_client,
                    posted: &mut posted,
                    stamps: &stamps,
                    watch: &mut watch,
                },
                size,
            )?
            .map(SizeResult::Latency),
        };
        watch.barrier(oob, &format!("done {size}"), measure_timeout)?;
        if one_sided && res.bufs.is_staged() {
            res.stage_targets_to_gpu()?;
        }
        if params.data_validation {
            validated += validate::check(&res, data_roles, is_client, size)?;
        }
        if params.test == Test::Lat {
            res.reset_after_latency()?;
        }
        progress.clear();
        if let Some(r) = result {
            // With -b a bandwidth row is both directions': printed once the peer's are here.
            if !quiet && !both_directions {
                print_row(
                    &report::row_for(&r, gbits),
                    &r,
                    params,
                    header_per_row.then_some(header.as_str()),
                    gbits,
                );
            }
            results.push(r);
        }
    }
    if params.data_validation {
        if data_roles.checks() {
            println!(
                " Data validation : {validated} bytes checked on this side, every one as the \
                 peer sent it"
            );
        } else {
            println!(" Data validation : the peer checks the data that lands there");
        }
    }
    let this_side = side_report(
        dev,
        memory,
        clock_note(clock, params.test),
        &res,
        role_name,
        results,
        interval_series,
    );
    trade_results(
        oob,
        params,
        side_params,
        this_side,
        measures,
        quiet,
        &header,
    )
}

/// A size's row (`row`, the text of `r`'s): the header above it (`header`, for a timed
/// bandwidth run), a timed run's interval summary and, with `--cpu-util`, the CPU's use.
fn print_row(row: &str, r: &SizeResult, params: &TestParams, header: Option<&str>, gbits: bool) {
    if let Some(header) = header {
        println!("{header}");
    }
    println!("{row}");
    if let SizeResult::Bandwidth(BandwidthResult {
        intervals: Some(stats),
        ..
    }) = r
    {
        println!("{}", interval_summary(stats, params.report_interval, gbits));
    }
    if params.cpu_util {
        if let SizeResult::Bandwidth(b) = r {
            match b.cpu_util_percent {
                Some(u) => println!(
                    " CPU utilization : {u:.1} % of all CPUs during the measured loop \
                     (/proc/stat)"
                ),
                None => println!(" CPU utilization : /proc/stat could not be read"),
            }
        }
    }
}

/// The records of a run's messages, allocated before it with room for every message: a
/// bandwidth test's sent and received messages, a latency test's post stamps.
fn records(
    params: &TestParams,
    sends: bool,
    receives: bool,
) -> (BandwidthTimes, BandwidthTimes, StampLog) {
    let messages = if params.timed() {
        1
    } else {
        usize::try_from(params.iterations.saturating_mul(u64::from(params.qps)))
            .unwrap_or(usize::MAX)
    };
    let tx = BandwidthTimes::with_capacity(if params.test == Test::Bw && sends {
        messages
    } else {
        0
    });
    let rx = BandwidthTimes::with_capacity(if params.test == Test::Bw && receives {
        messages.max(1)
    } else {
        1
    });
    let posted = match (params.test, params.duration) {
        (Test::Bw, _) => StampLog::with_cap(0),
        // Duration mode: room for a fast device's worth; more grows the log up to its bound,
        // the statistics then being the first DURATION_STAMPS_MAX iterations'.
        (Test::Lat, Some(d)) => StampLog::with_room(
            usize::try_from(d.saturating_mul(1_000_000)).unwrap_or(usize::MAX),
            DURATION_STAMPS_MAX,
        ),
        // Counted: room for every iteration, as many as come kept.
        (Test::Lat, None) => {
            StampLog::with_room(usize::try_from(params.iterations).unwrap_or(0), usize::MAX)
        }
    };
    (tx, rx, posted)
}

/// The clock as this side's report describes it: noted as switched, with a warning, when the
/// clocksource changed during the run.
fn clock_note(clock: &ClockCheck, test: Test) -> String {
    let mut clock_note = clock.description_for(test);
    let source_now = current_source();
    if let Some(warning) = clock.switched(source_now.as_deref()) {
        eprintln!("{warning}");
        clock_note.push_str(&format!(
            "; switched to {} during the run",
            source_now.as_deref().unwrap_or("another clocksource")
        ));
    }
    clock_note
}

/// This side's report: who it is, what it ran on and what it measured.
fn side_report(
    dev: &DeviceSide,
    memory: &Memory,
    clock_note: String,
    res: &Resources,
    role_name: &str,
    results: Vec<SizeResult>,
    interval_series: Vec<IntervalSeries>,
) -> SideReport {
    SideReport {
        role: role_name.to_owned(),
        device: dev.name().to_owned(),
        gid_index: dev.gid.map_or(0, |g| g.index),
        buffer: Some(memory.description()),
        memory_regions: Some(res.bufs.layout().describe(res.bufs.qps())),
        clock: Some(clock_note),
        posting: Some(res.api.posting()),
        polling: Some(res.api.polling()),
        results,
        intervals: interval_series,
    }
}

/// Trades this side's report for the peer's and reports the run: the peer's rows on a side
/// that measured nothing (or with `--report-both`), the closing rule, and the JSON file.
/// Returns both sides' reports.
fn trade_results(
    oob: &mut OobChannel,
    params: &TestParams,
    side_params: &SideParams,
    this_side: SideReport,
    measures: bool,
    quiet: bool,
    header: &str,
) -> Result<(SideReport, SideReport), RunError> {
    // A cluster's rank prints nothing of a pair: rank 0 prints the whole run's report.
    macro_rules! println {
        ($($t:tt)*) => {
            if !quiet {
                std::println!($($t)*);
            }
        };
    }
    let gbits = side_params.report_gbits;
    let peer = oob.exchange_results(&this_side)?;
    if !measures {
        println!(
            " This side only served the peer's one-sided operations and measured nothing; \
             the {}'s results:",
            printable(&peer.role, PEER_TEXT_MAX)
        );
        println!("{header}");
        for r in &peer.results {
            println!("{}", report::row_for(r, gbits));
        }
    }
    if params.bidirectional && params.test == Test::Bw && !quiet {
        print_both_directions(&this_side, &peer, params, gbits, header);
    }
    if side_params.report_both && measures && !quiet {
        print_both(&this_side, &peer, gbits, params.bidirectional);
    }
    println!("{}", report::RULE);
    if let Some(path) = &side_params.json {
        let report = Report {
            tool: "stride-perf".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            params: params.clone(),
            report_gbits: gbits,
            this_side: this_side.clone(),
            peer: Some(peer.clone()),
        };
        report.write_json(path).map_err(|e| {
            RunError::new(format!(
                "the run succeeded but the results could not be written to {}: {e}",
                path.display()
            ))
        })?;
        println!(" results (both sides) written to {}", path.display());
    }
    Ok((this_side, peer))
}

/// `-b` bandwidth rows, as perftest prints them: each size's two directions summed, each
/// direction under the sum (a size the peer has no row for prints this side's alone).
fn print_both_directions(
    ours: &SideReport,
    peer: &SideReport,
    params: &TestParams,
    gbits: bool,
    header: &str,
) {
    let header_per_row = params.timed().then_some(header);
    for (k, r) in ours.results.iter().enumerate() {
        let row = match (r, peer.results.get(k)) {
            (SizeResult::Bandwidth(a), Some(SizeResult::Bandwidth(b))) => {
                report::bidirectional_row(a, b, gbits)
            }
            _ => report::row_for(r, gbits),
        };
        print_row(&row, r, params, header_per_row, gbits);
    }
}

/// `--report-both`: the peer's rows under this side's, and with `-b` each size's two
/// directions together.
fn print_both(ours: &SideReport, peer: &SideReport, gbits: bool, bidirectional: bool) {
    let role = printable(&peer.role, PEER_TEXT_MAX);
    if peer.results.is_empty() {
        println!(" The {role} measured nothing (it served one-sided operations)");
        return;
    }
    println!(" The {role}'s results (--report-both):");
    for r in &peer.results {
        println!("{}", report::row_for(r, gbits));
    }
    if bidirectional {
        for (a, b) in ours.results.iter().zip(&peer.results) {
            if let (SizeResult::Bandwidth(a), SizeResult::Bandwidth(b)) = (a, b) {
                let unit = if gbits { "Gb/sec" } else { "MiB/sec" };
                println!(
                    " Both directions : {} B: {:.2} {unit}, {:.6} Mpps",
                    a.bytes,
                    a.avg(gbits) + b.avg(gbits),
                    a.msg_rate_mpps + b.msg_rate_mpps
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(args: &[&str]) -> TestParams {
        crate::params::from_args(args).unwrap()
    }

    #[test]
    fn a_timed_latency_run_keeps_a_bounded_number_of_stamps() {
        let (_, _, posted) = records(&params(&["write", "lat", "-D", "3600"]), true, true);
        assert_eq!(posted.cap(), DURATION_STAMPS_MAX);
        assert!(posted.capacity() <= DURATION_STAMPS_MAX);
        let (_, _, posted) = records(&params(&["write", "lat", "-n", "1000"]), true, true);
        assert!(posted.capacity() >= 1000);
        assert_eq!(posted.cap(), usize::MAX, "a counted run keeps every stamp");
    }

    #[test]
    fn write_lat_refuses_completion_events() {
        assert!(check_supported(&params(&["send", "bw", "-c", "UD"])).is_ok());
        assert!(check_supported(&params(&["write", "bw", "-R"])).is_ok());
        assert!(check_supported(&params(&["write", "bw", "-e"])).is_ok());
        let e = check_supported(&params(&["write", "lat", "-e"])).unwrap_err();
        assert!(matches!(e, RunError::Usage(_)), "{e:?}");
        assert!(e.to_string().contains("does not apply to write lat"), "{e}");
        assert!(check_supported(&params(&["write", "bw", "-c", "UC"])).is_ok());
    }
}
