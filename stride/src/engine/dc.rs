//! `-c DC`: the Dynamically Connected transport of mlx5 devices, through sideway's
//! `dv::mlx5` module.
//!
//! A side that posts the measured operations has a DC initiator (DCI) per QP index; a side
//! that those operations reach has a DC target (DCT) per QP index, receiving SENDs through
//! a shared receive queue (a DCT has no receive queue of its own). The exchange sends, per
//! QP index, the DCT's number and its access key (in [`QpEndpoint::dc`], next to the
//! buffer's address and key as for the other transports); every request a DCI posts names
//! its target with them and an address handle to the peer's port
//! (`mlx5dv_wr_set_dc_addr`). As perftest's `-c DC`: every verb, bandwidth and latency.
//!
//! Which side holds what ([`DcRoles`]): in a bandwidth test the client posts (DCIs) and the
//! server is reached (DCTs), both sides hold both with `-b`; in a latency test both sides
//! post for WRITE and SEND (both hold both) and only the client for READ and atomics.
//!
//! Any device that is not an mlx5 one is refused before a QP is made ([`require_mlx5`]):
//! with the device, its driver, and the need for an mlx5 NIC in the message.
//!
//! **Not yet run on mlx5 hardware.** This project has no mlx5 NIC: the creation
//! (`mlx5dv_create_qp` with the DC attributes) and the posting order are checked against a
//! test double of `libmlx5.so.1` (stride/tests/dc_fake_mlx5.rs), the state changes'
//! attribute masks against rdma-core's own DC tests (unit tests here), and the refusal on
//! SoftRoCE in the guest (scripts/e2e/stride-errors.sh).

use std::sync::Arc;

use sideway::address_handle::{AddressHandle, AddressVector};
use sideway::completion_queue::CompletionQueue;
use sideway::device::Mtu;
use sideway::dv::mlx5::{DcAddress, DcInitiator, DcTarget, Mlx5};
use sideway::dv::{self, DvError};
use sideway::gid::Gid;
use sideway::memory_region::{AccessFlags, Sge};
use sideway::protection_domain::ProtectionDomain;
#[cfg(test)]
use sideway::queue_pair::QpAttrMask;
use sideway::queue_pair::{QpState, QueuePairAttribute, SendFlags, SendOpsFlags};
use sideway::shared_receive_queue::SharedReceiveQueue;

use super::error::RunError;
use crate::cli::{Test, Verb};
use crate::oob::{DcEndpoint, QpEndpoint};
use crate::params::TestParams;

/// What a non-mlx5 device is told.
pub(crate) const DC_NEED: &str = "-c DC (the Dynamically Connected transport) needs an mlx5 \
                                  NIC (ConnectX-4 or later); use -c RC, UC or UD on this device";

/// The RNR NAK timer a DCT asks initiators to wait (12: 0.64 ms), as for the RC QPs.
const MIN_RNR_TIMER: u8 = 12;

/// RNR retries of a DCI: a DCT's receives come from a shared queue that the target keeps
/// full, so an RNR NAK is a brief shortage; 6 retries, never the endless 7.
const RNR_RETRY: u8 = 6;

/// Refuses any device that is not an mlx5 one (or a system without `libmlx5.so.1`), with a
/// message that names the device, its driver and what DC needs. Called before any QP is
/// made.
pub(crate) fn require_mlx5(ctx: &sideway::device::DeviceContext) -> Result<(), RunError> {
    dv::require::<Mlx5>(ctx, DC_NEED).map_err(|e| match e {
        // Names the device, its driver and DC_NEED.
        DvError::WrongProvider { .. } => RunError::setup(e.to_string()),
        // Names the library and the package to install.
        other => RunError::setup(format!("{other}; {DC_NEED}")),
    })
}

/// Which DC QPs one side holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DcRoles {
    /// A DCI per QP index: this side posts the measured operations.
    pub(crate) initiators: bool,
    /// A DCT per QP index: the peer's operations reach this side.
    pub(crate) targets: bool,
}

