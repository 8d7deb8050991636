//! mlx5's direct verbs (`mlx5dv_*`, `infiniband/mlx5dv.h`): device capabilities, the
//! Dynamically Connected (DC) transport and the `mlx5dv_qp_ex` handle.
//!
//! The functions live in `libmlx5.so.1`, which the shim loads on first use (environment
//! override `RDMA_MUMMY_LIBMLX5`); Debian and Ubuntu ship it in `ibverbs-providers`, RHEL
//! and Fedora in `libibverbs`. Every call first checks, through [`require`], that the
//! library loads and that the device is an mlx5 one (`mlx5dv_is_supported`); on any other
//! device (SoftRoCE's rxe, say) it fails with [`DvError::WrongProvider`], naming the device
//! and its driver, and without the library with [`DvError::LibraryMissing`], naming the
//! package to install.
//!
//! DC: one DCI (initiator) QP reaches any number of DCT (target) QPs, each request naming
//! its destination (address handle, DCT number, DC access key) as a UD send does, while
//! the transport stays reliable and keeps RDMA READ/WRITE and atomics. Both are created by
//! `mlx5dv_create_qp` with QP type `IBV_QPT_DRIVER`, from an ordinary
//! [`QueuePairBuilder`], and are ordinary [`QueuePair`]s underneath (modify them through
//! [`DcTarget::queue_pair`] / [`DcInitiator::queue_pair`]); a DCI posts through its own
//! guard, [`DcPostGuard`], which calls `mlx5dv_wr_set_dc_addr` on every request.
//!
//! **Tested against a test double only.** No mlx5 NIC was available to this project: the
//! attribute plumbing (QP type, `comp_mask` bits, DC type, DCT access key, send_ops_flags,
//! the posting order) is checked against a fake `libmlx5.so.1` that records its arguments
//! (`sideway/tests/dv_mlx5.rs`), and the refusals on SoftRoCE's rxe in the SoftRoCE guest;
//! DC traffic has never run on mlx5 hardware here.
//!
//! ```no_run
//! use sideway::dv::mlx5::{self, DcAddress};
//! use sideway::queue_pair::SendFlags;
//! # fn demo(ctx: std::sync::Arc<sideway::device::DeviceContext>,
//! #         pd: std::sync::Arc<sideway::protection_domain::ProtectionDomain>,
//! #         cq: std::sync::Arc<sideway::completion_queue::CompletionQueue>,
//! #         srq: std::sync::Arc<sideway::shared_receive_queue::SharedReceiveQueue>,
//! #         ah: sideway::address_handle::AddressHandle, buf: sideway::memory_region::RegisteredBuffer,
//! #         remote_dctn: u32, rkey: u32, raddr: u64) -> Result<(), Box<dyn std::error::Error>> {
//! if !mlx5::is_supported(&ctx) {
//!     return Ok(()); // not an mlx5 device, or no libmlx5.so.1
//! }
//! let caps = mlx5::query_device(&ctx)?;
//! println!("mlx5dv version {}, flags {:?}", caps.version, caps.flags);
//!
//! // A target: receives through an SRQ, reachable by anyone who knows its key.
//! let dct = pd.create_qp_builder().send_cq(&cq).recv_cq(&cq).srq(&srq)
//!     .build_mlx5_dct(0x5eed)?;
//! println!("DCT number {:#x}", dct.dct_number());
//!
//! // An initiator: every request names its destination.
//! let mut dci = pd.create_qp_builder().send_cq(&cq).recv_cq(&cq).build_mlx5_dci()?;
//! // ... modify both to RTS through queue_pair().modify(..) ...
//! let sges = [buf.sge(0..4096).unwrap()];
//! let mut batch = dci.start_post_send();
//! batch
//!     .wr(1, SendFlags::SIGNALED, DcAddress::new(&ah, remote_dctn, 0x5eed))
//!     .rdma_write(rkey, raddr, &sges);
//! batch.post()?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::io;
use std::ptr::NonNull;

use bitflags::bitflags;
use rdma_mummy_sys::{self as ffi, Library};

use super::{require, DvError, Provider};
use crate::errno::{fresh, from_post_ret, non_null};
use crate::scatter_gather::Sge;
use crate::verbs::address_handle::AddressHandle;
use crate::verbs::device::DeviceContext;
use crate::verbs::queue_pair::{
    InvalidWorkRequest, PostError, QpType, QueuePair, QueuePairBuilder, SendFlags, SendOpsFlags,
};

/// The mlx5 provider, for [`super::require`] and [`super::PROVIDERS`].
#[derive(Debug, Clone, Copy)]
pub struct Mlx5;

impl Provider for Mlx5 {
    const NAME: &'static str = "mlx5";
    const LIBRARY: Library = Library::Mlx5;

