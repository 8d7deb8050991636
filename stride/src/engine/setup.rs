//! One side's verbs resources: the device and its port, the GID, the protection domain, the
//! completion queues, per QP a queue pair, and the QPs' registered test buffers (in the memory
//! the run chose: host, huge pages or GPU; one region for all QPs, each in its own slice, or
//! one per QP with `--mr-per-qp`); and connecting them to the peer's.
//!
//! Each QP's slice holds two halves of `half` bytes: the first is what this side sends,
//! writes from, or reads and fetches into; the second is what the peer's operations target
//! (its RDMA WRITEs land there, its READs read from there, its SENDs are received there).

use std::sync::Arc;
use std::time::Duration;

use sideway::address_handle::{AddressHandle, AddressVector, GRH_LEN};
use sideway::async_event::EventError;
use sideway::completion_channel::CompletionChannel;
use sideway::completion_queue::CompletionQueue;
use sideway::device::{DeviceAttr, DeviceContext, LinkLayer, Mtu, PortAttr};
use sideway::gid::Gid;
use sideway::memory_region::AccessFlags;
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::{
    ConnectOptions, Endpoint, QpAttrMask, QpType, QueuePair, SendData, SendOpsFlags,
};
use sideway::shared_receive_queue::SharedReceiveQueue;

use sideway::memory_region::Sge;

use super::dc::{av_to as dc_av, DcQps, DcRoles, DcSetup, DcStates};
use super::error::RunError;
use crate::buffer::{region_len, Memory, QpBuffer, QpBuffers};
use crate::cli::{AtomicType, Connection, Verb};
use crate::gid_select::{best_gid, GidCandidate};
use crate::oob::QpEndpoint;
use crate::params::{SideParams, TestParams};
use crate::preflight::{GidInfo, LinkKind, PortProfile};

/// The device, port and GID a side runs on.
#[derive(Debug)]
pub(crate) struct DeviceSide {
    pub(crate) ctx: Arc<DeviceContext>,
    pub(crate) port: u8,
    pub(crate) port_attr: PortAttr,
    pub(crate) dev_attr: DeviceAttr,
    /// The GID sent from; `None` on an InfiniBand port without `-x` (LID-routed).
    pub(crate) gid: Option<GidCandidate>,
    /// Whether the GID was chosen here rather than given with `-x`.
    pub(crate) gid_auto: bool,
}

impl DeviceSide {
    /// Opens the device and port, picks the GID, and checks that the sizes fit the port.
    pub(crate) fn open(side: &SideParams, params: &TestParams) -> Result<Self, RunError> {
        let ctx = sideway::open_device(side.device.as_deref())?;
        if params.connection == Connection::Dc {
            // Before any QP is made, and before a server waits for its client.
            super::dc::require_mlx5(&ctx)?;
        }
        let port = side.ib_port;
        let port_attr = ctx.query_port(port)?;
        let dev_attr = ctx.query_device()?;
        let largest = params.sizes.iter().copied().max().unwrap_or(0);
        let max_msg = u64::from(port_attr.max_msg_sz());
        if largest > max_msg {
            return Err(RunError::usage(format!(
                "a {largest}-byte message is larger than {} port {port} allows ({max_msg} bytes, \
                 its max_msg_sz): use a smaller -s",
                ctx.name()
            )));
        }
        if params.connection == Connection::Ud {
            let mtu = u64::from(port_attr.active_mtu().bytes().unwrap_or(256));
            if largest > mtu {
                return Err(RunError::usage(format!(
                    "a {largest}-byte message does not fit one UD datagram: {} port {port} has \
                     a {mtu}-byte MTU; use -s {mtu} or less (or -c RC)",
                    ctx.name()
                )));
            }
        }
        let slice = 2 * half_for(largest + GRH_LEN as u64);
        let qps = usize::try_from(params.qps).unwrap_or(usize::MAX);
        let region = region_len(params.mr_layout(), qps, slice).map_or(u64::MAX, |l| l as u64);
        if region > dev_attr.max_mr_size() {
            let what = if region == slice as u64 {
                format!("a {largest}-byte message needs a {region}-byte buffer")
            } else {
                format!(
                    "{qps} QPs of {slice} bytes (for {largest}-byte messages) need a \
                     {region}-byte memory region"
                )
            };
            let fix = if region == slice as u64 {
                "use a smaller -s"
            } else {
                "use --mr-per-qp (one region per QP), fewer QPs or a smaller -s"
            };
            return Err(RunError::usage(format!(
                "{what}, more than {} registers ({} bytes, its max_mr_size): {fix}",
                ctx.name(),
                dev_attr.max_mr_size()
            )));
        }
        let (gid, gid_auto) = match side.gid_index {
            Some(index) => {
                let entry = ctx.query_gid(port, index)?;
                let cand = GidCandidate {
                    index,
                    gid: entry.gid,
                    gid_type: entry.gid_type,
                };
                (Some(cand), false)
            }
            None if port_attr.link_layer() == LinkLayer::Ethernet => {
                let table: Vec<GidCandidate> = ctx
                    .query_gid_table()?
                    .into_iter()
                    .filter(|e| e.port == port)
                    .map(|e| GidCandidate {
                        index: e.index,
                        gid: e.gid,
                        gid_type: e.gid_type,
                    })
                    .collect();
                let best = best_gid(&table).ok_or_else(|| {
                    RunError::setup(format!(
                        "{} port {port} is RoCE but has no usable (non-zero) GID: give the \
                         network interface an IP address, or pass -x",
                        ctx.name()
                    ))
                })?;
                (Some(best), true)
            }
            None => (None, false),
        };
        Ok(DeviceSide {
            ctx,
            port,
            port_attr,
            dev_attr,
            gid,
            gid_auto,
        })
    }

