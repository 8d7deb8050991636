//! The ping-pong that rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong`
//! and `ibv_srq_pingpong` run, on sideway.
//!
//! Both sides post `rx_depth` receives, trade endpoints over TCP ([`sideway::connection::exchange`]),
//! and then bounce one `size`-byte SEND back and forth `iters` times: the client sends first;
//! each side sends its next message once its previous send and the peer's message have both
//! completed. Each side prints the two endpoints and the throughput and time per iteration,
//! in the same words as rdma-core's programs, so runs of the two can be compared line by line.
//!
//! - [`run_connected`]: RC or UC, one QP.
//! - [`run_ud`]: UD, one QP, sending through an address handle built from the peer's
//!   endpoint; receive buffers keep 40 bytes of room for the GRH.
//! - [`run_srq`]: RC with `num_qp` QPs sharing one receive queue, one endpoint line per QP.
//!
//! With `-e`, a side sleeps on its CQ's completion channel instead of spinning on the CQ.
//!
//! Memory and completion options ([`MemoryFlags`]), as rdma-core's programs have them:
//! `-o` registers the buffer on demand (`IBV_ACCESS_ON_DEMAND`; rc and srq), `-O` uses an
//! implicit on-demand region instead and `-P` prefetches the buffer with `ibv_advise_mr`
//! (rc), `-t` reads each receive's completion timestamp from an extended CQ and prints the
//! clock cycles between receives (rc). A device without the feature ends the run with
//! rdma-core's own message, before anything is sent.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use sideway::completion_queue::{WcOpcode, WcStatus};
use sideway::device::{Mtu, OdpTransportCaps};
use sideway::memory_region::Sge;
use sideway::odp::{AdviseFlags, AdviseMr};
use sideway::queue_pair::AddressVector;
use sideway::{
    AccessFlags, AddressHandle, ClaimedCq, CompletionChannel, CompletionQueue, ConnectOptions,
    DeviceContext, DeviceMemory, Endpoint, EventError, Gid, MemoryRegion, ProtectionDomain, QpType,
    QueuePair, RegisteredBuffer, SendFlags, SharedReceiveQueue, WcFlagsEx, WorkCompletion, GRH_LEN,
};

use crate::cli::CliError;
use sideway::connection::exchange;

/// The options every pingpong shares, with rdma-core's letters and defaults.
#[derive(Debug, Clone, Args)]
pub struct PingpongArgs {
    /// The server to connect to; without it, wait for a client
    pub server: Option<String>,

    /// Listen on / connect to this TCP port
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,

    /// Use this RDMA device (default: the first one found)
    #[arg(short = 'd', long = "ib-dev", value_name = "DEVICE")]
    pub ib_dev: Option<String>,

    /// Use this port of the device
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,

    /// Size of the message to exchange, in bytes
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    pub size: u32,

    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096)
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,

    /// Number of receives to post at a time
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,

    /// Number of exchanges
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    pub iters: u64,

    /// Service level
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    pub sl: u8,

    /// Local port GID index (needed on RoCE; without it the path is LID-routed)
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<u8>,

    /// Use the extended work-request API (ibv_wr_*) and an extended CQ
    #[arg(short = 'N', long = "new_send")]
    pub new_send: bool,

    /// Sleep on CQ events instead of polling
    #[arg(short = 'e', long = "events")]
    pub events: bool,

    /// Give up when the peer sends nothing for this many seconds (also bounds each step of
    /// the TCP exchange of endpoints, the client's connect included)
    #[arg(long = "stall-timeout", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub stall_timeout: u64,

    /// rdma-core's `-c` (validate the received buffer), for the programs that have it: set
    /// by them, not parsed here. See [`stamp_pages`].
    #[arg(skip)]
    pub validate: bool,

    /// rdma-core's `-j` of `ibv_rc_pingpong` (the message buffer in device memory): set by
    /// `rc_pingpong` from [`DmArg`], not parsed here.
    #[arg(skip)]
    pub use_dm: bool,

    /// rdma-core's `-o`, `-O`, `-P` and `-t`, for the programs that have them: set by them
    /// ([`OdpArg`], [`RcMemoryArgs`]), not parsed here.
    #[arg(skip)]
    pub memory: MemoryFlags,
}

/// rdma-core's `-j` of `ibv_rc_pingpong`, for its twin to flatten into its options and copy
/// into [`PingpongArgs::use_dm`].
#[derive(Debug, Clone, Args)]
pub struct DmArg {
    /// Use device memory (memory on the NIC, ibv_alloc_dm) for the message buffer; fails on
    /// a device without it, as ibv_rc_pingpong does
    #[arg(short = 'j', long = "dm")]
    pub dm: bool,
}

/// How a side registers its buffer and reads its completions (rdma-core's `-o`, `-O`, `-P`,
/// `-t`); all off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryFlags {
    /// `-o` (and `-O`): register the buffer with `IBV_ACCESS_ON_DEMAND`.
    pub odp: bool,
    /// `-O`: the buffer lies in an implicit on-demand region.
    pub implicit_odp: bool,
    /// `-P`: prefetch the buffer (`ibv_advise_mr`, PREFETCH_WRITE with FLUSH).
    pub prefetch: bool,
    /// `-t`: read completion timestamps.
    pub timestamps: bool,
}

/// rdma-core's `-o` of `ibv_rc_pingpong` and `ibv_srq_pingpong`, to flatten into a program's
/// options and copy into [`MemoryFlags::odp`].
#[derive(Debug, Clone, Args)]
pub struct OdpArg {
    /// Use on-demand paging: register the buffer with IBV_ACCESS_ON_DEMAND (the device must
    /// page RC sends and receives on demand)
    #[arg(short = 'o', long = "odp")]
    pub odp: bool,
}

/// `ibv_rc_pingpong`'s `-O`, `-P` and `-t`, to flatten into its twin's options.
#[derive(Debug, Clone, Args)]
pub struct RcMemoryArgs {
    /// Use implicit on-demand paging: one region over the whole address space (implies -o;
    /// the device must support implicit ODP)
    #[arg(short = 'O', long = "iodp")]
    pub implicit_odp: bool,

    /// Prefetch the on-demand buffer with ibv_advise_mr before the run (needs -o or -O; a
    /// device without it only warns)
    #[arg(short = 'P', long = "prefetch")]
    pub prefetch: bool,

    /// Read completion timestamps and print the clock cycles between receives (the device
    /// must stamp completions)
    #[arg(short = 't', long = "ts")]
    pub ts: bool,
}

impl MemoryFlags {
    /// rc_pingpong's flags, checked as `ibv_rc_pingpong` checks them before it opens the
    /// device, in its order: `-j` (`dm`) with on-demand paging first, then `-P` without it.
    pub fn rc(odp: &OdpArg, more: &RcMemoryArgs, dm: bool) -> Result<Self, CliError> {
        let flags = MemoryFlags {
            odp: odp.odp || more.implicit_odp,
            implicit_odp: more.implicit_odp,
            prefetch: more.prefetch,
            timestamps: more.ts,
        };
        if flags.odp && dm {
            return Err(CliError::run("DM memory region can't be on demand"));
        }
        if flags.prefetch && !flags.odp {
            return Err(CliError::run(
                "prefetch is valid only with on-demand memory region",
            ));
        }
        Ok(flags)
    }
}

/// What on-demand paging a program needs of the device's RC transport, and rdma-core's
/// message when it is missing.
#[derive(Debug, Clone, Copy)]
pub struct OdpNeed {
    /// The RC capabilities needed.
    pub rc: OdpTransportCaps,
    /// The program's message when the device lacks them.
    pub message: &'static str,
}

