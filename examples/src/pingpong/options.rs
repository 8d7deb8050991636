//! The options and flags every pingpong shares: rdma-core's letters and defaults, the
//! memory options and the device checks they need.

use super::*;

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
pub(super) fn check_device(
    ctx: &DeviceContext,
    flags: &MemoryFlags,
    need: OdpNeed,
) -> Result<u64, CliError> {
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
pub(super) fn register_buffer(
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
                sideway::odp::AdviseError::Verb { source, .. } => {
                    source.raw_os_error().unwrap_or(-1)
                }
                _ => -1,
            };
            eprintln!("Couldn't prefetch MR({code}). Continue anyway ({e})");
        }
    }
    buf.fill(0..buf.len(), fill).map_err(CliError::run)?;
    Ok(buf)
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