    fn is_supported(ctx: &DeviceContext) -> bool {
        is_supported(ctx)
    }
}

/// What the DC calls tell a user of another device.
const DC_NEED: &str = "DC transport needs an mlx5 NIC (ConnectX-4 or later)";

/// Whether `ctx`'s device is an mlx5 device (`mlx5dv_is_supported`). False when
/// `libmlx5.so.1` does not load, or the device is another provider's (rxe, efa, ...).
#[doc(alias = "mlx5dv_is_supported")]
pub fn is_supported(ctx: &DeviceContext) -> bool {
    if Library::Mlx5.load().is_err() {
        return false;
    }
    // SAFETY: ctx is an open context; `device` is a plain field libibverbs set when it opened
    // it (a test double's context sets it too, or leaves it NULL).
    let device = unsafe { (*ctx.as_raw()).device };
    if device.is_null() {
        return false;
    }
    // SAFETY: device is the live device of an open context; the provider only compares its
    // operation table.
    unsafe { ffi::mlx5dv_is_supported(device) }
}

bitflags! {
    /// `mlx5dv_context.flags` (`enum mlx5dv_context_flags`).
    #[doc(alias = "mlx5dv_context_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct ContextFlags: u64 {
        /// `MLX5DV_CONTEXT_FLAGS_CQE_V1`
        const CQE_V1 = ffi::mlx5dv_context_flags::MLX5DV_CONTEXT_FLAGS_CQE_V1 as u64;
        /// `MLX5DV_CONTEXT_FLAGS_MPW_ALLOWED`
        const MPW_ALLOWED = ffi::mlx5dv_context_flags::MLX5DV_CONTEXT_FLAGS_MPW_ALLOWED as u64;
        /// `MLX5DV_CONTEXT_FLAGS_ENHANCED_MPW`
        const ENHANCED_MPW = ffi::mlx5dv_context_flags::MLX5DV_CONTEXT_FLAGS_ENHANCED_MPW as u64;
        /// `MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP`
        const CQE_128B_COMP = ffi::mlx5dv_context_flags::MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP as u64;
        /// `MLX5DV_CONTEXT_FLAGS_CQE_128B_PAD`
        const CQE_128B_PAD = ffi::mlx5dv_context_flags::MLX5DV_CONTEXT_FLAGS_CQE_128B_PAD as u64;
        /// `MLX5DV_CONTEXT_FLAGS_PACKET_BASED_CREDIT_MODE`
        const PACKET_BASED_CREDIT_MODE =
            ffi::mlx5dv_context_flags::MLX5DV_CONTEXT_FLAGS_PACKET_BASED_CREDIT_MODE as u64;
        /// `MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS`
        const REAL_TIME_TS = ffi::mlx5dv_context_flags::MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS as u64;
        // Flags of a newer libmlx5 survive.
        const _ = !0;
    }
}

/// The DCI stream capabilities (`mlx5dv_context.dci_streams_caps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DciStreamsCaps {
    /// log2 of the most concurrent streams per DCI (`max_log_num_concurent`).
    pub max_log_num_concurrent: u8,
    /// log2 of the most streams in error a DCI keeps (`max_log_num_errored`).
    pub max_log_num_errored: u8,
}

/// What `mlx5dv_query_device` reports; fields of a part the library did not fill (its
/// `comp_mask` bit clear in the answer) are `None`.
#[derive(Clone, Copy)]
#[doc(alias = "mlx5dv_context")]
pub struct Mlx5DeviceAttr {
    /// `version`: the mlx5dv context version.
    pub version: u8,
    /// `flags`.
    pub flags: ContextFlags,
    /// `comp_mask` as the library returned it: which parts it filled.
    pub comp_mask: u64,
    /// `max_dynamic_bfregs` (`MLX5DV_CONTEXT_MASK_DYN_BFREGS`).
    pub max_dynamic_bfregs: Option<u32>,
    /// `dc_odp_caps`, `ibv_odp_transport_cap_bits` of DC (`MLX5DV_CONTEXT_MASK_DC_ODP_CAPS`).
    pub dc_odp_caps: Option<u32>,
    /// `num_lag_ports` (`MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS`).
    pub num_lag_ports: Option<u8>,
    /// `dci_streams_caps` (`MLX5DV_CONTEXT_MASK_DCI_STREAMS`).
    pub dci_streams: Option<DciStreamsCaps>,
    /// `max_wr_memcpy_length` (`MLX5DV_CONTEXT_MASK_WR_MEMCPY_LENGTH`).
    pub max_wr_memcpy_length: Option<usize>,
    raw: ffi::mlx5dv_context,
}

impl Mlx5DeviceAttr {
    /// The raw answer, for fields this type does not name.
    pub fn as_raw(&self) -> &ffi::mlx5dv_context {
        &self.raw
    }