/// `ibv_rc_pingpong`'s (and `ibv_uc_pingpong`'s, which has no `-o`) need: RC send and
/// receive.
pub const RC_ODP: OdpNeed = OdpNeed {
    rc: OdpTransportCaps::SEND.union(OdpTransportCaps::RECV),
    message: "The device isn't ODP capable or does not support RC send and receive with ODP",
};

/// `ibv_srq_pingpong`'s need: RC send and receive through the SRQ.
pub const SRQ_ODP: OdpNeed = OdpNeed {
    rc: OdpTransportCaps::SEND.union(OdpTransportCaps::SRQ_RECV),
    message: "The device isn't ODP capable or does not support RC send, receive and srq with \
              ODP",
};

/// Checks the device for what `flags` ask, in rdma-core's order and words; returns the
/// completion timestamp mask (0 without `-t`).
fn check_device(ctx: &DeviceContext, flags: &MemoryFlags, need: OdpNeed) -> Result<u64, CliError> {
    if !flags.odp && !flags.timestamps {
        return Ok(0);
    }
    let attr = ctx
        .query_device()
        .map_err(|e| CliError::run(format!("Couldn't query device for its features: {e}")))?;
    if flags.odp {
        let caps = attr.odp_caps();
        if !caps.is_supported() || !caps.rc.contains(need.rc) {
            return Err(CliError::run(need.message));
        }
        if flags.implicit_odp && !caps.supports_implicit() {
            return Err(CliError::run("The device doesn't support implicit ODP"));
        }
    }
    if flags.timestamps {
        let mask = attr.completion_timestamp_mask();
        if mask == 0 {
            return Err(CliError::run(
                "The device isn't completion timestamp capable",
            ));
        }
        return Ok(mask);
    }
    Ok(0)
}

/// Registers a side's `len`-byte buffer as rdma-core's programs do: plainly, on demand
/// (`-o`), or in an implicit on-demand region (`-O`); then prefetches it (`-P`), where a
/// failure only warns ("Continue anyway"), as in `ibv_rc_pingpong`; then fills it with
/// `fill` (the program's `memset`).
fn register_buffer(
    pd: &Arc<ProtectionDomain>,
    len: usize,
    flags: &MemoryFlags,
    fill: u8,
) -> Result<RegisteredBuffer, CliError> {
    let mut buf = if flags.implicit_odp {
        pd.reg_implicit_odp()
            .and_then(|region| region.alloc_buffer(len))
            .map_err(|e| CliError::run(format!("Couldn't register MR: {e}")))?
    } else {
        let mut access = AccessFlags::LOCAL_WRITE;
        if flags.odp {
            access |= AccessFlags::ON_DEMAND;
        }
        pd.reg_buffer(len, access)
            .map_err(|e| CliError::run(format!("Couldn't register MR: {e}")))?
    };
    if flags.prefetch {
        if let Err(e) = buf.advise(AdviseMr::PrefetchWrite, AdviseFlags::FLUSH, 0..len) {
            let code = match &e {
                sideway::AdviseError::Verb { source, .. } => source.raw_os_error().unwrap_or(-1),
                _ => -1,
            };
            eprintln!("Couldn't prefetch MR({code}). Continue anyway ({e})");
        }
    }
    buf.fill(0..buf.len(), fill).map_err(CliError::run)?;
    Ok(buf)
}

/// `-t`: the clock cycles between consecutive receive completions, as `ibv_rc_pingpong`
/// counts them (the first receive only starts the count; a clock that wrapped is unwrapped
/// with the device's timestamp mask).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecvClock {
    mask: u64,
    prev: Option<u64>,
    max: u64,
    min: u64,
    total: u64,
    count: u64,
}

impl RecvClock {
    /// A count for a device whose timestamps have `mask` valid bits.
    pub fn new(mask: u64) -> Self {
        RecvClock {
            mask,
            prev: None,
            max: 0,
            // ibv_rc_pingpong's starting minimum.
            min: 0xffff_ffff,
            total: 0,
            count: 0,
        }
    }

    /// A receive completed at `ts`.
    pub fn receive(&mut self, ts: u64) {
        if let Some(prev) = self.prev {
            let delta = if ts >= prev {
                ts - prev
            } else {
                self.mask
                    .wrapping_sub(prev)
                    .wrapping_add(ts)
                    .wrapping_add(1)
            };
            self.max = self.max.max(delta);
            self.min = self.min.min(delta);
            self.total = self.total.wrapping_add(delta);
            self.count += 1;
        }
        self.prev = Some(ts);
    }

    /// The lines `ibv_rc_pingpong -t` prints after the run; none before two receives.
    pub fn lines(&self) -> Vec<String> {
        if self.count == 0 {
            return Vec::new();
        }
        vec![
            format!("Max receive completion clock cycles = {}", self.max),
            format!("Min receive completion clock cycles = {}", self.min),
            format!(
                "Average receive completion clock cycles = {:.6}",
                self.total as f64 / self.count as f64
            ),
        ]
    }
}

/// rdma-core's `-c` of `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong` and
/// `ibv_srq_pingpong`, for their twins to flatten into their options and copy into
/// [`PingpongArgs::validate`].
#[derive(Debug, Clone, Args)]
pub struct ChkArg {
    /// Validate the received buffer: the client stamps the first byte of every page, and
    /// the server prints "invalid data in page N" for each page without the stamp
    #[arg(short = 'c', long = "chk")]
    pub chk: bool,
}

/// How a side waits for completions: spinning on its CQ, or (`-e`) sleeping on the CQ's
/// completion channel.
struct Waiter {
    cq: Arc<CompletionQueue>,
    /// `-t`: each completion's timestamp is read into `stamps`.
    timestamps: bool,
    /// The timestamps of the completions the last `wait` returned (`-t` only).
    stamps: [u64; 2],
    /// The CQ claimed once for the whole run, so its polls take no claim each.
    polls: ClaimedCq,
    channel: Option<Arc<CompletionChannel>>,
    stall: Duration,
    /// The run's transport and `-n`, which the stall message names.
    transport: QpType,
    iters: u64,
}

impl Waiter {
    /// Creates the CQ (extended with `-N`) and, with `-e`, its channel, armed.
    fn new(
        ctx: &Arc<DeviceContext>,
        cqe: u32,
        args: &PingpongArgs,
        transport: QpType,
    ) -> Result<Self, CliError> {
        let channel = if args.events {
            Some(ctx.create_comp_channel().map_err(CliError::run)?)
        } else {
            None
        };
        let mut builder = ctx.create_cq_builder();
        builder.cqe(cqe);
        if let Some(ch) = &channel {
            builder.channel(ch);
        }
        let timestamps = args.memory.timestamps;
        if timestamps {
            builder.wc_flags(WcFlagsEx::default_ex() | WcFlagsEx::COMPLETION_TIMESTAMP);
        }
        let cq = if args.new_send || timestamps {
            builder.build_ex()
        } else {
            builder.build()
        }
        .map_err(CliError::run)?;
        if channel.is_some() {
            cq.req_notify(false).map_err(CliError::run)?;
        }
        Ok(Waiter {
            polls: cq.claim().map_err(CliError::run)?,
            cq,
            timestamps,
            stamps: [0; 2],
            channel,
            stall: Duration::from_secs(args.stall_timeout),
            transport,
            iters: args.iters,
        })
    }