impl DcRoles {
    /// The roles of the client (`is_client`) or the server in the test `params` describe.
    pub(crate) fn of(params: &TestParams, is_client: bool) -> Self {
        let both_post = match params.test {
            Test::Bw => params.bidirectional,
            Test::Lat => matches!(params.verb, Verb::Write | Verb::Send),
        };
        DcRoles {
            initiators: is_client || both_post,
            targets: !is_client || both_post,
        }
    }
}

/// Where one DCI's requests go: an address handle to the peer's port, the peer's DCT and
/// its key.
#[derive(Debug, Clone)]
pub(crate) struct DcDest {
    ah: Arc<AddressHandle>,
    dctn: u32,
    key: u64,
}

/// One side's DC QPs, per QP index.
#[derive(Debug)]
pub(crate) struct DcQps {
    /// The initiators (empty on a side that does not post).
    pub(crate) dcis: Vec<DcInitiator>,
    /// The targets (empty on a side nothing reaches).
    pub(crate) dcts: Vec<DcTarget>,
    /// Each DCI's destination, once connected.
    dests: Vec<DcDest>,
}

/// The CQs, SRQ and sizes the DC QPs are made with.
pub(crate) struct DcSetup<'r> {
    pub(crate) pd: &'r Arc<ProtectionDomain>,
    pub(crate) send_cq: &'r Arc<CompletionQueue>,
    pub(crate) recv_cq: &'r Arc<CompletionQueue>,
    /// The SRQ the DCTs receive through (required when the roles have targets).
    pub(crate) srq: Option<&'r Arc<SharedReceiveQueue>>,
    /// QP indices.
    pub(crate) qps: u32,
    /// Work requests a DCI keeps in flight (-t).
    pub(crate) tx_depth: u32,
    /// The operations the DCIs post.
    pub(crate) send_ops: SendOpsFlags,
    /// The access key of this side's DCTs, which the peer learns in the exchange.
    pub(crate) key: u64,
}

impl DcQps {
    /// Creates the DCIs and DCTs `roles` ask for (`mlx5dv_create_qp`).
    pub(crate) fn create(s: &DcSetup<'_>, roles: DcRoles) -> Result<Self, RunError> {
        let dc_err = |e: DvError| RunError::setup(e.to_string());
        let mut dcis = Vec::new();
        let mut dcts = Vec::new();
        for _ in 0..s.qps {
            if roles.initiators {
                let mut b = s.pd.create_qp_builder();
                b.send_cq(s.send_cq)
                    .recv_cq(s.recv_cq)
                    .max_send_wr(s.tx_depth)
                    .max_recv_wr(0)
                    .max_send_sge(1)
                    .max_recv_sge(0)
                    .send_ops_flags(s.send_ops);
                dcis.push(b.build_mlx5_dci().map_err(dc_err)?);
            }
            if roles.targets {
                let srq = s.srq.ok_or_else(|| {
                    RunError::new("internal error: DC targets need the shared receive queue")
                })?;
                let mut b = s.pd.create_qp_builder();
                b.send_cq(s.send_cq)
                    .recv_cq(s.recv_cq)
                    .max_send_wr(1)
                    .max_recv_wr(0)
                    .max_send_sge(1)
                    .max_recv_sge(0)
                    .srq(srq);
                dcts.push(b.build_mlx5_dct(s.key).map_err(dc_err)?);
            }
        }
        Ok(DcQps {
            dcis,
            dcts,
            dests: Vec::new(),
        })
    }

    /// QP `q`'s number for the peer (its DCT's, or its DCI's on a side without targets)
    /// and, with targets, the DCT and key the peer's requests must name.
    pub(crate) fn endpoint_of(&self, q: usize) -> (u32, Option<DcEndpoint>) {
        match (self.dcts.get(q), self.dcis.get(q)) {
            (Some(dct), _) => (
                dct.dct_number(),
                Some(DcEndpoint {
                    dctn: dct.dct_number(),
                    key: dct.access_key(),
                }),
            ),
            (None, Some(dci)) => (dci.queue_pair().qp_num(), None),
            (None, None) => (0, None),
        }
    }