    fn from_raw(raw: ffi::mlx5dv_context) -> Self {
        use ffi::mlx5dv_context_comp_mask as m;
        let has = |bit: u32| raw.comp_mask & u64::from(bit) != 0;
        Mlx5DeviceAttr {
            version: raw.version,
            flags: ContextFlags::from_bits_retain(raw.flags),
            comp_mask: raw.comp_mask,
            max_dynamic_bfregs: has(m::MLX5DV_CONTEXT_MASK_DYN_BFREGS)
                .then_some(raw.max_dynamic_bfregs),
            dc_odp_caps: has(m::MLX5DV_CONTEXT_MASK_DC_ODP_CAPS).then_some(raw.dc_odp_caps),
            num_lag_ports: has(m::MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS).then_some(raw.num_lag_ports),
            dci_streams: has(m::MLX5DV_CONTEXT_MASK_DCI_STREAMS).then_some(DciStreamsCaps {
                max_log_num_concurrent: raw.dci_streams_caps.max_log_num_concurent,
                max_log_num_errored: raw.dci_streams_caps.max_log_num_errored,
            }),
            max_wr_memcpy_length: has(m::MLX5DV_CONTEXT_MASK_WR_MEMCPY_LENGTH)
                .then_some(raw.max_wr_memcpy_length),
            raw,
        }
    }
}

impl fmt::Debug for Mlx5DeviceAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mlx5DeviceAttr")
            .field("version", &self.version)
            .field("flags", &self.flags)
            .field("comp_mask", &format_args!("{:#x}", self.comp_mask))
            .field("max_dynamic_bfregs", &self.max_dynamic_bfregs)
            .field("dc_odp_caps", &self.dc_odp_caps)
            .field("num_lag_ports", &self.num_lag_ports)
            .field("dci_streams", &self.dci_streams)
            .field("max_wr_memcpy_length", &self.max_wr_memcpy_length)
            .finish_non_exhaustive()
    }
}

/// The parts of `mlx5dv_context` asked for: those whose fields [`Mlx5DeviceAttr`] names.
/// Each is a field of the header this crate was built against, so a newer library never
/// writes past the struct (it fills only what `comp_mask` asks).
const QUERY_MASK: u32 = ffi::mlx5dv_context_comp_mask::MLX5DV_CONTEXT_MASK_DYN_BFREGS
    | ffi::mlx5dv_context_comp_mask::MLX5DV_CONTEXT_MASK_DC_ODP_CAPS
    | ffi::mlx5dv_context_comp_mask::MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS
    | ffi::mlx5dv_context_comp_mask::MLX5DV_CONTEXT_MASK_DCI_STREAMS
    | ffi::mlx5dv_context_comp_mask::MLX5DV_CONTEXT_MASK_WR_MEMCPY_LENGTH;

/// The device's mlx5 capabilities (`mlx5dv_query_device`).
#[doc(alias = "mlx5dv_query_device")]
pub fn query_device(ctx: &DeviceContext) -> Result<Mlx5DeviceAttr, DvError> {
    require::<Mlx5>(ctx, "mlx5dv_query_device needs an mlx5 device")?;
    let mut raw = ffi::mlx5dv_context {
        comp_mask: u64::from(QUERY_MASK),
        ..Default::default()
    };
    // SAFETY: ctx is an open mlx5 context (require); raw is a writable mlx5dv_context of the
    // header's layout, and comp_mask asks only for fields inside it.
    let ret = fresh(|| unsafe { ffi::mlx5dv_query_device(ctx.as_raw(), &mut raw) });
    crate::errno::from_ret(ret).map_err(|source| DvError::Verb {
        call: "mlx5dv_query_device",
        device: ctx.name().to_owned(),
        source,
    })?;
    Ok(Mlx5DeviceAttr::from_raw(raw))
}

/// The mlx5 extended handle of an extended QP of an mlx5 device
/// (`mlx5dv_qp_ex_from_ibv_qp_ex`), for `mlx5dv_wr_*` calls this crate does not wrap. It
/// stays valid while `qp` is alive.
#[doc(alias = "mlx5dv_qp_ex_from_ibv_qp_ex")]
pub fn qp_ex(qp: &QueuePair) -> Result<NonNull<ffi::mlx5dv_qp_ex>, DvError> {
    let ctx = qp.pd().context();
    require::<Mlx5>(ctx, "mlx5dv_qp_ex needs a QP of an mlx5 device")?;
    let Some(ex) = qp.as_raw_ex() else {
        return Err(DvError::InvalidArgument(format!(
            "QP {:#x} is a classic QP; mlx5dv_qp_ex_from_ibv_qp_ex needs an extended one \
             (build_ex())",
            qp.qp_num()
        )));
    };
    // SAFETY: ex is the live extended QP of an mlx5 QP; the provider returns the mlx5 view
    // of the same object.
    let mqp = fresh(|| unsafe { ffi::mlx5dv_qp_ex_from_ibv_qp_ex(ex) });
    non_null(mqp).map_err(|source| DvError::Verb {
        call: "mlx5dv_qp_ex_from_ibv_qp_ex",
        device: ctx.name().to_owned(),
        source,
    })
}