    /// Waits until at least one completion is in `wcs` and returns how many. Polls before
    /// every sleep and re-arms after every event, so none is missed. Fails when nothing
    /// comes for the stall timeout; `progress` says how far the run got.
    fn wait(
        &mut self,
        wcs: &mut [WorkCompletion],
        progress: &dyn Fn() -> String,
    ) -> Result<usize, CliError> {
        let started = Instant::now();
        let stall = self.stall;
        let (transport, iters) = (self.transport, self.iters);
        let stalled = || CliError::run(stall_message(stall, &progress(), transport, iters));
        loop {
            let n = if self.timestamps {
                self.poll_stamped(wcs)?
            } else {
                self.polls.poll_into(wcs).map_err(CliError::run)?
            };
            if n > 0 {
                return Ok(n);
            }
            let left = self.stall.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(stalled());
            }
            match &self.channel {
                Some(ch) => match ch.get_cq_event(Some(left)) {
                    Ok(cq) => cq.req_notify(false).map_err(CliError::run)?,
                    Err(EventError::Timeout { .. }) => return Err(stalled()),
                    Err(e) => return Err(CliError::run(e)),
                },
                None => std::hint::spin_loop(),
            }
        }
    }
}

impl Waiter {
    /// Polls up to `wcs.len()` (at most 2) completions with their timestamps into `stamps`.
    fn poll_stamped(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, CliError> {
        let mut poller = self.polls.poll().map_err(CliError::run)?;
        let mut n = 0;
        while n < wcs.len().min(self.stamps.len()) {
            match poller.next_completion().map_err(CliError::run)? {
                Some(wc) => {
                    wcs[n] = wc;
                    self.stamps[n] = poller.completion_timestamp().unwrap_or(0);
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }
}

/// Why a side of a `transport` run of `iters` exchanges that waited `stall` for a completion
/// gives up, after `progress`: only the causes that transport can have. A peer with a
/// smaller `-n` is done early on every transport; a message that does not fit the peer's
/// receive buffer fails both sides on RC but is lost on UC and UD, as is one the link drops.
fn stall_message(stall: Duration, progress: &str, transport: QpType, iters: u64) -> String {
    let lost = match transport {
        QpType::Uc => {
            ", or our message was lost (UC resends nothing, and drops a message longer than \
             the peer's -s)"
        }
        QpType::Ud => {
            ", or our message was dropped (UD resends nothing, and drops a message longer \
             than the peer's receive buffer)"
        }
        _ => "",
    };
    let same = match transport {
        QpType::Uc | QpType::Ud => "the same -n and the same message size (-s)",
        _ => "the same -n",
    };
    format!(
        "no completion for {} s after {progress} of -n {iters}: the peer stopped (with a \
         smaller -n it is done already), is unreachable{lost}; check the peer's output, and \
         that both sides use {same}",
        stall.as_secs()
    )
}

/// Checks a completion of the ping-pong: a failure, or a message of another size than
/// `-s` (`payload_len`: the received bytes without any GRH), ends the run with its likely
/// cause. rdma-core's endpoint line does not carry the size, so two sides with different
/// `-s` meet here: the smaller side's receive fails (or, on UD, the message is dropped),
/// the larger side's send fails, or it receives short messages.
fn check_completion(wc: &WorkCompletion, size: u32, payload_len: u32) -> Result<(), CliError> {
    if let Err(e) = wc.ok() {
        return Err(CliError::run(match e.status {
            WcStatus::LocLenErr
            | WcStatus::LocQpOpErr
            | WcStatus::RemInvReqErr
            | WcStatus::RemOpErr => format!("{e} (this side runs with -s {size})"),
            _ => e.to_string(),
        }));
    }
    if wc.wr_id() == RECV_WRID && wc.opcode() == WcOpcode::Recv && payload_len != size {
        return Err(CliError::run(format!(
            "received a {payload_len}-byte message where this side expects {size} (-s {size}): \
             the peer runs with another message size; run both sides with the same -s"
        )));
    }
    Ok(())
}

/// What the rest of the buffer holds, as in rdma-core's rc, uc and ud programs.
const FILL: u8 = 0x7b;

/// What `ibv_srq_pingpong`'s buffer holds: zeros, which is also `-c`'s stamp, so its server
/// finds every page stamped whether the client ran with `-c` or not.
const SRQ_FILL: u8 = 0;

/// What `-c` writes to the first byte of every page of a client's buffer, and what the
/// server checks there after the run. rdma-core's programs compute it as
/// `i / page_size % sizeof(char)`, which is 0 for every page; the buffer around it holds
/// [`FILL`], so a page whose message never arrived keeps 0x7b there.
const STAMP: u8 = 0;

/// `-c` on the client: stamps the first byte of every `page`-byte page of `buf`.
pub fn stamp_pages(buf: &mut [u8], page: usize) {
    for byte in buf.iter_mut().step_by(page.max(1)) {
        *byte = STAMP;
    }
}

/// `-c` on the server: the pages of `buf` whose first byte is not the client's stamp.
pub fn invalid_pages(buf: &[u8], page: usize) -> Vec<usize> {
    buf.iter()
        .step_by(page.max(1))
        .enumerate()
        .filter(|&(_, &b)| b != STAMP)
        .map(|(i, _)| i)
        .collect()
}

const SEND_WRID: u64 = 1;
const RECV_WRID: u64 = 2;

impl PingpongArgs {
    /// How long each step of the TCP exchange may wait for the peer: `--stall-timeout`.
    pub fn exchange_timeout(&self) -> Duration {
        Duration::from_secs(self.stall_timeout)
    }

    /// Checks what clap cannot: the MTU value and the depth.
    pub fn check(&self) -> Result<Mtu, CliError> {
        if self.rx_depth == 0 || self.iters == 0 || self.size == 0 {
            return Err(CliError::run("-r, -n and -s must be at least 1"));
        }
        Mtu::from_bytes(self.mtu).ok_or_else(|| {
            CliError::run(format!(
                "-m {} is not a path MTU: use 256, 512, 1024, 2048 or 4096",
                self.mtu
            ))
        })
    }
}

/// A pseudo-random 24-bit starting PSN, different per process and run.
fn random_psn() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id().rotate_left(16)).wrapping_mul(0x9e37_79b1) >> 8
}

fn print_endpoint(which: &str, ep: &Endpoint) {
    let gid = std::net::Ipv6Addr::from(*ep.gid.as_bytes());
    println!(
        "  {which:<16}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {gid}",
        ep.lid, ep.qp_num, ep.psn
    );
}

/// The resources of one side.
/// What the ping-pong loop needs of a side, whatever its transport.
trait PingSide {
    /// Posts the next message.
    fn post_send(&mut self) -> Result<(), CliError>;
    /// Posts `n` more receives.
    fn post_recvs(&mut self, n: u32) -> Result<(), CliError>;
    /// Waits until at least one completion is in `wcs` ([`Waiter::wait`]).
    fn wait(
        &mut self,
        wcs: &mut [WorkCompletion],
        progress: &dyn Fn() -> String,
    ) -> Result<usize, CliError>;
    /// `-t`: the timestamp of the `i`-th completion the last wait returned.
    fn stamp(&mut self, i: usize) -> u64;
    /// The message bytes of a receive that wrote `byte_len` bytes (UD's include the GRH).
    fn payload_len(&self, byte_len: u32) -> u32 {
        byte_len
    }
    /// `-t`: a receive completed at device time `ts`.
    fn received_at(&mut self, _ts: u64) {}
}

struct Side {
    qp: QueuePair,
    waiter: Waiter,
    buf: RegisteredBuffer,
    size: u32,
    inline: bool,
    /// With `-j`: the device memory that holds the message instead of `buf` (which then only
    /// stages what is copied in and out), and the zero-based region over it.
    dm: Option<DmBuffer>,
    /// `-t`'s count of the clock between receives.
    clock: RecvClock,
}

/// `-j`'s message buffer: `size` bytes of device memory and the region over it.
struct DmBuffer {
    dm: DeviceMemory,
    mr: Arc<MemoryRegion>,
}

impl Side {
    /// The message's scatter/gather entry: the first `size` bytes of the device memory's
    /// region (zero-based, so at address 0) with `-j`, of `buf` otherwise.
    fn message_sge(&self, which: &str) -> Result<Sge, CliError> {
        let size = self.size as usize;
        match &self.dm {
            Some(d) => d.mr.sge(0..size),
            None => self.buf.sge(0..size),
        }
        .ok_or_else(|| CliError::run(format!("the {which} buffer is smaller than -s")))
    }
}

/// `-j`, as `ibv_rc_pingpong` sets it up: the device must have device memory, at least
/// `size` bytes of it; the region over it is zero-based. Fails with rdma-core's words.
fn open_dm(
    ctx: &Arc<DeviceContext>,
    pd: &Arc<sideway::ProtectionDomain>,
    size: usize,
) -> Result<DmBuffer, CliError> {
    let attr = ctx
        .query_device()
        .map_err(|e| CliError::run(format!("Couldn't query device for its features: {e}")))?;
    let max = attr.max_dm_size();
    if max == 0 {
        return Err(CliError::run(format!(
            "Device doesn't support dm allocation ({} has no device memory: max_dm_size is 0)",
            ctx.name()
        )));
    }
    if max < size as u64 {
        return Err(CliError::run(format!(
            "Device memory is insufficient ({} has {max} bytes of device memory, -s asks for \
             {size})",
            ctx.name()
        )));
    }
    let dm = ctx
        .alloc_dm(size, 0)
        .map_err(|e| CliError::run(format!("Dev mem allocation failed: {e}")))?;
    let mr = pd
        .reg_dm_mr(&dm, 0, size, AccessFlags::LOCAL_WRITE)
        .map_err(|e| CliError::run(format!("Couldn't register MR: {e}")))?;
    Ok(DmBuffer { dm, mr })
}

impl PingSide for Side {
    fn wait(
        &mut self,
        wcs: &mut [WorkCompletion],
        progress: &dyn Fn() -> String,
    ) -> Result<usize, CliError> {
        self.waiter.wait(wcs, progress)
    }

    fn stamp(&mut self, i: usize) -> u64 {
        self.waiter.stamps[i]
    }

    fn received_at(&mut self, ts: u64) {
        self.clock.receive(ts);
    }

    fn post_recvs(&mut self, n: u32) -> Result<(), CliError> {
        let sge = self.message_sge("receive")?;
        let mut guard = self.qp.start_post_recv();
        for _ in 0..n {
            guard.recv(RECV_WRID, &[sge]);
        }
        guard.post().map_err(CliError::run)
    }

    fn post_send(&mut self) -> Result<(), CliError> {
        let size = self.size as usize;
        let sge = self.message_sge("send")?;
        let mut guard = self.qp.start_post_send();
        if self.inline {
            let data = self
                .buf
                .inline(0..size)
                .ok_or_else(|| CliError::run("the send buffer is smaller than -s"))?;
            guard.wr(SEND_WRID, SendFlags::SIGNALED).send(data);
        } else {
            guard.wr(SEND_WRID, SendFlags::SIGNALED).send(sge);
        }
        guard.post().map_err(CliError::run)
    }
}

fn open_side(
    ctx: &Arc<DeviceContext>,
    args: &PingpongArgs,
    qp_type: QpType,
) -> Result<Side, CliError> {
    let pd = ctx.alloc_pd().map_err(CliError::run)?;
    let ts_mask = check_device(ctx, &args.memory, RC_ODP)?;
    let buf = register_buffer(&pd, args.size as usize, &args.memory, FILL)?;
    let dm = if args.use_dm {
        Some(open_dm(ctx, &pd, args.size as usize)?)
    } else {
        None
    };
    let waiter = Waiter::new(ctx, args.rx_depth + 1, args, qp_type)?;
    let cq = Arc::clone(&waiter.cq);
    let mut qp_builder = pd.create_qp_builder();
    qp_builder
        .qp_type(qp_type)
        .send_cq(&cq)
        .recv_cq(&cq)
        .max_send_wr(1)
        .max_recv_wr(args.rx_depth)
        .max_send_sge(1)
        .max_recv_sge(1);
    let qp = if args.new_send {
        qp_builder.build_ex()
    } else {
        qp_builder.build()
    }
    .map_err(CliError::run)?;
    // Inline data is copied from host memory: not with the message in device memory.
    let inline = qp.cap().max_inline_data >= args.size && dm.is_none();
    Ok(Side {
        qp,
        waiter,
        buf,
        size: args.size,
        inline,
        dm,
        clock: RecvClock::new(ts_mask),
    })
}

/// Runs one side of an RC or UC pingpong (server when `args.server` is `None`) and prints
/// what rdma-core's programs print.
pub fn run_connected(args: &PingpongArgs, qp_type: QpType) -> Result<(), CliError> {
    let mtu = args.check()?;
    let ctx = sideway::open_device(args.ib_dev.as_deref())?;
    let port = ctx.query_port(args.ib_port)?;
    if port.link_layer() == sideway::device::LinkLayer::Ethernet && args.gid_idx.is_none() {
        return Err(CliError::run(
            "this port is RoCE (Ethernet), which needs a GID: pass -g with a GID index \
             (show_gids lists them)",
        ));
    }
    let mut side = open_side(&ctx, args, qp_type)?;
    let psn = random_psn();
    let mut opts = ConnectOptions::new();
    opts.port_num(args.ib_port)
        .path_mtu(mtu)
        .sq_psn(psn)
        .sl(args.sl)
        .qp_access_flags(AccessFlags::empty());
    if let Some(g) = args.gid_idx {
        opts.gid_index(g);
    }
    let gid = match args.gid_idx {
        Some(g) => ctx.query_gid(args.ib_port, g)?.gid,
        None => Gid::ZERO,
    };
    let local = Endpoint {
        lid: port.lid(),
        qp_num: side.qp.qp_num(),
        psn,
        gid,
    };
    print_endpoint("local address:", &local);

    let remote = match &args.server {
        Some(host) => {
            let remote =
                exchange::client_exchange(host, args.port, &local, args.exchange_timeout())
                    .map_err(CliError::run)?;
            side.qp.connect(&opts, &remote).map_err(CliError::run)?;
            side.post_recvs(args.rx_depth)?;
            remote
        }
        None => {
            exchange::server_exchange(args.port, &local, args.exchange_timeout(), |peer| {
                // The receives must be up before the client learns our endpoint.
                side.qp
                    .connect(&opts, peer)
                    .map_err(CliError::run)
                    .and_then(|()| side.post_recvs(args.rx_depth))
                    .map_err(|e| e.to_string().into())
            })
            .map_err(CliError::run)?
        }
    };
    print_endpoint("remote address:", &remote);

    // The stride of -c's stamps, as in rdma-core's programs.
    let page = sideway::memory_region::page_size();
    if args.validate && args.server.is_some() {
        stamp_buffer(&mut side.buf, 0, page)?;
    }
    if let (Some(d), true) = (side.dm.as_mut(), args.server.is_some()) {
        // The client's message goes out of device memory: what buf holds (rdma-core's fill
        // and -c's stamps) is copied there first. The server's is whatever the peer sends.
        let bytes = side.buf.to_vec(0..side.buf.len()).map_err(CliError::run)?;
        d.dm.copy_to(0, &bytes)
            .map_err(|e| CliError::run(format!("Copy to dm buffer failed: {e}")))?;
    }
    let start = Instant::now();
    exchange(&mut side, args)?;
    let elapsed = start.elapsed();
    report(args, elapsed)?;
    for line in side.clock.lines() {
        println!("{line}");
    }
    if args.validate && args.server.is_none() {
        if let Some(d) = &side.dm {
            // With -j the messages landed in device memory. As rdma-core's programs: a line
            // per bad page, and the exit status unchanged.
            let mut bytes = side.buf.to_vec(0..side.buf.len()).map_err(CliError::run)?;
            d.dm.copy_from(0, &mut bytes)
                .map_err(|e| CliError::run(format!("Copy from DM buffer failed: {e}")))?;
            for n in invalid_pages(&bytes, page) {
                println!("invalid data in page {n}");
            }
        } else {
            report_invalid_pages(&side.buf, 0, page)?;
        }
    }
    Ok(())
}

/// The measured loop, as rdma-core's programs run it (RC, UC and UD alike).
fn exchange(side: &mut impl PingSide, args: &PingpongArgs) -> Result<(), CliError> {
    let is_client = args.server.is_some();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut routs = args.rx_depth;
    // Bits of SEND_WRID/RECV_WRID still outstanding before the next send may go.
    let mut pending = RECV_WRID;
    if is_client {
        side.post_send()?;
        pending |= SEND_WRID;
    }
    let mut wcs = [WorkCompletion::default(); 2];
    while rcnt < args.iters || scnt < args.iters {
        let n = side.wait(&mut wcs, &|| format!("{scnt} sends and {rcnt} receives"))?;
        for (i, wc) in wcs[..n].iter().enumerate() {
            if let Err(e) = check_completion(wc, args.size, side.payload_len(wc.byte_len())) {
                if wc.wr_id() == RECV_WRID && wc.ok().is_ok() && scnt < args.iters {
                    // A short message: the peer runs with a smaller -s and waits for our
                    // reply. Send it (ours is longer, so the peer's receive fails and it
                    // names -s too, as two rdma-core programs do) before giving up; else the
                    // peer would wait for it until its stall timeout, or forever.
                    answer_once(side, pending & !RECV_WRID);
                }
                return Err(e);
            }
            match (wc.wr_id(), wc.opcode()) {
                (SEND_WRID, _) => scnt += 1,
                (RECV_WRID, WcOpcode::Recv) => {
                    if args.memory.timestamps {
                        let ts = side.stamp(i);
                        side.received_at(ts);
                    }
                    rcnt += 1;
                    routs -= 1;
                    if routs <= 1 {
                        side.post_recvs(args.rx_depth - routs)?;
                        routs = args.rx_depth;
                    }
                }
                (id, op) => {
                    return Err(CliError::run(format!(
                        "completion with unexpected wr_id {id} ({op:?})"
                    )))
                }
            }
            pending &= !wc.wr_id();
            if scnt < args.iters && pending == 0 {
                side.post_send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    Ok(())
}

/// Sends the one reply a peer waits for before this side gives up on a size mismatch, and
/// waits (at most the stall timeout) for its completion, so that the message leaves before
/// the queue pair is destroyed. `pending` holds SEND_WRID while a send of ours is still in
/// flight: the peer then gets that one instead. Whatever fails here is dropped: the caller
/// reports the mismatch.
fn answer_once(side: &mut impl PingSide, pending: u64) {
    if pending & SEND_WRID == 0 && side.post_send().is_err() {
        return;
    }
    let mut wcs = [WorkCompletion::default(); 2];
    while let Ok(n) = side.wait(&mut wcs, &|| "the reply to a short message".to_owned()) {
        if wcs[..n].iter().any(|wc| wc.wr_id() == SEND_WRID) {
            return;
        }
    }
}

/// The Q_Key both sides of a UD pingpong use, as `ibv_ud_pingpong` does.
pub const UD_QKEY: u32 = 0x1111_1111;

/// Opens the device and checks the port as every variant does: RoCE needs `-g`.
fn open_checked(args: &PingpongArgs) -> Result<(Arc<DeviceContext>, Gid, u16), CliError> {
    let ctx = sideway::open_device(args.ib_dev.as_deref())?;
    let port = ctx.query_port(args.ib_port)?;
    if port.link_layer() == sideway::device::LinkLayer::Ethernet && args.gid_idx.is_none() {
        return Err(CliError::run(
            "this port is RoCE (Ethernet), which needs a GID: pass -g with a GID index \
             (show_gids lists them)",
        ));
    }
    let gid = match args.gid_idx {
        Some(g) => ctx.query_gid(args.ib_port, g)?.gid,
        None => Gid::ZERO,
    };
    Ok((ctx, gid, port.lid()))
}

/// The UD side: a QP, its address handle for the peer, and one buffer with GRH room in
/// front (receives land at 0, sends go from [`GRH_LEN`]).
struct UdSide {
    qp: QueuePair,
    waiter: Waiter,
    buf: RegisteredBuffer,
    ah: Option<Arc<AddressHandle>>,
    remote_qpn: u32,
    size: usize,
    inline: bool,
}

impl PingSide for UdSide {
    fn wait(
        &mut self,
        wcs: &mut [WorkCompletion],
        progress: &dyn Fn() -> String,
    ) -> Result<usize, CliError> {
        self.waiter.wait(wcs, progress)
    }

    fn stamp(&mut self, i: usize) -> u64 {
        self.waiter.stamps[i]
    }

    fn payload_len(&self, byte_len: u32) -> u32 {
        // GRH_LEN is 40.
        byte_len.saturating_sub(GRH_LEN as u32)
    }

    fn post_recvs(&mut self, n: u32) -> Result<(), CliError> {
        let sge = self
            .buf
            .sge(0..GRH_LEN + self.size)
            .ok_or_else(|| CliError::run("the receive buffer is smaller than -s + 40"))?;
        let mut guard = self.qp.start_post_recv();
        for _ in 0..n {
            guard.recv(RECV_WRID, &[sge]);
        }
        guard.post().map_err(CliError::run)
    }

    fn post_send(&mut self) -> Result<(), CliError> {
        let ah = self
            .ah
            .as_ref()
            .ok_or_else(|| CliError::run("no address handle for the peer yet"))?;
        let data = GRH_LEN..GRH_LEN + self.size;
        let mut guard = self.qp.start_post_send();
        let wr = guard
            .wr(SEND_WRID, SendFlags::SIGNALED)
            .ud_addr(ah, self.remote_qpn, UD_QKEY);
        if self.inline {
            let bytes = self
                .buf
                .inline(data)
                .ok_or_else(|| CliError::run("the send buffer is smaller than -s + 40"))?;
            wr.send(bytes);
        } else {
            let sge = self
                .buf
                .sge(data)
                .ok_or_else(|| CliError::run("the send buffer is smaller than -s + 40"))?;
            wr.send(sge);
        }
        guard.post().map_err(CliError::run)
    }
}

impl UdSide {
    /// Readies the QP (Init, RTR, RTS with the Q_Key) and builds the address handle that
    /// reaches `remote`: global when the peer sent a GID.
    fn connect(
        &mut self,
        args: &PingpongArgs,
        psn: u32,
        remote: &Endpoint,
    ) -> Result<(), CliError> {
        let mut opts = ConnectOptions::new();
        opts.port_num(args.ib_port).sq_psn(psn).qkey(UD_QKEY);
        self.qp.connect(&opts, remote).map_err(CliError::run)?;
        let mut av = AddressVector::new();
        av.set_dlid(remote.lid)
            .set_sl(args.sl)
            .set_port_num(args.ib_port);
        if !remote.gid.is_zero() {
            av.set_is_global(true)
                .set_dgid(remote.gid)
                .set_sgid_index(args.gid_idx.unwrap_or(0))
                .set_hop_limit(1);
        }
        self.ah = Some(self.qp.pd().create_ah(&av).map_err(CliError::run)?);
        self.remote_qpn = remote.qp_num;
        Ok(())
    }
}

/// Runs one side of a UD pingpong (server when `args.server` is `None`), as
/// `ibv_ud_pingpong` does: Q_Key 0x11111111, messages of at most the port's active MTU.
/// A size the user did not give (`size_given` false) shrinks to the MTU; one they gave
/// that is larger is an error.
pub fn run_ud(args: &PingpongArgs, size_given: bool) -> Result<(), CliError> {
    args.check()?;
    let (ctx, gid, lid) = open_checked(args)?;
    let mtu = ctx
        .query_port(args.ib_port)?
        .active_mtu()
        .bytes()
        .unwrap_or(256);
    let mut args = args.clone();
    if args.size > mtu {
        if size_given {
            return Err(CliError::run(format!(
                "requested size {} is larger than the port's MTU ({mtu})",
                args.size
            )));
        }
        args.size = mtu;
    }
    let args = &args;
    let size = args.size as usize;
    let pd = ctx.alloc_pd().map_err(CliError::run)?;
    let buf = register_buffer(&pd, GRH_LEN + size, &args.memory, FILL)?;
    let waiter = Waiter::new(&ctx, args.rx_depth + 1, args, QpType::Ud)?;
    let mut qp_builder = pd.create_qp_builder();
    qp_builder
        .qp_type(QpType::Ud)
        .send_cq(&waiter.cq)
        .recv_cq(&waiter.cq)
        .max_send_wr(1)
        .max_recv_wr(args.rx_depth)
        .max_send_sge(1)
        .max_recv_sge(1);
    let qp = if args.new_send {
        qp_builder.build_ex()
    } else {
        qp_builder.build()
    }
    .map_err(CliError::run)?;
    let inline = qp.cap().max_inline_data >= args.size;
    let mut side = UdSide {
        qp,
        waiter,
        buf,
        ah: None,
        remote_qpn: 0,
        size,
        inline,
    };
    let psn = random_psn();
    let local = Endpoint {
        lid,
        qp_num: side.qp.qp_num(),
        psn,
        gid,
    };
    print_ud_endpoint("local address:", &local);
    let remote = match &args.server {
        Some(host) => {
            let remote =
                exchange::client_exchange(host, args.port, &local, args.exchange_timeout())
                    .map_err(CliError::run)?;
            side.connect(args, psn, &remote)?;
            side.post_recvs(args.rx_depth)?;
            remote
        }
        None => exchange::server_exchange(args.port, &local, args.exchange_timeout(), |peer| {
            side.connect(args, psn, peer)
                .and_then(|()| side.post_recvs(args.rx_depth))
                .map_err(|e| e.to_string().into())
        })
        .map_err(CliError::run)?,
    };
    print_ud_endpoint("remote address:", &remote);

    // -c: as ibv_ud_pingpong, the stamps sit in the message, after the GRH room.
    let page = sideway::memory_region::page_size();
    if args.validate && args.server.is_some() {
        stamp_buffer(&mut side.buf, GRH_LEN, page)?;
    }
    let start = Instant::now();
    exchange(&mut side, args)?;
    report(args, start.elapsed())?;
    if args.validate && args.server.is_none() {
        report_invalid_pages(&side.buf, GRH_LEN, page)?;
    }
    Ok(())
}

/// `-c` on the client: stamps the first byte of every page of the message, which starts at
/// `offset` of `buf`. Copied out and back: the device may write the buffer (receives are
/// posted).
fn stamp_buffer(buf: &mut RegisteredBuffer, offset: usize, page: usize) -> Result<(), CliError> {
    let mut bytes = buf.to_vec(offset..buf.len()).map_err(CliError::run)?;
    stamp_pages(&mut bytes, page);
    buf.write_at(offset, &bytes).map_err(CliError::run)
}

/// `-c` on the server, after the run: a line per page of the message (from `offset` of
/// `buf`) without the client's stamp, as rdma-core's programs print them (the exit status
/// stays 0).
fn report_invalid_pages(
    buf: &RegisteredBuffer,
    offset: usize,
    page: usize,
) -> Result<(), CliError> {
    let bytes = buf.to_vec(offset..buf.len()).map_err(CliError::run)?;
    let mut out = io::stdout().lock();
    for n in invalid_pages(&bytes, page) {
        writeln!(out, "invalid data in page {n}")?;
    }
    Ok(())
}

/// `ibv_ud_pingpong` separates the PSN and the GID with a colon.
fn print_ud_endpoint(which: &str, ep: &Endpoint) {
    let gid = std::net::Ipv6Addr::from(*ep.gid.as_bytes());
    println!(
        "  {which:<16}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}: GID {gid}",
        ep.lid, ep.qp_num, ep.psn
    );
}

/// The SRQ side: `num_qp` RC QPs on one CQ, all receiving from one SRQ.
struct SrqSide {
    qps: Vec<QueuePair>,
    srq: Arc<SharedReceiveQueue>,
    waiter: Waiter,
    buf: RegisteredBuffer,
    size: usize,
    inline: bool,
}

impl SrqSide {
    fn post_recvs(&self, n: u32) -> Result<(), CliError> {
        let sge = self
            .buf
            .sge(0..self.size)
            .ok_or_else(|| CliError::run("the receive buffer is smaller than -s"))?;
        let mut guard = self.srq.start_post_recv();
        for _ in 0..n {
            guard.recv(RECV_WRID, &[sge]);
        }
        guard.post().map_err(CliError::run)
    }

    fn post_send(&mut self, i: usize) -> Result<(), CliError> {
        let size = self.size;
        let sge = self
            .buf
            .sge(0..size)
            .ok_or_else(|| CliError::run("the send buffer is smaller than -s"))?;
        let inline = self.inline;
        let data = self
            .buf
            .inline(0..size)
            .ok_or_else(|| CliError::run("the send buffer is smaller than -s"))?;
        let mut guard = self.qps[i].start_post_send();
        if inline {
            guard.wr(SEND_WRID, SendFlags::SIGNALED).send(data);
        } else {
            guard.wr(SEND_WRID, SendFlags::SIGNALED).send(sge);
        }
        guard.post().map_err(CliError::run)
    }
}

/// How many endpoint lines `ibv_srq_pingpong` sends and reads, whatever its `-q`: the
/// first `-q` are the QPs', the rest all zero (observed on rdma-core 56).
pub const SRQ_WIRE_LINES: usize = 256;

/// The endpoints of the peer's QPs among the `SRQ_WIRE_LINES` lines it sent (the first
/// ones; the rest are all zero, QP number 0 included), one for each of this side's `n_qp`.
/// A peer with another `-q` sent fewer or more: that ends the run here, with both counts,
/// rather than as a QP modify error about QP number 0 or a stall.
fn srq_peer_endpoints(wire: &[Endpoint], n_qp: usize) -> Result<Vec<Endpoint>, CliError> {
    let sent = wire.iter().take_while(|ep| ep.qp_num != 0).count();
    if sent != n_qp {
        let fewer = if sent < n_qp { "fewer" } else { "more" };
        return Err(CliError::run(format!(
            "the peer sent {sent} QP endpoints, {fewer} than this side's {n_qp} (-q {n_qp}): \
             it runs with -q {sent}; both sides need the same -q"
        )));
    }
    Ok(wire[..n_qp].to_vec())
}

/// Runs one side of an SRQ pingpong (server when `args.server` is `None`), as
/// `ibv_srq_pingpong` does: `num_qp` RC QPs receiving from one SRQ of `rx_depth`
/// receives, one endpoint line per QP each way, `iters` exchanges in all.
pub fn run_srq(args: &PingpongArgs, num_qp: u32) -> Result<(), CliError> {
    let mtu = args.check()?;
    if num_qp == 0 {
        return Err(CliError::run("-q must be at least 1"));
    }
    if num_qp > args.rx_depth {
        return Err(CliError::run(format!(
            "rx_depth {} is too small for {num_qp} QPs: each QP needs at least one receive",
            args.rx_depth
        )));
    }
    let (ctx, gid, lid) = open_checked(args)?;
    let size = args.size as usize;
    // As ibv_srq_pingpong: the device's ODP check comes before anything is made.
    check_device(&ctx, &args.memory, SRQ_ODP)?;
    let pd = ctx.alloc_pd().map_err(CliError::run)?;
    let buf = register_buffer(&pd, size, &args.memory, SRQ_FILL)?;
    let waiter = Waiter::new(&ctx, args.rx_depth + num_qp, args, QpType::Rc)?;
    let srq = pd
        .create_srq_builder()
        .max_wr(args.rx_depth)
        .max_sge(1)
        .build()
        .map_err(CliError::run)?;
    let mut qps = Vec::with_capacity(num_qp as usize);
    for _ in 0..num_qp {
        let mut b = pd.create_qp_builder();
        b.send_cq(&waiter.cq)
            .recv_cq(&waiter.cq)
            .srq(&srq)
            .max_send_wr(1)
            .max_recv_wr(1)
            .max_send_sge(1)
            .max_recv_sge(1);
        let qp = if args.new_send {
            b.build_ex()
        } else {
            b.build()
        }
        .map_err(CliError::run)?;
        qps.push(qp);
    }
    let inline = qps[0].cap().max_inline_data >= args.size;
    let mut side = SrqSide {
        qps,
        srq,
        waiter,
        buf,
        size,
        inline,
    };
    // Receives first: the peer may send as soon as it has our endpoints.
    side.post_recvs(args.rx_depth)?;
    let local: Vec<Endpoint> = side
        .qps
        .iter()
        .map(|qp| Endpoint {
            lid,
            qp_num: qp.qp_num(),
            psn: random_psn(),
            gid,
        })
        .collect();
    for ep in &local {
        print_endpoint("local address:", ep);
    }
    let mut opts = ConnectOptions::new();
    opts.port_num(args.ib_port)
        .path_mtu(mtu)
        .sl(args.sl)
        .qp_access_flags(AccessFlags::empty());
    if let Some(g) = args.gid_idx {
        opts.gid_index(g);
    }
    let n_qp = side.qps.len();
    let connect_all = |qps: &[QueuePair], remote: &[Endpoint]| -> Result<(), CliError> {
        for ((qp, me), peer) in qps.iter().zip(&local).zip(remote) {
            let mut o = opts;
            o.sq_psn(me.psn);
            qp.connect(&o, peer).map_err(CliError::run)?;
        }
        Ok(())
    };
    // ibv_srq_pingpong always trades SRQ_WIRE_LINES lines each way, the unused ones zero.
    let mut wire_local: Vec<_> = local.clone();
    wire_local.resize(SRQ_WIRE_LINES.max(local.len()), Endpoint::default());
    let remote: Vec<Endpoint> = match &args.server {
        Some(host) => {
            let remote = exchange::client_exchange_many(
                host,
                args.port,
                &wire_local,
                args.exchange_timeout(),
            )
            .map_err(CliError::run)?;
            let remote = srq_peer_endpoints(&remote, n_qp)?;
            connect_all(&side.qps, &remote)?;
            remote
        }
        None => {
            // A peer with another -q still gets our endpoints before this side fails: its
            // side can then end too (ibv_srq_pingpong's client waits for them forever).
            let mut other_q = None;
            let remote = exchange::server_exchange_many(
                args.port,
                &wire_local,
                args.exchange_timeout(),
                |peer| match srq_peer_endpoints(peer, n_qp) {
                    Ok(peer) => connect_all(&side.qps, &peer).map_err(|e| e.to_string().into()),
                    Err(e) => {
                        other_q = Some(e);
                        Ok(())
                    }
                },
            );
            // The mismatch is the news, whether or not the peer said "done" after it.
            if let Some(e) = other_q {
                return Err(e);
            }
            remote
                .map_err(CliError::run)?
                .iter()
                .take(n_qp)
                .copied()
                .collect()
        }
    };
    for ep in &remote {
        print_endpoint("remote address:", ep);
    }

    let page = sideway::memory_region::page_size();
    if args.validate && args.server.is_some() {
        stamp_buffer(&mut side.buf, 0, page)?;
    }
    let start = Instant::now();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut routs = args.rx_depth;
    let mut pending = vec![RECV_WRID; n_qp];
    if args.server.is_some() {
        for (i, p) in pending.iter_mut().enumerate() {
            side.post_send(i)?;
            *p |= SEND_WRID;
        }
    }
    let mut wcs = vec![WorkCompletion::default(); 2 * n_qp];
    while rcnt < args.iters || scnt < args.iters {
        let n = side
            .waiter
            .wait(&mut wcs, &|| format!("{scnt} sends and {rcnt} receives"))?;
        for wc in &wcs[..n] {
            check_completion(wc, args.size, wc.byte_len())?;
            let i = side
                .qps
                .iter()
                .position(|qp| qp.qp_num() == wc.qp_num())
                .ok_or_else(|| {
                    CliError::run(format!("completion for unknown QP {:#x}", wc.qp_num()))
                })?;
            match wc.wr_id() {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    rcnt += 1;
                    routs -= 1;
                    if routs <= num_qp {
                        side.post_recvs(args.rx_depth - routs)?;
                        routs = args.rx_depth;
                    }
                }
                id => {
                    return Err(CliError::run(format!(
                        "completion with unexpected wr_id {id}"
                    )))
                }
            }
            pending[i] &= !wc.wr_id();
            if scnt < args.iters && pending[i] == 0 {
                side.post_send(i)?;
                pending[i] = RECV_WRID | SEND_WRID;
            }
        }
    }
    report(args, start.elapsed())?;
    if args.validate && args.server.is_none() {
        report_invalid_pages(&side.buf, 0, page)?;
    }
    Ok(())
}

fn report(args: &PingpongArgs, elapsed: Duration) -> Result<(), CliError> {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = u64::from(args.size) * args.iters * 2;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    )?;
    writeln!(
        out,
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        args.iters,
        usec / 1e6,
        usec / args.iters as f64
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_stamps_and_checks_the_first_byte_of_every_page() {
        let mut buf = vec![FILL; 10_000];
        assert_eq!(invalid_pages(&buf, 4096), [0, 1, 2]);
        stamp_pages(&mut buf, 4096);
        assert_eq!((buf[0], buf[4096], buf[8192]), (STAMP, STAMP, STAMP));
        assert_eq!((buf[1], buf[4095], buf[9999]), (FILL, FILL, FILL));
        assert!(invalid_pages(&buf, 4096).is_empty());
        buf[4096] = FILL;
        assert_eq!(invalid_pages(&buf, 4096), [1]);
        assert!(sideway::memory_region::page_size() >= 4096);
    }

    fn completion(status: u32, wr_id: u64, byte_len: u32) -> WorkCompletion {
        WorkCompletion::from(sideway::sys::ibv_wc {
            status,
            wr_id,
            byte_len,
            opcode: sideway::sys::ibv_wc_opcode::IBV_WC_RECV,
            ..Default::default()
        })
    }

    /// A side whose completions are scripted, for [`exchange`]'s logic.
    struct ScriptedSide {
        /// What each wait returns, in order; an empty script stalls.
        script: std::collections::VecDeque<WorkCompletion>,
        sends: u32,
    }

    impl PingSide for ScriptedSide {
        fn post_send(&mut self) -> Result<(), CliError> {
            self.sends += 1;
            Ok(())
        }
        fn post_recvs(&mut self, _n: u32) -> Result<(), CliError> {
            Ok(())
        }
        fn wait(
            &mut self,
            wcs: &mut [WorkCompletion],
            progress: &dyn Fn() -> String,
        ) -> Result<usize, CliError> {
            match self.script.pop_front() {
                Some(wc) => {
                    wcs[0] = wc;
                    Ok(1)
                }
                None => Err(CliError::run(stall_message(
                    Duration::from_secs(30),
                    &progress(),
                    QpType::Rc,
                    1000,
                ))),
            }
        }
        fn stamp(&mut self, _i: usize) -> u64 {
            0
        }
    }

    fn args(server: Option<&str>, size: u32) -> PingpongArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            common: PingpongArgs,
        }
        let size = size.to_string();
        let mut argv = vec!["pingpong", "-s", &size];
        argv.extend(server);
        <Cli as clap::Parser>::parse_from(argv).common
    }

    #[test]
    fn a_larger_server_answers_a_short_message_before_it_fails() {
        use sideway::sys::ibv_wc_status::*;
        // The peer's receive fails on our longer reply, which fails our send on RC.
        let send_done = WorkCompletion::from(sideway::sys::ibv_wc {
            status: IBV_WC_REM_INV_REQ_ERR,
            wr_id: SEND_WRID,
            opcode: sideway::sys::ibv_wc_opcode::IBV_WC_SEND,
            ..Default::default()
        });
        let mut side = ScriptedSide {
            script: [completion(IBV_WC_SUCCESS, RECV_WRID, 1024), send_done].into(),
            sends: 0,
        };
        let err = exchange(&mut side, &args(None, 4096))
            .unwrap_err()
            .to_string();
        assert!(err.contains("-s 4096"), "{err}");
        // The peer got its one reply (so that its receive fails too), and this side waited
        // for that send's completion before giving up.
        assert_eq!(side.sends, 1);
        assert!(side.script.is_empty());

        // A client's first send is still in flight when the short reply comes: no second.
        let mut side = ScriptedSide {
            script: [completion(IBV_WC_SUCCESS, RECV_WRID, 1024), send_done].into(),
            sends: 0,
        };
        let err = exchange(&mut side, &args(Some("host"), 4096))
            .unwrap_err()
            .to_string();
        assert!(err.contains("-s 4096"), "{err}");
        assert_eq!(side.sends, 1);
        assert!(side.script.is_empty());
    }

    #[test]
    fn a_different_srq_q_is_named_before_any_qp_is_connected() {
        let ep = |qp_num| Endpoint {
            qp_num,
            ..Endpoint::default()
        };
        // As ibv_srq_pingpong sends them: its -q lines, then zeros up to SRQ_WIRE_LINES.
        let wire = |q: u32| {
            let mut v: Vec<_> = (1..=q).map(|n| ep(0x100 + n)).collect();
            v.resize(SRQ_WIRE_LINES, Endpoint::default());
            v
        };
        let got = srq_peer_endpoints(&wire(4), 4).unwrap();
        assert_eq!(
            got.iter().map(|e| e.qp_num).collect::<Vec<_>>(),
            [0x101, 0x102, 0x103, 0x104]
        );
        let err = srq_peer_endpoints(&wire(2), 4).unwrap_err().to_string();
        assert_eq!(
            err,
            "the peer sent 2 QP endpoints, fewer than this side's 4 (-q 4): it runs with -q 2; \
             both sides need the same -q"
        );
        let err = srq_peer_endpoints(&wire(8), 4).unwrap_err().to_string();
        assert!(
            err.contains("sent 8 QP endpoints, more than this side's 4 (-q 4)"),
            "{err}"
        );
    }

    #[test]
    fn a_size_mismatch_is_named_from_the_completion() {
        use sideway::sys::ibv_wc_status::*;
        // The peer's -s is smaller: its messages arrive short.
        let short = completion(IBV_WC_SUCCESS, RECV_WRID, 1024);
        let err = check_completion(&short, 4096, 1024)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "received a 1024-byte message where this side expects 4096 (-s 4096): the peer \
             runs with another message size; run both sides with the same -s"
        );
        assert!(check_completion(&completion(IBV_WC_SUCCESS, RECV_WRID, 4096), 4096, 4096).is_ok());
        // The peer's -s is larger: the receive or the send fails.
        for status in [
            IBV_WC_LOC_LEN_ERR,
            IBV_WC_LOC_QP_OP_ERR,
            IBV_WC_REM_INV_REQ_ERR,
            IBV_WC_REM_OP_ERR,
        ] {
            let err = check_completion(&completion(status, SEND_WRID, 0), 1024, 0)
                .unwrap_err()
                .to_string();
            assert!(
                err.ends_with(
                    "check that both sides use the same message size (this side runs with -s 1024)"
                ),
                "{err}"
            );
        }
        let err = check_completion(&completion(IBV_WC_RETRY_EXC_ERR, SEND_WRID, 0), 1024, 0)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("-s"), "{err}");
    }