    /// Moves the DCTs to RTR and the DCIs to RTS, and makes each DCI's destination from the
    /// peer's endpoint of its index: an address handle to the peer's port (`av_to_peer`
    /// builds its vector) and the peer's DCT and key.
    pub(crate) fn connect(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        remotes: &[QpEndpoint],
        states: &DcStates,
        av_to_peer: impl Fn(&QpEndpoint) -> AddressVector,
    ) -> Result<(), RunError> {
        for dct in &self.dcts {
            dct.queue_pair().modify(&states.dct_init())?;
            dct.queue_pair().modify(&states.dct_rtr())?;
        }
        let mut dests = Vec::with_capacity(self.dcis.len());
        for (q, dci) in self.dcis.iter().enumerate() {
            let remote = remotes.get(q).ok_or_else(|| {
                RunError::peer_invalid(format!(
                    "the peer sent {} QP endpoints, this side has {} DC initiators",
                    remotes.len(),
                    self.dcis.len()
                ))
            })?;
            let Some(target) = remote.dc else {
                return Err(RunError::usage(format!(
                    "the peer's QP {q} names no DC target: it does not run -c DC as a target \
                     (run the same options on both sides)"
                )));
            };
            let qp = dci.queue_pair();
            qp.modify(&states.dci_init())?;
            qp.modify(&states.dci_rtr())?;
            qp.modify(&states.dci_rts())?;
            dests.push(DcDest {
                ah: pd.create_ah(&av_to_peer(remote))?,
                dctn: target.dctn,
                key: target.key,
            });
        }
        self.dests = dests;
        Ok(())
    }

    /// What the banner says of this side's DC QPs.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} DC initiators, {} DC targets (mlx5; not yet run on mlx5 hardware by \
             stride-perf's authors)",
            self.dcis.len(),
            self.dcts.len()
        )
    }

    /// Posts on DCI `q` one request per `(wr_id, flags)` of `wrs`, all of `op`, with one
    /// doorbell; `stamp` runs once they are built, just before the doorbell (the time a
    /// message is posted at).
    pub(crate) fn post(
        &mut self,
        q: usize,
        op: &DcOp,
        wrs: &[(u64, SendFlags)],
        stamp: impl FnOnce(),
    ) -> Result<(), RunError> {
        let (Some(dci), Some(dest)) = (self.dcis.get_mut(q), self.dests.get(q)) else {
            return Err(RunError::new(format!(
                "internal error: no connected DC initiator for QP {q}"
            )));
        };
        let to = DcAddress::new(&dest.ah, dest.dctn, dest.key);
        let mut batch = dci.start_post_send();
        for &(wr_id, flags) in wrs {
            let wr = batch.wr(wr_id, flags, to);
            match op {
                DcOp::Send(sge) => wr.send(std::slice::from_ref(sge)),
                DcOp::Write { rkey, addr, sge } => {
                    wr.rdma_write(*rkey, *addr, std::slice::from_ref(sge))
                }
                DcOp::Read { rkey, addr, sge } => {
                    wr.rdma_read(*rkey, *addr, std::slice::from_ref(sge))
                }
                DcOp::FetchAdd { rkey, addr, sge } => wr.atomic_fetch_add(*rkey, *addr, 1, sge),
                DcOp::CmpSwap { rkey, addr, sge } => wr.atomic_cmp_swp(*rkey, *addr, 0, 0, sge),
            }
        }
        stamp();
        batch.post()?;
        Ok(())
    }
}

/// One DCI's operation, as the other transports' [`super::bw`] builds it: the local entry
/// (from registered memory: DC posts no inline data) and, for one-sided operations, the
/// peer's buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DcOp {
    /// A SEND of the entry.
    Send(Sge),
    /// An RDMA WRITE of the entry to `addr` under `rkey`.
    Write { rkey: u32, addr: u64, sge: Sge },
    /// An RDMA READ from `addr` into the entry.
    Read { rkey: u32, addr: u64, sge: Sge },
    /// A fetch-and-add of 1 at `addr`, the old value into the entry.
    FetchAdd { rkey: u32, addr: u64, sge: Sge },
    /// A compare-and-swap (0 for 0) at `addr`, the old value into the entry.
    CmpSwap { rkey: u32, addr: u64, sge: Sge },
}