/// A DC target QP (DCT): receives, through its shared receive queue, what DCIs send to its
/// number with its access key. From [`QueuePairBuilder::build_mlx5_dct`].
#[derive(Debug)]
pub struct DcTarget {
    qp: QueuePair,
    access_key: u64,
}

impl DcTarget {
    /// The QP underneath (type `IBV_QPT_DRIVER`): modify it to RTR with it. A DCT posts no
    /// sends and takes receives from its SRQ.
    pub fn queue_pair(&self) -> &QueuePair {
        &self.qp
    }

    /// The DCT number initiators address (`qp_num`).
    pub fn dct_number(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The DC access key initiators must present (`dct_access_key`).
    pub fn access_key(&self) -> u64 {
        self.access_key
    }
}

/// A DC initiator QP (DCI): sends to any DCT, each request naming its destination. From
/// [`QueuePairBuilder::build_mlx5_dci`]; post with [`start_post_send`](Self::start_post_send).
pub struct DcInitiator {
    qp: QueuePair,
    ex: NonNull<ffi::ibv_qp_ex>,
    mqp: NonNull<ffi::mlx5dv_qp_ex>,
    send_ops: SendOpsFlags,
}

// SAFETY: the QP is Send and Sync; the two handles point into it and are used for posting
// only, which takes `&mut self`, so no two threads post on one DCI at once.
unsafe impl Send for DcInitiator {}
// SAFETY: as above: `&self` methods read plain values only.
unsafe impl Sync for DcInitiator {}

impl fmt::Debug for DcInitiator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DcInitiator")
            .field("qp", &self.qp)
            .field("send_ops", &self.send_ops)
            .finish_non_exhaustive()
    }
}

impl DcInitiator {
    /// The QP underneath (type `IBV_QPT_DRIVER`, extended): modify it to RTS with it. Posting
    /// goes through [`start_post_send`](Self::start_post_send), never the QP's own guard,
    /// which cannot name a DC destination.
    pub fn queue_pair(&self) -> &QueuePair {
        &self.qp
    }

    /// The mlx5 extended handle (`mlx5dv_qp_ex_from_ibv_qp_ex`), valid while the DCI lives.
    #[doc(alias = "mlx5dv_qp_ex_from_ibv_qp_ex")]
    pub fn as_raw_mlx5(&self) -> *mut ffi::mlx5dv_qp_ex {
        self.mqp.as_ptr()
    }

    /// The operations this DCI may post (`send_ops_flags` at creation).
    pub fn send_ops(&self) -> SendOpsFlags {
        self.send_ops
    }

    /// Starts a batch of send work requests (`ibv_wr_start` .. `ibv_wr_complete`), each with
    /// its DC destination (`mlx5dv_wr_set_dc_addr`). Dropping the guard unposted aborts the
    /// batch (`ibv_wr_abort`).
    #[doc(alias = "ibv_wr_start")]
    pub fn start_post_send(&mut self) -> DcPostGuard<'_> {
        DcPostGuard {
            dci: self,
            count: 0,
            invalid: None,
        }
    }
}

fn dc_type_name(dc_type: ffi::mlx5dv_dc_type::Type) -> &'static str {
    if dc_type == ffi::mlx5dv_dc_type::MLX5DV_DCTYPE_DCT {
        "DCT"
    } else {
        "DCI"
    }
}

/// For the DC QPs: `pd.create_qp_builder()...build_mlx5_dct(key)` / `build_mlx5_dci()`. The
/// builder's CQs, SRQ, capacities and (for a DCI) send_ops_flags apply; its QP type is
/// replaced by `IBV_QPT_DRIVER`.
impl QueuePairBuilder {
    /// Creates a DC target QP (`mlx5dv_create_qp` with `IBV_QPT_DRIVER`, comp_mask
    /// `IBV_QP_INIT_ATTR_PD`, and `MLX5DV_QP_INIT_ATTR_MASK_DC` with `MLX5DV_DCTYPE_DCT`
    /// and `dct_access_key`). The builder must name an SRQ ([`srq`](Self::srq)): a DCT
    /// receives through one.
    #[doc(alias = "mlx5dv_create_qp")]
    #[doc(alias = "MLX5DV_DCTYPE_DCT")]
    pub fn build_mlx5_dct(&self, dc_access_key: u64) -> Result<DcTarget, DvError> {
        if !self.has_srq() {
            // Checked before the device, so the message is the same everywhere.
            return Err(DvError::InvalidArgument(
                "a DCT receives through a shared receive queue: call srq() on the builder"
                    .to_owned(),
            ));
        }
        let (qp, _) = create_dc(self, ffi::mlx5dv_dc_type::MLX5DV_DCTYPE_DCT, dc_access_key)?;
        Ok(DcTarget {
            qp,
            access_key: dc_access_key,
        })
    }