    #[test]
    fn the_stall_message_names_what_the_transport_can_have_and_n() {
        let progress = "500 sends and 500 receives";
        let rc = stall_message(Duration::from_secs(30), progress, QpType::Rc, 1000);
        assert_eq!(
            rc,
            "no completion for 30 s after 500 sends and 500 receives of -n 1000: the peer \
             stopped (with a smaller -n it is done already), is unreachable; check the peer's \
             output, and that both sides use the same -n"
        );
        let uc = stall_message(Duration::from_secs(30), progress, QpType::Uc, 1000);
        assert!(
            uc.contains("of -n 1000") && uc.contains("UC resends nothing"),
            "{uc}"
        );
        assert!(
            uc.ends_with("the same -n and the same message size (-s)"),
            "{uc}"
        );
        assert!(!uc.contains("UD"), "{uc}");
        let ud = stall_message(Duration::from_secs(30), progress, QpType::Ud, 1000);
        assert!(ud.contains("UD resends nothing"), "{ud}");
        assert!(
            ud.ends_with("the same -n and the same message size (-s)"),
            "{ud}"
        );
    }

    #[test]
    fn receive_clock_counts_as_ibv_rc_pingpong_does() {
        let mut c = RecvClock::new(0xffff);
        assert!(c.lines().is_empty());
        c.receive(100);
        assert!(
            c.lines().is_empty(),
            "the first receive only starts the count"
        );
        c.receive(130);
        c.receive(140);
        // Deltas 30, 10, 65380, and 32 across the wrap at the mask (0xfff0 -> 0x10).
        c.receive(0xfff0);
        c.receive(0x10);
        assert_eq!(
            c.lines(),
            [
                "Max receive completion clock cycles = 65380",
                "Min receive completion clock cycles = 10",
                "Average receive completion clock cycles = 16363.000000",
            ]
        );
    }