/// The attributes of the DC QPs' state changes, with the masks rdma-core's mlx5 DC tests
/// use: a DCT goes to Init (P_Key index, port, access) and RTR (path MTU, address vector,
/// RNR timer); a DCI to Init (P_Key index, port), RTR (path MTU) and RTS (timeout,
/// retries, RNR retries, send PSN, outstanding READs/atomics). A DC QP has no fixed peer:
/// no destination QP number, no receive PSN.
#[derive(Debug, Clone)]
pub(crate) struct DcStates {
    /// The local port.
    pub(crate) port: u8,
    /// The path MTU both sides agreed on.
    pub(crate) mtu: Mtu,
    /// The local port's own address vector (the DCT's RTR takes one).
    pub(crate) local_av: AddressVector,
    /// The first PSN of the DCIs.
    pub(crate) sq_psn: u32,
    /// The ack timeout code (-u).
    pub(crate) timeout: u8,
    /// Transport retries.
    pub(crate) retry_cnt: u8,
    /// Outstanding READs/atomics a DCI may have (-o, within the device's limit).
    pub(crate) max_rd_atomic: u8,
}

impl DcStates {
    fn to(state: QpState) -> QueuePairAttribute {
        let mut a = QueuePairAttribute::new();
        a.set_qp_state(state);
        a
    }

    /// A DCT to Init.
    pub(crate) fn dct_init(&self) -> QueuePairAttribute {
        let mut a = Self::to(QpState::Init);
        a.set_pkey_index(0)
            .set_port_num(self.port)
            .set_qp_access_flags(
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            );
        a
    }

    /// A DCT to RTR.
    pub(crate) fn dct_rtr(&self) -> QueuePairAttribute {
        let mut a = Self::to(QpState::Rtr);
        a.set_path_mtu(self.mtu)
            .set_ah_attr(self.local_av)
            .set_min_rnr_timer(MIN_RNR_TIMER);
        a
    }

    /// A DCI to Init.
    pub(crate) fn dci_init(&self) -> QueuePairAttribute {
        let mut a = Self::to(QpState::Init);
        a.set_pkey_index(0).set_port_num(self.port);
        a
    }

    /// A DCI to RTR.
    pub(crate) fn dci_rtr(&self) -> QueuePairAttribute {
        let mut a = Self::to(QpState::Rtr);
        a.set_path_mtu(self.mtu);
        a
    }

    /// A DCI to RTS.
    pub(crate) fn dci_rts(&self) -> QueuePairAttribute {
        let mut a = Self::to(QpState::Rts);
        a.set_timeout(self.timeout)
            .set_retry_cnt(self.retry_cnt)
            .set_rnr_retry(RNR_RETRY)
            .set_sq_psn(self.sq_psn)
            .set_max_rd_atomic(self.max_rd_atomic);
        a
    }
}

/// The address vector to a port: `lid`, and with a non-zero `gid` a GRH to it from our GID
/// `sgid_index` (RoCE, or InfiniBand routed by GID).
pub(crate) fn av_to(
    port: u8,
    lid: u16,
    gid: Gid,
    sgid_index: Option<u8>,
    tclass: u8,
) -> AddressVector {
    let mut av = AddressVector::new();
    av.set_dlid(lid).set_sl(0).set_port_num(port);
    if !gid.is_zero() {
        av.set_is_global(true)
            .set_dgid(gid)
            .set_sgid_index(sgid_index.unwrap_or(0))
            .set_hop_limit(64)
            .set_traffic_class(tclass);
    }
    av
}

impl DcQps {
    /// Sets DCI `q`'s destination without the state changes and the address handle's
    /// creation, which a test double cannot do.
    #[cfg(test)]
    fn set_dest(&mut self, ah: Arc<AddressHandle>, dctn: u32, key: u64) {
        self.dests.push(DcDest { ah, dctn, key });
    }
}