    /// Creates a DC initiator QP (`mlx5dv_create_qp` with `IBV_QPT_DRIVER`, comp_mask
    /// `IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, and
    /// `MLX5DV_QP_INIT_ATTR_MASK_DC` with `MLX5DV_DCTYPE_DCI`), then its extended handles
    /// (`ibv_qp_to_qp_ex`, `mlx5dv_qp_ex_from_ibv_qp_ex`).
    #[doc(alias = "mlx5dv_create_qp")]
    #[doc(alias = "MLX5DV_DCTYPE_DCI")]
    pub fn build_mlx5_dci(&self) -> Result<DcInitiator, DvError> {
        let (qp, send_ops) = create_dc(self, ffi::mlx5dv_dc_type::MLX5DV_DCTYPE_DCI, 0)?;
        let device = qp.pd().context().name().to_owned();
        let verb_err = |call, errno| DvError::Verb {
            call,
            device: device.clone(),
            source: io::Error::from_raw_os_error(errno),
        };
        // A DCI is created with send_ops_flags, so it has an ibv_qp_ex (wrap_created got it).
        let ex = qp
            .as_raw_ex()
            .and_then(NonNull::new)
            .ok_or_else(|| verb_err("ibv_qp_to_qp_ex", libc::EIO))?;
        // SAFETY: ex is the live extended QP of a DCI of an mlx5 device (require, in
        // create_dc); the provider returns its mlx5 view.
        let mqp = fresh(|| unsafe { ffi::mlx5dv_qp_ex_from_ibv_qp_ex(ex.as_ptr()) });
        let mqp = non_null(mqp).map_err(|source| DvError::Verb {
            call: "mlx5dv_qp_ex_from_ibv_qp_ex",
            device: device.clone(),
            source,
        })?;
        // SAFETY: both are live handles of the QP; the provider filled their entries at
        // creation and never changes them.
        let complete = unsafe {
            let e = &*ex.as_ptr();
            e.wr_start.is_some()
                && e.wr_complete.is_some()
                && e.wr_abort.is_some()
                && e.wr_set_sge_list.is_some()
                && (*mqp.as_ptr()).wr_set_dc_addr.is_some()
        };
        if !complete {
            // The QP is dropped (destroyed) on return.
            return Err(verb_err("mlx5dv_qp_ex_from_ibv_qp_ex", libc::EOPNOTSUPP));
        }
        Ok(DcInitiator {
            qp,
            ex,
            mqp,
            send_ops,
        })
    }
}

/// Creates a DCT or DCI from `builder`; the QP, and the send_ops_flags it was created with.
fn create_dc(
    builder: &QueuePairBuilder,
    dc_type: ffi::mlx5dv_dc_type::Type,
    dc_access_key: u64,
) -> Result<(QueuePair, SendOpsFlags), DvError> {
    let ctx = builder.protection_domain().context();
    require::<Mlx5>(ctx, DC_NEED)?;
    let dct = dc_type == ffi::mlx5dv_dc_type::MLX5DV_DCTYPE_DCT;
    let mut b = builder.clone();
    b.qp_type(QpType::Driver);
    let (mut init, send_cq, recv_cq) = b.extended_init_attr()?;
    if dct {
        // A DCT posts nothing: no send operations.
        init.comp_mask = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD;
        init.send_ops_flags = 0;
    }
    let send_ops = SendOpsFlags::from_bits_retain(init.send_ops_flags);
    let mut dv = ffi::mlx5dv_qp_init_attr {
        comp_mask: u64::from(ffi::mlx5dv_qp_init_attr_mask::MLX5DV_QP_INIT_ATTR_MASK_DC),
        create_flags: 0,
        dc_init_attr: ffi::mlx5dv_dc_init_attr {
            dc_type,
            __bindgen_anon_1: ffi::mlx5dv_dc_init_attr__bindgen_ty_1 {
                dct_access_key: if dct { dc_access_key } else { 0 },
            },
        },
        send_ops_flags: 0,
    };
    // SAFETY: ctx is an open mlx5 context (require); the PD, CQs and SRQ init names are
    // alive (the QP will hold their Arcs); init and dv are fully initialised and their
    // comp_masks name exactly the fields that are meaningful; the verb writes the granted
    // capacities back into init.cap.
    let qp = fresh(|| unsafe { ffi::mlx5dv_create_qp(ctx.as_raw(), &mut init, &mut dv) });
    let raw = non_null(qp).map_err(|source| DvError::Verb {
        call: "mlx5dv_create_qp",
        device: ctx.name().to_owned(),
        source,
    })?;
    let ex = if dct {
        None
    } else {
        // SAFETY: raw is a live QP created with send_ops_flags.
        let ex = fresh(|| unsafe { ffi::ibv_qp_to_qp_ex(raw.as_ptr()) });
        match non_null(ex) {
            Ok(ex) => Some(ex),
            Err(source) => {
                if ctx.owns_objects() {
                    // SAFETY: raw is a live QP nothing else refers to; destroyed once.
                    let _ = unsafe { ffi::ibv_destroy_qp(raw.as_ptr()) };
                }
                return Err(DvError::Verb {
                    call: "ibv_qp_to_qp_ex",
                    device: ctx.name().to_owned(),
                    source,
                });
            }
        }
    };
    // SAFETY: raw was made just now on the builder's PD with its CQs and SRQ, from b's
    // extended_init_attr (QP type, send_ops_flags), and nothing else destroys it; ex is
    // ibv_qp_to_qp_ex(raw).
    let qp = unsafe { b.wrap_created(raw, ex, init.cap, send_cq, recv_cq) };
    log::debug!(
        "{}: created {} {:#x}",
        ctx.name(),
        dc_type_name(dc_type),
        qp.qp_num()
    );
    Ok((qp, send_ops))
}