    #[test]
    fn memory_flags_follow_ibv_rc_pingpong() {
        let odp = |odp| OdpArg { odp };
        let more = |implicit_odp, prefetch, ts| RcMemoryArgs {
            implicit_odp,
            prefetch,
            ts,
        };
        assert_eq!(
            MemoryFlags::rc(&odp(false), &more(false, false, false), false).unwrap(),
            MemoryFlags::default()
        );
        let f = MemoryFlags::rc(&odp(false), &more(true, true, true), false).unwrap();
        assert!(
            f.odp && f.implicit_odp && f.prefetch && f.timestamps,
            "-O implies -o"
        );
        let e = MemoryFlags::rc(&odp(false), &more(false, true, false), false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "prefetch is valid only with on-demand memory region"
        );
        assert!(MemoryFlags::rc(&odp(true), &more(false, true, false), false).is_ok());
        // -j with -o or -O is refused; -j alone is not.
        for (o, implicit) in [(true, false), (false, true)] {
            let e = MemoryFlags::rc(&odp(o), &more(implicit, false, false), true).unwrap_err();
            assert_eq!(e.to_string(), "DM memory region can't be on demand");
        }
        assert!(MemoryFlags::rc(&odp(false), &more(false, false, false), true).is_ok());
        assert!(RC_ODP.rc == OdpTransportCaps::SEND | OdpTransportCaps::RECV);
        assert!(SRQ_ODP.rc == OdpTransportCaps::SEND | OdpTransportCaps::SRQ_RECV);
    }

    #[test]
    fn psn_fits_24_bits() {
        for _ in 0..100 {
            assert!(random_psn() <= 0x00ff_ffff);
        }
    }
}