/// The masks [`DcStates`] gives, for the tests.
#[cfg(test)]
fn masks(s: &DcStates) -> [QpAttrMask; 5] {
    [
        s.dct_init().mask(),
        s.dct_rtr().mask(),
        s.dci_init().mask(),
        s.dci_rtr().mask(),
        s.dci_rts().mask(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::from_args;

    #[test]
    fn roles_follow_who_posts() {
        let roles = |args: &[&str], client| DcRoles::of(&from_args(args).unwrap(), client);
        let dci = DcRoles {
            initiators: true,
            targets: false,
        };
        let dct = DcRoles {
            initiators: false,
            targets: true,
        };
        let both = DcRoles {
            initiators: true,
            targets: true,
        };
        for verb in ["send", "write", "read", "atomic"] {
            assert_eq!(roles(&[verb, "bw", "-c", "DC"], true), dci, "{verb} bw");
            assert_eq!(roles(&[verb, "bw", "-c", "DC"], false), dct, "{verb} bw");
        }
        assert_eq!(roles(&["write", "bw", "-c", "DC", "-b"], true), both);
        assert_eq!(roles(&["send", "bw", "-c", "DC", "-b"], false), both);
        for verb in ["send", "write"] {
            assert_eq!(roles(&[verb, "lat", "-c", "DC"], true), both);
            assert_eq!(roles(&[verb, "lat", "-c", "DC"], false), both);
        }
        for verb in ["read", "atomic"] {
            assert_eq!(roles(&[verb, "lat", "-c", "DC"], true), dci);
            assert_eq!(roles(&[verb, "lat", "-c", "DC"], false), dct);
        }
    }

    #[test]
    fn state_masks_are_rdma_cores_dc_masks() {
        let s = DcStates {
            port: 1,
            mtu: Mtu::Mtu1024,
            local_av: av_to(1, 0, Gid::from_raw([0; 16]), None, 0),
            sq_psn: 0x1234,
            timeout: 14,
            retry_cnt: 7,
            max_rd_atomic: 16,
        };
        use QpAttrMask as M;
        assert_eq!(
            masks(&s),
            [
                M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                M::STATE | M::AV | M::PATH_MTU | M::MIN_RNR_TIMER,
                M::STATE | M::PKEY_INDEX | M::PORT,
                M::STATE | M::PATH_MTU,
                M::STATE
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::SQ_PSN
                    | M::MAX_QP_RD_ATOMIC,
            ]
        );
        let rts = s.dci_rts();
        assert_eq!(
            (
                rts.timeout(),
                rts.retry_cnt(),
                rts.rnr_retry(),
                rts.sq_psn()
            ),
            (14, 7, 6, 0x1234)
        );
        assert_eq!(rts.max_rd_atomic(), 16);
        assert_eq!(s.dct_rtr().min_rnr_timer(), 12);
        assert_eq!(s.dct_init().port_num(), 1);
    }

    #[test]
    fn the_address_vector_routes_by_gid_when_there_is_one() {
        let mut raw = [0u8; 16];
        raw[10] = 0xff;
        raw[11] = 0xff;
        raw[12..].copy_from_slice(&[198, 18, 0, 1]);
        let av = av_to(1, 0, Gid::from_raw(raw), Some(1), 0);
        assert!(av.is_global());
        assert_eq!(av.sgid_index(), 1);
        let av = av_to(1, 7, Gid::from_raw([0; 16]), None, 0);
        assert!(!av.is_global());
        assert_eq!(av.dlid(), 7);
    }
}

/// stride's DC plumbing against the test double of `libmlx5.so.1` that sideway's own DC
/// tests use (sideway/tests/support/fake_libmlx5.c, built here with the C compiler): what
/// `mlx5dv_create_qp` is asked for the DCIs and DCTs of a run, what the exchange carries,
/// and the order of a DCI's posting calls with its DC address. The double has no verbs of
/// its own, so the state changes and the address handle's creation (libibverbs' control
/// path) are left out; their attributes are checked in `tests` above.
#[cfg(test)]
#[allow(unsafe_code)]
mod fake_mlx5 {
    use std::env;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::ptr::NonNull;

    use sideway::device::DeviceContext;
    use sideway::protection_domain::ProtectionDomain;
    use sideway::sys as ffi;

    use super::*;
    use crate::params::from_args;

    const CHILD: &str = "STRIDE_DC_FAKE_CHILD";

    /// Builds the double, or says why it cannot (no C compiler: the SoftRoCE guest).
    fn fake_library() -> Option<PathBuf> {
        let dir = env::temp_dir().join(format!("stride-fake-libmlx5-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the temporary directory is writable");
        let lib = dir.join("libmlx5.so.1");
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../sideway/tests/support/fake_libmlx5.c");
        if !src.exists() {
            println!(
                "skipped: no {} (a packaged crate has no sideway tree)",
                src.display()
            );
            return None;
        }
        let cc = env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let built = Command::new(&cc)
            .args([
                "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread", "-o",
            ])
            .arg(&lib)
            .arg(&src)
            .status();
        match built {
            Ok(status) if status.success() => Some(lib),
            Ok(status) => panic!("{cc} could not build {}: {status}", src.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                println!("skipped: no C compiler ({cc}) here to build the fake libmlx5");
                None
            }
            Err(e) => panic!("cannot run {cc}: {e}"),
        }
    }

    /// The C objects of a device that is not there, zeroed but for their links (as
    /// sideway's DC tests lay them out: the device, then the provider's table, NULL).
    #[repr(C)]
    struct FakeVerbs {
        device: ffi::ibv_device,
        verbs_device_ops: *const std::ffi::c_void,
        verbs_device_rest: [u64; 8],
        context: ffi::ibv_context,
        pd: ffi::ibv_pd,
        send_cq: ffi::ibv_cq,
        recv_cq: ffi::ibv_cq,
        srq: ffi::ibv_srq,
        ah: ffi::ibv_ah,
    }

    /// Keeps the fake objects alive as the context's owner.
    struct Owner(#[allow(dead_code)] Box<FakeVerbs>);
    // SAFETY: plain memory that only this test's thread touches.
    unsafe impl Send for Owner {}
    // SAFETY: as above.
    unsafe impl Sync for Owner {}

    struct Fake {
        ctx: Arc<DeviceContext>,
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        srq: Arc<SharedReceiveQueue>,
        ah: Arc<AddressHandle>,
    }

    fn fake(name: &str) -> Fake {
        let mut v = Box::new(FakeVerbs {
            device: ffi::ibv_device::default(),
            verbs_device_ops: std::ptr::null(),
            verbs_device_rest: [0; 8],
            context: ffi::ibv_context::default(),
            pd: ffi::ibv_pd::default(),
            send_cq: ffi::ibv_cq::default(),
            recv_cq: ffi::ibv_cq::default(),
            srq: ffi::ibv_srq::default(),
            ah: ffi::ibv_ah::default(),
        });
        for (dst, src) in v.device.name.iter_mut().zip(name.bytes()) {
            *dst = src as _;
        }
        let device: *mut ffi::ibv_device = &mut v.device;
        v.context.device = device;
        let context: *mut ffi::ibv_context = &mut v.context;
        v.pd.context = context;
        v.send_cq.context = context;
        v.recv_cq.context = context;
        v.srq.context = context;
        v.ah.context = context;
        v.ah.handle = 0xa4;
        let pd = NonNull::from(&mut v.pd);
        v.ah.pd = pd.as_ptr();
        let (send_cq, recv_cq, srq, ah) = (
            NonNull::from(&mut v.send_cq),
            NonNull::from(&mut v.recv_cq),
            NonNull::from(&mut v.srq),
            NonNull::from(&mut v.ah),
        );
        let ctx_raw = NonNull::from(&mut v.context);
        // SAFETY: every object lives in the box the context owns, until the context and
        // all objects wrapped on it are dropped; only the double and plain field reads
        // touch them, never libibverbs' control path (a test-double context destroys
        // nothing).
        unsafe {
            let ctx = DeviceContext::from_raw_parts(ctx_raw, name, Box::new(Owner(v)));
            let pd = ProtectionDomain::from_raw_parts(pd, &ctx);
            let send_cq = ctx
                .create_cq_builder()
                .wrap_raw(send_cq, None)
                .expect("a CQ");
            let recv_cq = ctx
                .create_cq_builder()
                .wrap_raw(recv_cq, None)
                .expect("a CQ");
            let srq = pd.create_srq_builder().wrap_raw(srq);
            let ah = AddressHandle::from_raw_parts(ah, &AddressVector::new(), &pd);
            Fake {
                ctx,
                pd,
                send_cq,
                recv_cq,
                srq,
                ah,
            }
        }
    }

    fn log_lines(log: &Path) -> Vec<String> {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn dc_qps_against_the_fake_libmlx5() {
        let Some(lib) = fake_library() else { return };
        if let Err(e) = ffi::Library::Ibverbs.load() {
            // ibv_qp_to_qp_ex is libibverbs' own; without the library nothing can run.
            println!("skipped: {e}");
            return;
        }
        let log = lib.with_file_name("calls.log");
        let _ = std::fs::remove_file(&log);
        let exe = env::current_exe().expect("the test binary knows its path");
        let out = Command::new(exe)
            .args([
                "--ignored",
                "--exact",
                "engine::dc::fake_mlx5::child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("RDMA_MUMMY_LIBMLX5", &lib)
            .env("FAKE_MLX5_LOG", &log)
            .output()
            .expect("the test binary can be re-run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the child failed:\n{stdout}\n{stderr}"
        );
        assert!(
            stdout.contains("child checks passed"),
            "the child did not run its checks:\n{stdout}\n{stderr}"
        );
        print!("{stdout}");
        let _ = std::fs::remove_dir_all(lib.parent().expect("the library is in a directory"));
    }

    /// Fails unless the last `mlx5dv_create_qp` line of `log` has every field of `want`.
    fn created_with(log: &Path, want: &[String]) {
        let line = log_lines(log)
            .into_iter()
            .rev()
            .find(|l| l.starts_with("mlx5dv_create_qp"))
            .expect("a QP was created");
        for field in want {
            assert!(
                line.split(' ').any(|f| f == field),
                "{field} missing: {line}"
            );
        }
    }

    #[test]
    #[ignore = "run by dc_qps_against_the_fake_libmlx5 with the double loaded"]
    fn child() {
        assert_eq!(
            env::var(CHILD).as_deref(),
            Ok("1"),
            "run only as the test's child"
        );
        let log = PathBuf::from(env::var_os("FAKE_MLX5_LOG").expect("the parent sets it"));

        // Another provider's device is refused, naming it and what DC needs.
        let rxe = fake("rxe0");
        let err = require_mlx5(&rxe.ctx)
            .expect_err("rxe0 is no mlx5 device")
            .to_string();
        assert!(err.starts_with("rxe0 is a"), "{err}");
        assert!(err.contains("not mlx5"), "{err}");
        assert!(err.contains(DC_NEED), "{err}");

        let f = fake("mlx5_0");
        require_mlx5(&f.ctx).expect("the double says mlx5_0 is an mlx5 device");
        let params = from_args(&["write", "bw", "-c", "DC", "-q", "2", "-t", "64"]).unwrap();
        let setup = |srq| DcSetup {
            pd: &f.pd,
            send_cq: &f.send_cq,
            recv_cq: &f.recv_cq,
            srq,
            qps: params.qps,
            tx_depth: params.tx_depth,
            send_ops: SendOpsFlags::RDMA_WRITE,
            key: 0x5eed_0001,
        };
        use ffi::mlx5dv_dc_type::{MLX5DV_DCTYPE_DCI, MLX5DV_DCTYPE_DCT};
        let driver = ffi::ibv_qp_type::IBV_QPT_DRIVER;

        // The server of a write bw test: a DCT per QP, on the SRQ, with the run's key.
        let server = DcQps::create(&setup(Some(&f.srq)), DcRoles::of(&params, false)).unwrap();
        assert_eq!((server.dcis.len(), server.dcts.len()), (0, 2));
        created_with(
            &log,
            &[
                format!("qp_type={driver}"),
                "srq=1".to_owned(),
                format!("dc_type={MLX5DV_DCTYPE_DCT}"),
                "dct_access_key=0x5eed0001".to_owned(),
            ],
        );
        let (qpn, target) = server.endpoint_of(1);
        let dct = &server.dcts[1];
        assert_eq!(qpn, dct.dct_number());
        assert_eq!(
            target,
            Some(crate::oob::DcEndpoint {
                dctn: dct.dct_number(),
                key: 0x5eed_0001
            })
        );
        // A DCT without the shared queue is refused before the double is asked.
        let err = DcQps::create(&setup(None), DcRoles::of(&params, false)).unwrap_err();
        assert!(err.to_string().contains("shared receive queue"), "{err}");

        // The client: a DCI per QP, with the run's operations and send queue depth.
        let mut client = DcQps::create(&setup(None), DcRoles::of(&params, true)).unwrap();
        assert_eq!((client.dcis.len(), client.dcts.len()), (2, 0));
        created_with(
            &log,
            &[
                format!("qp_type={driver}"),
                "srq=0".to_owned(),
                format!("dc_type={MLX5DV_DCTYPE_DCI}"),
                format!("send_ops_flags={:#x}", SendOpsFlags::RDMA_WRITE.bits()),
                "max_send_wr=64".to_owned(),
                "max_send_sge=1".to_owned(),
            ],
        );
        let (qpn, target) = client.endpoint_of(0);
        assert_eq!(qpn, client.dcis[0].queue_pair().qp_num());
        assert_eq!(target, None, "an initiator is nobody's target");

        // Posting before the destinations are known is refused, not a panic.
        // SAFETY: the double records the entry and never dereferences it.
        let sge = unsafe { Sge::from_raw_parts(0x1000, 4096, 0x77) };
        let op = DcOp::Write {
            rkey: 0x42,
            addr: 0x9000,
            sge,
        };
        let err = client
            .post(0, &op, &[(0, SendFlags::SIGNALED)], || ())
            .unwrap_err();
        assert!(
            err.to_string().contains("no connected DC initiator"),
            "{err}"
        );

        // One post list of three WRITEs on QP 1: each names the peer's DCT and key after
        // its opcode, one doorbell for all.
        client.set_dest(Arc::clone(&f.ah), 0xd0, 0x5eed_0001);
        client.set_dest(Arc::clone(&f.ah), 0xd1, 0x5eed_0001);
        let qpn = client.dcis[1].queue_pair().qp_num();
        let before = log_lines(&log).len();
        let mut stamped = false;
        let wrs = [
            (1, SendFlags::empty()),
            (1, SendFlags::empty()),
            (1 | 3 << 32, SendFlags::SIGNALED),
        ];
        client.post(1, &op, &wrs, || stamped = true).unwrap();
        assert!(stamped, "the post is stamped");
        let posted = log_lines(&log).split_off(before);
        let mut want = vec![format!("wr_start qp={qpn:#x}")];
        for (wr_id, flags) in wrs {
            want.push(format!(
                "wr_rdma_write wr_id={wr_id} flags={:#x} rkey=0x42 addr=0x9000",
                flags.bits()
            ));
            want.push("wr_set_dc_addr ah_pd_handle=0xa4 dctn=0xd1 key=0x5eed0001".to_owned());
            want.push("wr_set_sge_list n=1 lkey=0x77 addr=0x1000 length=4096".to_owned());
        }
        want.push(format!("wr_complete qp={qpn:#x}"));
        assert_eq!(posted, want);

        // An operation the DCIs were not made for: refused, the batch aborted.
        let read = DcOp::Read {
            rkey: 1,
            addr: 2,
            sge,
        };
        let err = client
            .post(0, &read, &[(0, SendFlags::SIGNALED)], || ())
            .unwrap_err();
        assert!(err.to_string().contains("RDMA READ"), "{err}");
        println!("child checks passed");
    }
}