/// Where one DCI request goes: an address handle to the target's port, the target's DCT
/// number, and its DC access key (the arguments of `mlx5dv_wr_set_dc_addr`).
#[derive(Debug, Clone, Copy)]
pub struct DcAddress<'a> {
    ah: &'a AddressHandle,
    remote_dctn: u32,
    remote_dc_key: u64,
}

impl<'a> DcAddress<'a> {
    /// The destination `remote_dctn` with key `remote_dc_key`, reached through `ah`.
    pub fn new(ah: &'a AddressHandle, remote_dctn: u32, remote_dc_key: u64) -> Self {
        DcAddress {
            ah,
            remote_dctn,
            remote_dc_key,
        }
    }
}

/// One DCI operation, as [`DcWorkRequest`]'s methods describe it.
#[derive(Debug, Clone, Copy)]
enum DcOp {
    Send,
    SendImm(u32),
    Write {
        rkey: u32,
        addr: u64,
    },
    WriteImm {
        rkey: u32,
        addr: u64,
        imm: u32,
    },
    Read {
        rkey: u32,
        addr: u64,
    },
    FetchAdd {
        rkey: u32,
        addr: u64,
        add: u64,
    },
    CmpSwp {
        rkey: u32,
        addr: u64,
        compare: u64,
        swap: u64,
    },
}

impl DcOp {
    fn flag(self) -> SendOpsFlags {
        match self {
            DcOp::Send => SendOpsFlags::SEND,
            DcOp::SendImm(_) => SendOpsFlags::SEND_WITH_IMM,
            DcOp::Write { .. } => SendOpsFlags::RDMA_WRITE,
            DcOp::WriteImm { .. } => SendOpsFlags::RDMA_WRITE_WITH_IMM,
            DcOp::Read { .. } => SendOpsFlags::RDMA_READ,
            DcOp::FetchAdd { .. } => SendOpsFlags::ATOMIC_FETCH_AND_ADD,
            DcOp::CmpSwp { .. } => SendOpsFlags::ATOMIC_CMP_AND_SWP,
        }
    }

    fn name(self) -> &'static str {
        match self {
            DcOp::Send => "SEND",
            DcOp::SendImm(_) => "SEND with immediate",
            DcOp::Write { .. } => "RDMA WRITE",
            DcOp::WriteImm { .. } => "RDMA WRITE with immediate",
            DcOp::Read { .. } => "RDMA READ",
            DcOp::FetchAdd { .. } => "atomic fetch-and-add",
            DcOp::CmpSwp { .. } => "atomic compare-and-swap",
        }
    }

    /// Whether the provider filled this operation's `ibv_qp_ex` entry.
    fn filled(self, ex: &ffi::ibv_qp_ex) -> bool {
        match self {
            DcOp::Send => ex.wr_send.is_some(),
            DcOp::SendImm(_) => ex.wr_send_imm.is_some(),
            DcOp::Write { .. } => ex.wr_rdma_write.is_some(),
            DcOp::WriteImm { .. } => ex.wr_rdma_write_imm.is_some(),
            DcOp::Read { .. } => ex.wr_rdma_read.is_some(),
            DcOp::FetchAdd { .. } => ex.wr_atomic_fetch_add.is_some(),
            DcOp::CmpSwp { .. } => ex.wr_atomic_cmp_swp.is_some(),
        }
    }
}