    /// The device's name.
    pub(crate) fn name(&self) -> &str {
        self.ctx.name()
    }

    /// The port's link layer, as perftest's banner names it.
    pub(crate) fn link_type(&self) -> &'static str {
        match self.port_attr.link_layer() {
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Infiniband | LinkLayer::Unspecified => "IB",
            _ => "unknown",
        }
    }

    /// This side's port as the pre-flight diagnosis describes it to the peer. The GID table
    /// lists the port's usable entries; a device whose table cannot be read lists none (the
    /// diagnosis then only cannot suggest an index).
    pub(crate) fn profile(&self, role: &str) -> PortProfile {
        let table: Vec<GidInfo> = self
            .ctx
            .query_gid_table()
            .map(|t| {
                t.into_iter()
                    .filter(|e| e.port == self.port && !e.gid.is_zero())
                    .take(crate::preflight::MAX_GIDS)
                    .map(|e| {
                        GidInfo::of(&GidCandidate {
                            index: e.index,
                            gid: e.gid,
                            gid_type: e.gid_type,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        PortProfile {
            role: role.to_owned(),
            device: self.name().to_owned(),
            port: self.port,
            link: match self.port_attr.link_layer() {
                LinkLayer::Ethernet => LinkKind::Ethernet,
                LinkLayer::Infiniband | LinkLayer::Unspecified => LinkKind::InfiniBand,
                _ => LinkKind::Other,
            },
            active_mtu: self.port_attr.active_mtu().bytes().unwrap_or(0),
            gid: self.gid.as_ref().map(GidInfo::of),
            gid_from_x: !self.gid_auto,
            table,
        }
    }

    /// A line saying which GID is used and why.
    pub(crate) fn gid_line(&self) -> String {
        match (&self.gid, self.gid_auto) {
            (Some(g), true) => format!("{g}, chosen automatically (pass -x to choose)"),
            (Some(g), false) => format!("{g}, from -x"),
            (None, _) => "none: InfiniBand, LID-routed".to_owned(),
        }
    }
}

/// The size of each half of a QP's buffer for messages up to `largest` bytes: a whole number
/// of cache lines, so that the second half (an atomic's target) is 8-byte aligned.
pub(crate) fn half_for(largest: u64) -> usize {
    let largest = usize::try_from(largest).unwrap_or(usize::MAX);
    largest.max(8).div_ceil(64).saturating_mul(64)
}

/// Which verbs API a side posts and polls with: asked for on the command line (or perftest's
/// choice for the device), then what the device gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VerbsApi {
    /// Posting with `ibv_wr_*` on extended QPs (else `ibv_post_send` on classic ones).
    pub(crate) extended_qp: bool,
    /// Why: the option that chose, or "as perftest on this device".
    pub(crate) qp_why: &'static str,
    /// Polling with `ibv_start_poll` on extended CQs (else `ibv_poll_cq` on classic ones).
    pub(crate) extended_cq: bool,
    /// Why the QPs are classic although extended ones were asked for.
    pub(crate) qp_fallback: Option<String>,
    /// Why the CQs are classic although extended ones were asked for.
    pub(crate) cq_fallback: Option<String>,
}

/// The devices on which perftest posts through `ibv_wr_*` by default; on every other device
/// it sets its `--use_old_post_send` itself. Its list names the mlx5 family (Connect-IB,
/// ConnectX-4 and later, their VFs, BlueField 1 to 3), EFA, HNS and Yunsilicon's devices;
/// recognised here by vendor: Mellanox/NVIDIA (0x02c9) parts from Connect-IB (4113) on, and
/// Amazon (0x1d0f). HNS and Yunsilicon devices, whose IDs were not checked, post classic
/// unless `--use-wr-api` says otherwise.
pub(crate) fn perftest_posts_with_wr(vendor_id: u32, vendor_part_id: u32) -> bool {
    const MELLANOX: u32 = 0x02c9;
    const AMAZON: u32 = 0x1d0f;
    const CONNECT_IB: u32 = 4113;
    match vendor_id {
        MELLANOX => vendor_part_id >= CONNECT_IB,
        AMAZON => true,
        _ => false,
    }
}

impl VerbsApi {
    /// What this side's options ask for: perftest's choice for the device (`ibv_wr_*` posting
    /// on the devices where perftest uses it, [`perftest_posts_with_wr`], classic elsewhere;
    /// `ibv_poll_cq` polling) unless `--use-old-post-send`, `--use-wr-api` or
    /// `--extended-poll` says otherwise.
    pub(crate) fn from_side(side: &SideParams, dev: &DeviceSide) -> Self {
        let (extended_qp, qp_why) = match (side.use_old_post_send, side.use_wr_api) {
            (true, _) => (false, "--use-old-post-send"),
            (false, true) => (true, "--use-wr-api"),
            (false, false) => (
                perftest_posts_with_wr(dev.dev_attr.vendor_id(), dev.dev_attr.vendor_part_id()),
                "as perftest on this device",
            ),
        };
        VerbsApi {
            extended_qp,
            qp_why,
            extended_cq: side.extended_poll,
            qp_fallback: None,
            cq_fallback: None,
        }
    }

    /// How this side posts, as the banner and the JSON report say it.
    pub(crate) fn posting(&self) -> String {
        match (&self.qp_fallback, self.extended_qp) {
            (Some(why), _) => format!("ibv_post_send (classic QPs): {why}"),
            (None, true) => format!("ibv_wr_* (extended QPs, {})", self.qp_why),
            (None, false) => format!("ibv_post_send (classic QPs, {})", self.qp_why),
        }
    }

    /// How this side polls, likewise.
    pub(crate) fn polling(&self) -> String {
        match (&self.cq_fallback, self.extended_cq) {
            (Some(why), _) => format!("ibv_poll_cq (classic CQs): {why}"),
            (None, true) => "ibv_start_poll (extended CQs, --extended-poll)".to_owned(),
            (None, false) => "ibv_poll_cq (classic CQs)".to_owned(),
        }
    }
}

/// Whether a failed create verb means "this device has no such extended object", the one
/// failure that falls back to the classic verb (as perftest does): `EOPNOTSUPP`, or
/// `ENOSYS` from a library without the verb.
fn lacks_extended(source: &std::io::Error) -> bool {
    matches!(
        source.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
    )
}

/// The access key of this run's DC targets: drawn once per process (the peer learns it in
/// the exchange), so that a stray initiator of another run cannot reach them.
fn dc_key() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

/// The operations an extended QP of `params` posts: only those, as perftest asks, so that a
/// device that lacks an operation the run never uses still gives extended QPs.
fn send_ops(params: &TestParams) -> SendOpsFlags {
    match params.verb {
        Verb::Send => SendOpsFlags::SEND,
        Verb::Write => SendOpsFlags::RDMA_WRITE,
        Verb::Read => SendOpsFlags::RDMA_READ,
        Verb::Atomic => match params.atomic_type {
            AtomicType::FetchAndAdd => SendOpsFlags::ATOMIC_FETCH_AND_ADD,
            AtomicType::CmpAndSwap => SendOpsFlags::ATOMIC_CMP_AND_SWP,
        },
    }
}

/// One side's queue pairs and buffers.
pub(crate) struct Resources {
    /// The completion channel both CQs report to, with `-e`.
    pub(crate) events: Option<Arc<CompletionChannel>>,
    pub(crate) _pd: Arc<ProtectionDomain>,
    pub(crate) send_cq: Arc<CompletionQueue>,
    pub(crate) recv_cq: Arc<CompletionQueue>,
    pub(crate) qps: Vec<QueuePair>,
    /// Each QP's slice of registered memory.
    pub(crate) bufs: QpBuffers,
    pub(crate) psns: Vec<u32>,
    /// The peer's QPs, once exchanged.
    pub(crate) remotes: Vec<QpEndpoint>,
    /// UD: one address handle per QP, reaching the peer's QP of the same index.
    pub(crate) ahs: Vec<Arc<AddressHandle>>,
    /// Bytes in each half of a buffer.
    pub(crate) half: usize,
    /// Messages up to this size go inline (0: none; always 0 for GPU buffers, which the
    /// CPU cannot copy from).
    pub(crate) inline: u32,
    /// The verbs API the QPs and CQs were made for.
    pub(crate) api: VerbsApi,
    /// With `--use-srq`: the receive queue every QP shares. Receives posted there still
    /// carry (and point into the buffer of) a QP index, spread over the QPs. With `-c DC`:
    /// the queue the DC targets receive through.
    pub(crate) srq: Option<Arc<SharedReceiveQueue>>,
    /// With `-c DC`: the DC initiators and targets, in place of `qps` (which is empty then).
    pub(crate) dc: Option<DcQps>,
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resources")
            .field("qps", &self.qps.len())
            .field("half", &self.half)
            .field("inline", &self.inline)
            .finish()
    }
}

/// The receive requests' wr_id carries the QP index; sends carry it in the low 32 bits.
pub(crate) const QP_INDEX_MASK: u64 = 0xffff_ffff;

/// The Q_Key of UD QPs: `ConnectOptions`' default, the same on both sides.
pub(crate) const UD_QKEY: u32 = 0x1111_1111;

/// Refuses queue depths (`-t`, and `-r` when the side receives) over the device's most work
/// requests per queue.
fn check_queue_depths(
    dev: &DeviceSide,
    params: &TestParams,
    receives: bool,
) -> Result<(), RunError> {
    let max_wr = dev.dev_attr.max_qp_wr();
    if params.tx_depth > max_wr || (receives && params.rx_depth > max_wr) {
        return Err(RunError::usage(format!(
            "{} allows at most {max_wr} work requests per queue: lower -t or -r",
            dev.name()
        )));
    }
    Ok(())
}

/// A CQ of `cqe` entries, reporting to `events` (`-e`): extended when `api` asks for it,
/// classic on a device without extended CQs (`api` then says so, and why).
fn create_cq(
    dev: &DeviceSide,
    cqe: u32,
    events: Option<&Arc<CompletionChannel>>,
    api: &mut VerbsApi,
) -> Result<Arc<CompletionQueue>, RunError> {
    let mut b = dev.ctx.create_cq_builder();
    b.cqe(cqe);
    if let Some(channel) = events {
        b.channel(channel);
    }
    if !api.extended_cq {
        return Ok(b.build()?);
    }
    match b.build_ex() {
        Ok(cq) => Ok(cq),
        Err(e) => {
            let lacks = match &e {
                sideway::completion_queue::CompletionQueueError::Create { source, .. } => {
                    lacks_extended(source)
                }
                sideway::completion_queue::CompletionQueueError::MissingFunction { .. } => true,
                _ => false,
            };
            if !lacks {
                return Err(e.into());
            }
            api.extended_cq = false;
            api.cq_fallback = Some(format!("{} has no extended CQs ({e})", dev.name()));
            Ok(b.build()?)
        }
    }
}

/// The shared receive queue of `--use-srq` (SEND tests: `-r` receives per QP) or of DC
/// targets (`dc_targets`), if the side has one; refused over the device's most entries.
fn create_srq(
    dev: &DeviceSide,
    pd: &Arc<ProtectionDomain>,
    params: &TestParams,
    receives: bool,
    dc_targets: bool,
) -> Result<Option<Arc<SharedReceiveQueue>>, RunError> {
    if !((receives && params.use_srq) || dc_targets) {
        return Ok(None);
    }
    let qps_n = params.qps;
    let entries = if receives {
        params.rx_depth.saturating_mul(qps_n)
    } else {
        1
    };
    let most = dev.dev_attr.max_srq_wr();
    if entries > most {
        let why = if dc_targets { "-c DC" } else { "--use-srq" };
        return Err(RunError::usage(format!(
            "{why}: -r {} × -q {qps_n} = {entries} receives, more than {} allows in a \
             shared receive queue ({most}, its max_srq_wr): lower -r or -q",
            params.rx_depth,
            dev.name()
        )));
    }
    let mut b = pd.create_srq_builder();
    b.max_wr(entries).max_sge(1);
    Ok(Some(b.build()?))
}

/// What every RC, UC or UD QP of a side is made with.
struct QpSpec<'a> {
    dev: &'a DeviceSide,
    pd: &'a Arc<ProtectionDomain>,
    qp_type: QpType,
    send_cq: &'a Arc<CompletionQueue>,
    recv_cq: &'a Arc<CompletionQueue>,
    srq: Option<&'a Arc<SharedReceiveQueue>>,
    params: &'a TestParams,
    /// The side posts receives (SEND tests).
    receives: bool,
    inline_size: u32,
}

/// One QP of `spec`: extended when `api` asks for it; classic when the device has no
/// extended QPs, which the `first` QP finds out (`api` then says so, and why).
fn create_qp(spec: &QpSpec<'_>, api: &mut VerbsApi, first: bool) -> Result<QueuePair, RunError> {
    let QpSpec {
        dev,
        pd,
        qp_type,
        send_cq,
        recv_cq,
        srq,
        params,
        receives,
        inline_size,
    } = *spec;
    let mut qb = pd.create_qp_builder();
    qb.qp_type(qp_type)
        .send_cq(send_cq)
        .recv_cq(recv_cq)
        .max_send_wr(params.tx_depth)
        .max_recv_wr(if receives { params.rx_depth } else { 1 })
        .max_send_sge(1)
        .max_recv_sge(1)
        .max_inline_data(inline_size)
        .send_ops_flags(send_ops(params));
    if let Some(srq) = srq {
        qb.srq(srq);
    }
    let qp = if api.extended_qp {
        match qb.build_ex() {
            Ok(qp) => qp,
            Err(sideway::queue_pair::QueuePairError::Create { ref source, .. })
                if first && lacks_extended(source) =>
            {
                api.extended_qp = false;
                api.qp_fallback = Some(format!(
                    "{} has no extended QPs (ibv_create_qp_ex: {source})",
                    dev.name()
                ));
                qb.build()?
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        qb.build()?
    };
    Ok(qp)
}

impl Resources {
    /// Creates the CQs, QPs and buffers (in `memory`) for `params`, on the client's side
    /// (`is_client`) or the server's (which DC QPs a side holds depends on it).
    pub(crate) fn create(
        dev: &DeviceSide,
        memory: &Memory,
        params: &TestParams,
        mut api: VerbsApi,
        is_client: bool,
    ) -> Result<Self, RunError> {
        let dc_roles =
            (params.connection == Connection::Dc).then(|| DcRoles::of(params, is_client));
        let pd = dev.ctx.alloc_pd()?;
        let largest = params.sizes.iter().copied().max().unwrap_or(8);
        // A UD receive also takes the 40-byte GRH in front of the message.
        let ud_extra = if params.connection == Connection::Ud {
            GRH_LEN as u64
        } else {
            0
        };
        let half = half_for(largest + ud_extra);
        let qps_n = params.qps;
        let receives = params.verb == Verb::Send;
        check_queue_depths(dev, params, receives)?;
        let send_cqe = params.tx_depth.saturating_mul(qps_n).max(1);
        let recv_cqe = if receives {
            params.rx_depth.saturating_mul(qps_n)
        } else {
            1
        };
        let events = if params.events {
            Some(dev.ctx.create_comp_channel()?)
        } else {
            None
        };
        let send_cq = create_cq(dev, send_cqe, events.as_ref(), &mut api)?;
        let recv_cq = create_cq(dev, recv_cqe, events.as_ref(), &mut api)?;
        let qp_type = match params.connection {
            Connection::Rc => QpType::Rc,
            Connection::Uc => QpType::Uc,
            Connection::Ud => QpType::Ud,
            // Made by mlx5dv_create_qp below, not from this type.
            Connection::Dc => QpType::Driver,
        };
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        // DC targets receive through a shared receive queue, whatever the verb.
        let dc_targets = dc_roles.is_some_and(|r| r.targets);
        let srq = create_srq(dev, &pd, params, receives, dc_targets)?;
        let mut qps = Vec::new();
        let mut psns = Vec::new();
        // The parameter check refused -I with GPU buffers; this keeps the default at 0 too.
        let inline_size = if memory.is_host() {
            params.inline_size
        } else {
            0
        };
        let mut inline = inline_size;
        let dc = match dc_roles {
            Some(roles) => {
                let setup = DcSetup {
                    pd: &pd,
                    send_cq: &send_cq,
                    recv_cq: &recv_cq,
                    srq: srq.as_ref(),
                    qps: qps_n,
                    tx_depth: params.tx_depth,
                    send_ops: send_ops(params),
                    key: dc_key(),
                };
                // DC initiators post from registered memory only.
                inline = 0;
                psns = (0..qps_n).map(random_psn).collect();
                Some(DcQps::create(&setup, roles)?)
            }
            None => None,
        };
        let spec = QpSpec {
            dev,
            pd: &pd,
            qp_type,
            send_cq: &send_cq,
            recv_cq: &recv_cq,
            srq: srq.as_ref(),
            params,
            receives,
            inline_size,
        };
        for i in (0..qps_n).filter(|_| dc.is_none()) {
            let qp = create_qp(&spec, &mut api, i == 0)?;
            // The provider may round the inline size; never ask more than every QP gives.
            inline = inline.min(qp.cap().max_inline_data);
            qps.push(qp);
            psns.push(random_psn(i));
        }
        let n = usize::try_from(qps_n).unwrap_or(usize::MAX);
        let bufs = QpBuffers::allocate(memory, &pd, params.mr_layout(), n, 2 * half, access)?;
        Ok(Resources {
            events,
            _pd: pd,
            send_cq,
            recv_cq,
            qps,
            bufs,
            psns,
            remotes: Vec::new(),
            ahs: Vec::new(),
            half,
            inline,
            api,
            srq,
            dc,
        })
    }

    /// What the peer needs to know of our QPs.
    pub(crate) fn endpoints(&self, dev: &DeviceSide) -> Vec<QpEndpoint> {
        let gid = dev.gid.map_or([0; 16], |g| *g.gid.as_bytes());
        (0..self.bufs.qps())
            .zip(&self.psns)
            .map(|(q, &psn)| {
                let buf = self.bufs.qp(q);
                let (qpn, dc) = match &self.dc {
                    Some(dc) => dc.endpoint_of(q),
                    None => (self.qps.get(q).map_or(0, |qp| qp.qp_num()), None),
                };
                QpEndpoint {
                    lid: dev.port_attr.lid(),
                    qpn,
                    psn,
                    gid,
                    rkey: buf.rkey(),
                    addr: buf.addr(),
                    mtu: dev.port_attr.active_mtu().bytes().unwrap_or(1024),
                    dc,
                }
            })
            .collect()
    }

    /// Connects every QP to the peer's (Reset to RTS) with the path MTU `mtu`.
    pub(crate) fn connect(
        &mut self,
        dev: &DeviceSide,
        params: &TestParams,
        remotes: Vec<QpEndpoint>,
        mtu: Mtu,
    ) -> Result<(), RunError> {
        if remotes.len() != self.bufs.qps() {
            return Err(RunError::peer_invalid(format!(
                "the peer sent {} QP endpoints, this side has {} QPs",
                remotes.len(),
                self.bufs.qps()
            )));
        }
        let port = dev.port;
        let rd_atomic =
            |limit: u32| u8::try_from(params.outstanding.min(limit).max(1)).unwrap_or(u8::MAX);
        if let Some(dc) = &mut self.dc {
            if dev.gid.is_none() && params.traffic_class.is_some() {
                return Err(RunError::usage(
                    "--tclass sets the GRH's traffic class, and this InfiniBand port is \
                     LID-routed, without a GRH: pass -x to route by GID, or drop --tclass",
                ));
            }
            let sgid = dev.gid.map(|g| g.index);
            let tclass = params.traffic_class.unwrap_or(0);
            let own_gid = dev.gid.map_or(Gid::from_raw([0; 16]), |g| g.gid);
            let states = DcStates {
                port,
                mtu,
                local_av: dc_av(port, dev.port_attr.lid(), own_gid, sgid, tclass),
                sq_psn: self.psns.first().copied().unwrap_or(0),
                timeout: params.qp_timeout,
                retry_cnt: super::link::RETRY_CNT,
                max_rd_atomic: rd_atomic(dev.dev_attr.max_qp_init_rd_atom()),
            };
            dc.connect(&self._pd, &remotes, &states, |r| {
                dc_av(port, r.lid, Gid::from_raw(r.gid), sgid, tclass)
            })?;
            self.remotes = remotes;
            return Ok(());
        }
        for ((qp, remote), &psn) in self.qps.iter().zip(&remotes).zip(&self.psns) {
            let mut opts = ConnectOptions::new();
            opts.port_num(port)
                .path_mtu(mtu)
                .sq_psn(psn)
                .timeout(params.qp_timeout)
                .retry_cnt(super::link::RETRY_CNT)
                .max_rd_atomic(rd_atomic(dev.dev_attr.max_qp_init_rd_atom()))
                .max_dest_rd_atomic(rd_atomic(dev.dev_attr.max_qp_rd_atom()));
            if let Some(g) = dev.gid {
                opts.gid_index(g.index);
                if let Some(tc) = params.traffic_class {
                    opts.traffic_class(tc);
                }
            } else if params.traffic_class.is_some() {
                return Err(RunError::usage(
                    "--tclass sets the GRH's traffic class, and this InfiniBand port is \
                     LID-routed, without a GRH: pass -x to route by GID, or drop --tclass",
                ));
            }
            let peer = Endpoint {
                lid: remote.lid,
                qp_num: remote.qpn,
                psn: remote.psn,
                gid: Gid::from_raw(remote.gid),
            };
            qp.connect(&opts, &peer)?;
            if params.connection == Connection::Ud {
                let mut av = AddressVector::new();
                av.set_dlid(peer.lid).set_sl(0).set_port_num(port);
                if !peer.gid.is_zero() {
                    av.set_is_global(true)
                        .set_dgid(peer.gid)
                        .set_sgid_index(dev.gid.map_or(0, |g| g.index))
                        .set_hop_limit(64)
                        .set_traffic_class(params.traffic_class.unwrap_or(0));
                }
                self.ahs.push(self._pd.create_ah(&av)?);
            }
        }
        if params.connection == Connection::Ud {
            let largest = params.sizes.iter().copied().max().unwrap_or(0);
            let mtu_bytes = u64::from(mtu.bytes().unwrap_or(256));
            if largest > mtu_bytes {
                return Err(RunError::usage(format!(
                    "a {largest}-byte message does not fit one UD datagram on this path \
                     ({mtu_bytes}-byte MTU, the smaller of the two ports'): use -s {mtu_bytes} \
                     or less"
                )));
            }
        }
        self.remotes = remotes;
        Ok(())
    }

    /// The traffic class QP 0's path carries, read back from the QP (`ibv_query_qp`): what
    /// `--tclass` set, as the device took it. `None` for UD, whose path is in each address
    /// handle.
    pub(crate) fn read_traffic_class(&self) -> Result<Option<u8>, RunError> {
        match self.qps.first() {
            Some(qp) if qp.qp_type() != QpType::Ud => {
                let attr = qp
                    .query(QpAttrMask::AV)
                    .map_err(|e| RunError::setup(e.to_string()))?;
                Ok(Some(attr.ah_attr().traffic_class()))
            }
            _ => Ok(None),
        }
    }

    /// The length of each QP's slice of registered memory, the same on both sides: two halves.
    pub(crate) fn buffer_len(&self) -> u64 {
        u64::try_from(self.half).map_or(u64::MAX, |h| h.saturating_mul(2))
    }

    /// The receive entry of QP `q`: its buffer's second half.
    pub(crate) fn recv_sge(&self, q: usize) -> Sge {
        // The buffer is 2 * half bytes by construction.
        self.bufs
            .qp(q)
            .sge(self.half..2 * self.half)
            .expect("the buffer holds two halves")
    }

    /// Posts `n` receives on QP `q`.
    pub(crate) fn post_recvs(&mut self, q: usize, n: u32) -> Result<(), RunError> {
        let sge = self.recv_sge(q);
        if let Some(srq) = &self.srq {
            let mut guard = srq.start_post_recv();
            for _ in 0..n {
                guard.recv(q as u64, &[sge]);
            }
            guard.post()?;
            return Ok(());
        }
        let qp = self
            .qps
            .get_mut(q)
            .ok_or_else(|| RunError::new(format!("internal error: no receive queue for QP {q}")))?;
        let mut guard = qp.start_post_recv();
        for _ in 0..n {
            guard.recv(q as u64, &[sge]);
        }
        guard.post()?;
        Ok(())
    }

    /// `--staging`, before a size's run: copies every QP's second half (what the peer's READs
    /// and atomics read) from the GPU to the host memory the NIC serves them from. A
    /// one-sided operation gives its target no event to copy at, so its target is staged
    /// once per size, outside the measured time.
    pub(crate) fn stage_targets_from_gpu(&self) -> Result<(), RunError> {
        for q in 0..self.bufs.qps() {
            self.bufs.qp(q).stage_from_gpu(self.half..2 * self.half)?;
        }
        Ok(())
    }

    /// `--staging`, after a size's run: copies every QP's second half (where the peer's
    /// WRITEs and atomics landed) from host memory to the GPU.
    pub(crate) fn stage_targets_to_gpu(&self) -> Result<(), RunError> {
        for q in 0..self.bufs.qps() {
            self.bufs.qp(q).stage_to_gpu(self.half..2 * self.half)?;
        }
        Ok(())
    }

    /// Fills every QP's receive queue (send tests); with `-c DC`, the DC targets' shared
    /// queue on the side that has them.
    pub(crate) fn fill_receive_queues(&mut self, params: &TestParams) -> Result<(), RunError> {
        if params.verb != Verb::Send || (self.dc.is_some() && self.srq.is_none()) {
            return Ok(());
        }
        for q in 0..self.bufs.qps() {
            self.post_recvs(q, params.rx_depth)?;
        }
        Ok(())
    }

    /// Makes a ping-pong's next size start clean: clears the receive halves (the spin
    /// loops look for counter values there) and takes any receive completion a duration-mode
    /// run left behind, reposting its receive. Called after both sides met at a barrier,
    /// when nothing is in flight.
    pub(crate) fn reset_after_latency(&mut self) -> Result<(), RunError> {
        let half = self.half;
        for q in 0..self.bufs.qps() {
            self.bufs.qp_mut(q).fill(half..2 * half, 0)?;
        }
        let mut wcs = [sideway::completion_queue::WorkCompletion::default(); 16];
        loop {
            let got = self.recv_cq.poll_into(&mut wcs)?;
            if got == 0 {
                return Ok(());
            }
            for wc in &wcs[..got] {
                wc.ok()?;
                let q = (wc.wr_id() & QP_INDEX_MASK) as usize;
                self.post_recvs(q, 1)?;
            }
        }
    }
}

/// The local data of a work request for `size`-byte messages from `buf`: inline bytes when
/// the message fits the inline size (SEND and WRITE only), else an entry of the first half.
pub(crate) fn local_data<'a>(
    buf: QpBuffer<'a>,
    half: usize,
    inline: u32,
    size: u64,
    verb: Verb,
) -> SendData<'a> {
    let size = usize::try_from(size).unwrap_or(half).min(half);
    let inline_ok = matches!(verb, Verb::Send | Verb::Write) && size <= inline as usize;
    match buf.inline(0..size) {
        Some(bytes) if inline_ok => bytes,
        // size <= half, and the buffer holds two halves.
        _ => SendData::from(buf.sge(0..size).expect("size fits the first half")),
    }
}

/// Where one QP's operations land on the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RemoteTarget {
    /// The remote key of the peer's buffer.
    pub(crate) rkey: u32,
    /// The address of its second half, which this side's operations target.
    pub(crate) addr: u64,
    /// The peer's QP number (UD sends name it).
    pub(crate) qpn: u32,
}

/// The target of QP `q` in the peer's endpoints. The channel checked the list when it came
/// (one endpoint per QP, each buffer within the address space); this checks again rather
/// than index or add, so that no peer value can make the run panic.
pub(crate) fn remote_target(
    remotes: &[QpEndpoint],
    q: usize,
    half: usize,
) -> Result<RemoteTarget, RunError> {
    let ep = remotes.get(q).ok_or_else(|| {
        RunError::peer_invalid(format!(
            "the peer sent {} QP endpoints, but this run has more QPs (none for QP {q}): the \
             peer is broken or runs another test; run the same options on both sides",
            remotes.len()
        ))
    })?;
    let addr = u64::try_from(half)
        .ok()
        .and_then(|h| ep.addr.checked_add(h))
        .ok_or_else(|| {
            RunError::peer_invalid(format!(
                "the peer's QP {q} advertised its buffer at address {:#x}, too close to the end \
                 of the 64-bit address space for its {half}-byte halves: the peer is broken; \
                 run the same stride-perf version on both sides",
                ep.addr
            ))
        })?;
    Ok(RemoteTarget {
        rkey: ep.rkey,
        addr,
        qpn: ep.qpn,
    })
}

/// How long one sleep on the completion channel lasts before the loop looks around again.
const EVENT_NAP: Duration = Duration::from_millis(5);

/// `-e`: arms `cqs` and sleeps until one of them raises a completion event, or a short nap
/// passes (the loop then polls again: a completion that came between the loop's last poll and
/// the arming raises no event, and the loop's watchdog must run now and then).
pub(crate) fn sleep_on(
    channel: &CompletionChannel,
    cqs: &[&CompletionQueue],
) -> Result<(), RunError> {
    for cq in cqs {
        cq.req_notify(false)?;
    }
    match channel.get_cq_event(Some(EVENT_NAP)) {
        Ok(_) | Err(EventError::Timeout { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The path MTU: `-m` when given, else the smaller of the two ports' active MTUs.
pub(crate) fn path_mtu(params: &TestParams, ours: u32, theirs: u32) -> Result<Mtu, RunError> {
    // Whose number it is says what kind of failure a bad one is.
    let (bytes, whose, kind): (u32, &str, fn(String) -> RunError) = match params.mtu {
        // As perftest: never more than both ports' active MTU.
        Some(m) if Mtu::from_bytes(ours.min(theirs)).is_some() => {
            (m.min(ours).min(theirs), "-m", RunError::Usage)
        }
        Some(m) => (m, "-m", RunError::Usage),
        None if theirs < ours => (theirs, "the peer's active MTU", RunError::PeerInvalid),
        None => (ours, "this port's active MTU", RunError::Setup),
    };
    Mtu::from_bytes(bytes).ok_or_else(|| {
        kind(format!(
            "{whose} {bytes} is not a path MTU (256, 512, 1024, 2048 or 4096)"
        ))
    })
}

/// What the banner adds after the path MTU (`used` bytes) when it is not what `-m` asked:
/// the active MTU of a port (this side's or the peer's) is smaller.
pub(crate) fn mtu_note(asked: Option<u32>, used: u32) -> Option<String> {
    match asked {
        Some(m) if m != used => Some(format!(
            " (-m {m} asked: the smaller active MTU of the two ports is {used} B)"
        )),
        _ => None,
    }
}

/// A 24-bit starting PSN, different per process, QP and run.
fn random_psn(qp: u32) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id().rotate_left(16) ^ qp.wrapping_mul(0x85eb_ca6b))
        .wrapping_mul(0x9e37_79b1)
        >> 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_are_cache_lines() {
        assert_eq!(half_for(2), 64);
        assert_eq!(half_for(8), 64);
        assert_eq!(half_for(65), 128);
        assert_eq!(half_for(8 << 20), 8 << 20);
    }

    fn remote(addr: u64) -> QpEndpoint {
        QpEndpoint {
            lid: 0,
            qpn: 0x42,
            psn: 0,
            gid: [0; 16],
            rkey: 0x99,
            addr,
            mtu: 1024,
            dc: None,
        }
    }

    #[test]
    fn remote_targets_are_checked_not_indexed() {
        let remotes = [remote(0x1000), remote(u64::MAX - 63)];
        assert_eq!(
            remote_target(&remotes, 0, 64),
            Ok(RemoteTarget {
                rkey: 0x99,
                addr: 0x1040,
                qpn: 0x42
            })
        );
        let e = remote_target(&remotes, 1, 64).unwrap_err().to_string();
        assert!(
            e.contains("QP 1 advertised its buffer at address 0xffffffffffffffc0"),
            "{e}"
        );
        assert!(!e.contains("  "), "a message with a run of spaces: {e}");
        let e = remote_target(&remotes, 2, 64).unwrap_err().to_string();
        assert!(e.contains("the peer sent 2 QP endpoints"), "{e}");
        assert!(!e.contains("  "), "a message with a run of spaces: {e}");
        assert!(remote_target(&[], 0, 64).is_err());
    }

    #[test]
    fn perftest_posts_with_wr_on_mlx5_and_efa_only() {
        assert!(perftest_posts_with_wr(0x02c9, 4123), "ConnectX-6");
        assert!(perftest_posts_with_wr(0x02c9, 41692), "BlueField-3");
        assert!(!perftest_posts_with_wr(0x02c9, 4103), "ConnectX-3 (mlx4)");
        assert!(perftest_posts_with_wr(0x1d0f, 0xefa1), "EFA");
        assert!(!perftest_posts_with_wr(0, 0), "rxe");
        assert!(!perftest_posts_with_wr(0x8086, 0x1593), "irdma");
    }

    #[test]
    fn a_path_mtu_that_is_not_one_names_whose_it_is() {
        let p = crate::params::from_args(&["write", "bw"]).unwrap();
        assert_eq!(path_mtu(&p, 4096, 1024).unwrap(), Mtu::Mtu1024);
        let e = path_mtu(&p, 1024, 0).unwrap_err();
        assert!(matches!(e, RunError::PeerInvalid(_)), "{e:?}");
        assert!(
            e.to_string().starts_with("the peer's active MTU 0 is not"),
            "{e}"
        );
        let e = path_mtu(&p, 100, 1024).unwrap_err();
        assert!(matches!(e, RunError::Setup(_)), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("this port's active MTU 100 is not"),
            "{e}"
        );
        let p = crate::params::from_args(&["write", "bw", "-m", "512"]).unwrap();
        assert_eq!(path_mtu(&p, 1024, 0).unwrap(), Mtu::Mtu512);
    }

    #[test]
    fn a_path_mtu_above_a_ports_active_mtu_is_lowered_and_said() {
        let p = crate::params::from_args(&["write", "bw", "-m", "4096"]).unwrap();
        assert_eq!(path_mtu(&p, 1024, 4096).unwrap(), Mtu::Mtu1024);
        assert_eq!(path_mtu(&p, 4096, 2048).unwrap(), Mtu::Mtu2048);
        assert_eq!(path_mtu(&p, 4096, 4096).unwrap(), Mtu::Mtu4096);
        assert_eq!(
            mtu_note(Some(4096), 1024).as_deref(),
            Some(" (-m 4096 asked: the smaller active MTU of the two ports is 1024 B)")
        );
        assert_eq!(mtu_note(Some(1024), 1024), None);
        assert_eq!(mtu_note(None, 1024), None);
    }

    #[test]
    fn psns_fit_24_bits_and_differ_per_qp() {
        for q in 0..64 {
            assert!(random_psn(q) <= 0xff_ffff);
        }
        assert_ne!(random_psn(0), random_psn(1));
    }
}