/// A batch of DCI send work requests being built; from [`DcInitiator::start_post_send`].
/// As [`PostSendGuard`](crate::queue_pair::PostSendGuard): a refused request is reported by
/// [`post`](Self::post), which then posts nothing, and dropping the guard unposted discards
/// the batch (`ibv_wr_abort`). Data is a list of SGEs (no inline data); the SGEs and the
/// address handles are borrowed until the batch is posted.
#[must_use = "work requests reach the device only through post(); dropping the guard discards them"]
pub struct DcPostGuard<'a> {
    dci: &'a mut DcInitiator,
    count: usize,
    invalid: Option<(usize, u64, InvalidWorkRequest)>,
}

impl fmt::Debug for DcPostGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DcPostGuard")
            .field("qp_num", &format_args!("{:#x}", self.dci.qp.qp_num()))
            .field("count", &self.count)
            .field("invalid", &self.invalid)
            .finish()
    }
}

/// One DCI work request being described: pick its operation. From [`DcPostGuard::wr`].
#[must_use = "a work request is added only by one of its operation methods"]
#[derive(Debug)]
pub struct DcWorkRequest<'g, 'a> {
    guard: &'g mut DcPostGuard<'a>,
    wr_id: u64,
    flags: SendFlags,
    dest: DcAddress<'a>,
}

impl<'a> DcWorkRequest<'_, 'a> {
    fn add(self, op: DcOp, sges: &'a [Sge]) {
        self.guard.push(self.wr_id, self.flags, self.dest, op, sges);
    }

    /// A SEND of `sges` (`ibv_wr_send`).
    pub fn send(self, sges: &'a [Sge]) {
        self.add(DcOp::Send, sges)
    }

    /// A SEND with immediate data (`ibv_wr_send_imm`; `imm` in host order).
    pub fn send_with_imm(self, imm: u32, sges: &'a [Sge]) {
        self.add(DcOp::SendImm(imm), sges)
    }

    /// An RDMA WRITE of `sges` to `remote_addr` under `rkey` (`ibv_wr_rdma_write`).
    pub fn rdma_write(self, rkey: u32, remote_addr: u64, sges: &'a [Sge]) {
        self.add(
            DcOp::Write {
                rkey,
                addr: remote_addr,
            },
            sges,
        )
    }

    /// An RDMA WRITE with immediate data (`ibv_wr_rdma_write_imm`; `imm` in host order).
    pub fn rdma_write_with_imm(self, rkey: u32, remote_addr: u64, imm: u32, sges: &'a [Sge]) {
        self.add(
            DcOp::WriteImm {
                rkey,
                addr: remote_addr,
                imm,
            },
            sges,
        )
    }

    /// An RDMA READ from `remote_addr` under `rkey` into `sges` (`ibv_wr_rdma_read`).
    pub fn rdma_read(self, rkey: u32, remote_addr: u64, sges: &'a [Sge]) {
        self.add(
            DcOp::Read {
                rkey,
                addr: remote_addr,
            },
            sges,
        )
    }

    /// An atomic fetch-and-add of 8 bytes at `remote_addr`, the old value landing in `sge`
    /// (`ibv_wr_atomic_fetch_add`).
    pub fn atomic_fetch_add(self, rkey: u32, remote_addr: u64, add: u64, sge: &'a Sge) {
        self.add(
            DcOp::FetchAdd {
                rkey,
                addr: remote_addr,
                add,
            },
            std::slice::from_ref(sge),
        )
    }

    /// An atomic compare-and-swap of 8 bytes at `remote_addr`, the old value landing in
    /// `sge` (`ibv_wr_atomic_cmp_swp`).
    pub fn atomic_cmp_swp(
        self,
        rkey: u32,
        remote_addr: u64,
        compare: u64,
        swap: u64,
        sge: &'a Sge,
    ) {
        self.add(
            DcOp::CmpSwp {
                rkey,
                addr: remote_addr,
                compare,
                swap,
            },
            std::slice::from_ref(sge),
        )
    }
}

impl<'a> DcPostGuard<'a> {
    /// Describes the next request: its `wr_id`, flags and destination.
    pub fn wr(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        dest: DcAddress<'a>,
    ) -> DcWorkRequest<'_, 'a> {
        DcWorkRequest {
            guard: self,
            wr_id,
            flags,
            dest,
        }
    }

    /// Requests added so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no request was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn check(&self, op: DcOp, sges: &[Sge]) -> Result<(), InvalidWorkRequest> {
        let cap = self.dci.qp.cap();
        if self.count >= cap.max_send_wr as usize {
            return Err(InvalidWorkRequest::BatchFull {
                capacity: cap.max_send_wr as usize,
                queue: "send",
            });
        }
        if sges.len() > cap.max_send_sge as usize {
            return Err(InvalidWorkRequest::TooManySge {
                given: sges.len(),
                max: cap.max_send_sge as usize,
                queue: "send",
            });
        }
        // SAFETY: ex is the DCI's live extended QP; its entries are plain fields the
        // provider set at creation.
        let filled = op.filled(unsafe { self.dci.ex.as_ref() });
        if !self.dci.send_ops.contains(op.flag()) || !filled {
            return Err(InvalidWorkRequest::NotEnabled { op: op.name() });
        }
        Ok(())
    }

    fn push(
        &mut self,
        wr_id: u64,
        flags: SendFlags,
        dest: DcAddress<'a>,
        op: DcOp,
        sges: &'a [Sge],
    ) {
        if self.invalid.is_some() {
            return;
        }
        if let Err(reason) = self.check(op, sges) {
            self.invalid = Some((self.count, wr_id, reason));
            return;
        }
        let ex = self.dci.ex.as_ptr();
        let mqp = self.dci.mqp.as_ptr();
        // The safety argument of every block below: ex and mqp are the live handles of this
        // guard's DCI, which the guard borrows mutably, so no other batch is open on it; the
        // calls follow the batch order mlx5dv_wr_set_dc_addr(3) gives (start, then per
        // request: wr_id/wr_flags, the opcode call, the DC address, the SGE list), and
        // check() and build_mlx5_dci verified that each entry called is filled. The SGEs and
        // the address handle are borrowed for 'a, until the batch is posted or aborted.
        if self.count == 0 {
            // SAFETY: as above; opens the batch once, for its first request.
            unsafe { ffi::ibv_wr_start(ex) };
        }
        // SAFETY: as above; plain field writes the opcode call reads. Inline data is never
        // sent from SGEs, so INLINE is cleared.
        unsafe {
            (*ex).wr_id = wr_id;
            (*ex).wr_flags = (flags - SendFlags::INLINE).bits();
        }
        // SAFETY: as above.
        unsafe {
            match op {
                DcOp::Send => ffi::ibv_wr_send(ex),
                DcOp::SendImm(imm) => ffi::ibv_wr_send_imm(ex, imm.to_be()),
                DcOp::Write { rkey, addr } => ffi::ibv_wr_rdma_write(ex, rkey, addr),
                DcOp::WriteImm { rkey, addr, imm } => {
                    ffi::ibv_wr_rdma_write_imm(ex, rkey, addr, imm.to_be())
                }
                DcOp::Read { rkey, addr } => ffi::ibv_wr_rdma_read(ex, rkey, addr),
                DcOp::FetchAdd { rkey, addr, add } => {
                    ffi::ibv_wr_atomic_fetch_add(ex, rkey, addr, add)
                }
                DcOp::CmpSwp {
                    rkey,
                    addr,
                    compare,
                    swap,
                } => ffi::ibv_wr_atomic_cmp_swp(ex, rkey, addr, compare, swap),
            }
        }
        // SAFETY: as above; the destination follows the opcode call.
        unsafe {
            ffi::mlx5dv_wr_set_dc_addr(mqp, dest.ah.as_raw(), dest.remote_dctn, dest.remote_dc_key)
        };
        // SAFETY: as above; Sge is repr(transparent) over ibv_sge.
        unsafe { ffi::ibv_wr_set_sge_list(ex, sges.len(), sges.as_ptr().cast()) };
        self.count += 1;
    }

    /// Posts the batch with one doorbell (`ibv_wr_complete`). An empty batch posts nothing
    /// and succeeds; a batch with a refused request posts nothing and says which.
    #[doc(alias = "ibv_wr_complete")]
    pub fn post(mut self) -> Result<(), PostError> {
        let qp_num = self.dci.qp.qp_num();
        let count = std::mem::take(&mut self.count);
        let ex = self.dci.ex.as_ptr();
        if let Some((index, wr_id, reason)) = self.invalid.take() {
            if count > 0 {
                // SAFETY: ex is live and inside the batch this guard started (count > 0).
                unsafe { ffi::ibv_wr_abort(ex) };
            }
            return Err(PostError::Invalid {
                qp_num,
                index,
                wr_id,
                reason,
            });
        }
        if count == 0 {
            return Ok(());
        }
        // SAFETY: ex is live and inside the batch this guard started (count > 0); complete
        // ends it (count was reset, so Drop does not abort it).
        let ret = unsafe { ffi::ibv_wr_complete(ex) };
        from_post_ret(ret).map_err(|source| PostError::Post {
            call: "ibv_wr_complete",
            qp_num,
            count,
            index: None,
            wr_id: None,
            source,
        })
    }
}

impl Drop for DcPostGuard<'_> {
    fn drop(&mut self) {
        if self.count > 0 {
            // SAFETY: ex is live and inside the batch this guard started, never completed.
            unsafe { ffi::ibv_wr_abort(self.dci.ex.as_ptr()) };
        }
    }
}
