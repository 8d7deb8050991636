//! RDMA devices: listing them, opening one, and what it says about itself.
//!
//! [`DeviceList`] wraps `ibv_get_device_list`; each [`Device`] in it keeps the list alive, so
//! devices can be held and passed around freely. [`Device::open`] (or the one-call
//! [`open_device`]) gives an `Arc<`[`DeviceContext`]`>`, the root every other verbs object
//! holds on to: the context is closed when the last object that needs it is dropped.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;
use rdma_mummy_sys::{Library, LoadError};

use crate::errno::{fresh, from_ret, non_null};
use crate::macros::c_enum;

/// What to do on a machine without an RDMA device: said by [`DeviceError::NoDevice`], and
/// by rdma_cm's calls that fail there with "No such device"
/// ([`CmError::Call`](crate::rdmacm::CmError::Call)).
pub(crate) const NO_DEVICE_HELP: &str = "without an RDMA NIC, create a SoftRoCE device \
     (`rdma link add rxe0 type rxe netdev IFACE`, kernel module rdma_rxe), or run inside the \
     project's rig: scripts/softroce run -- COMMAND";

/// Why a device could not be listed, opened or queried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// libibverbs could not be loaded at all.
    #[error(transparent)]
    Library(#[from] LoadError),
    /// `ibv_get_device_list` failed (most often: the kernel's uverbs module is not loaded).
    #[error("failed to list RDMA devices (is the ib_uverbs kernel module loaded?): {source}")]
    List {
        /// The errno.
        source: io::Error,
    },
    /// There is no RDMA device on this machine.
    #[error("no RDMA device found; {NO_DEVICE_HELP}")]
    NoDevice,
    /// No device has the name asked for.
    #[error("no RDMA device named {name:?}; available: {}", available.join(", "))]
    NotFound {
        /// The name asked for.
        name: String,
        /// The names of the devices that do exist.
        available: Vec<String>,
    },
    /// `ibv_open_device` failed.
    #[error("failed to open RDMA device {device}: {source}")]
    Open {
        /// The device's name.
        device: String,
        /// The errno.
        source: io::Error,
    },
    /// A port number outside `1..=phys_port_cnt`.
    #[error("{device} has no port {port}; its ports are 1..={port_count}")]
    NoSuchPort {
        /// The device's name.
        device: String,
        /// The port asked for.
        port: u8,
        /// How many ports the device has.
        port_count: u8,
    },
    /// A GID index outside the port's GID table.
    #[error("{device} port {port} has no GID index {index}; its GID table has {table_len} entries{}",
        if *empty { " (that entry is empty)" } else { "" })]
    NoSuchGid {
        /// The device's name.
        device: String,
        /// The port.
        port: u8,
        /// The index asked for.
        index: u8,
        /// The port's GID table length.
        table_len: u32,
        /// True when the index is inside the table but the entry is unused (all zero).
        empty: bool,
    },
    /// No RoCE v2 GID of the port carries the IPv4 address asked for (or, when none was
    /// named, any IPv4 address): see [`DeviceContext::roce_v2_ipv4_gid`].
    #[error("{device} port {port} has no RoCE v2 GID {}: give its network interface {} (ip addr add), or pick a GID index by hand",
        addr.map(|a| format!("for {a}")).unwrap_or_else(|| "with an IPv4 address".into()),
        addr.map(|a| a.to_string()).unwrap_or_else(|| "an IPv4 address".into()))]
    NoRoceV2Ipv4Gid {
        /// The device's name.
        device: String,
        /// The port.
        port: u8,
        /// The address asked for; `None` for any.
        addr: Option<Ipv4Addr>,
    },
    /// The device is mlx5 and `MLX5_SINGLE_THREADED=1` is set: libmlx5 would take none of
    /// the locks the crate's `Sync` types rely on (`docs/soundness.md`, rule 12).
    #[error("{}", super::locking::refusal(device))]
    UnlockedProvider {
        /// The device's name.
        device: String,
    },
    /// A query verb failed.
    #[error("{call} failed on {device}{}: {source}", port.map(|p| format!(" port {p}")).unwrap_or_default())]
    Query {
        /// The verb that failed.
        call: &'static str,
        /// The device's name.
        device: String,
        /// The port, when the query was about one.
        port: Option<u8>,
        /// The errno.
        source: io::Error,
    },
}

/// The result of device operations.
pub type DeviceResult<T> = Result<T, DeviceError>;

pub(crate) fn ensure_ibverbs() -> DeviceResult<()> {
    Library::Ibverbs.load().map_err(DeviceError::Library)
}

struct RawList {
    list: NonNull<*mut ffi::ibv_device>,
    len: usize,
}

impl Drop for RawList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed exactly once, here,
        // after every Device (which holds an Arc of this) is gone.
        unsafe { ffi::ibv_free_device_list(self.list.as_ptr()) };
    }
}

// SAFETY: the device list is immutable after ibv_get_device_list returns, and libibverbs'
// device objects may be used from any thread.
unsafe impl Send for RawList {}
// SAFETY: as above; nothing mutates the list through a shared reference.
unsafe impl Sync for RawList {}

/// The RDMA devices present, from one `ibv_get_device_list` call.
#[doc(alias = "ibv_get_device_list")]
#[derive(Clone)]
pub struct DeviceList {
    /// `None` on a machine whose kernel has no RDMA support at all.
    raw: Option<Arc<RawList>>,
}

impl DeviceList {
    /// Lists the devices (`ibv_get_device_list`). An empty list is not an error here; see
    /// [`open_device`] for the call that insists on a device.
    #[doc(alias = "ibv_get_device_list")]
    pub fn new() -> DeviceResult<Self> {
        ensure_ibverbs()?;
        let mut n: c_int = 0;
        // SAFETY: n is a valid out-pointer; the returned array is owned by RawList.
        let list = fresh(|| unsafe { ffi::ibv_get_device_list(&mut n) });
        let list = match non_null(list) {
            Ok(list) => list,
            // A kernel without RDMA support (no /sys/class/infiniband) answers ENOSYS: that
            // is a machine with no device, not a failure to list.
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return Ok(DeviceList::empty()),
            Err(source) => return Err(DeviceError::List { source }),
        };
        Ok(DeviceList {
            raw: Some(Arc::new(RawList {
                list,
                len: usize::try_from(n).unwrap_or(0),
            })),
        })
    }

    fn empty() -> Self {
        DeviceList { raw: None }
    }

    /// How many devices there are.
    pub fn len(&self) -> usize {
        self.raw.as_ref().map_or(0, |r| r.len)
    }

    /// True when there is no device.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The devices, in the order libibverbs lists them.
    pub fn iter(&self) -> impl Iterator<Item = Device> + '_ {
        self.raw.iter().flat_map(|list| {
            (0..list.len).map(move |i| {
                // SAFETY: i < len, and the array holds len valid device pointers.
                let raw = unsafe { *list.list.as_ptr().add(i) };
                Device {
                    list: Arc::clone(list),
                    raw,
                }
            })
        })
    }

    /// The device with this name, or an error that lists the names there are.
    pub fn find(&self, name: &str) -> DeviceResult<Device> {
        if let Some(d) = self.iter().find(|d| d.name() == name) {
            return Ok(d);
        }
        if self.is_empty() {
            return Err(DeviceError::NoDevice);
        }
        Err(DeviceError::NotFound {
            name: name.to_owned(),
            available: self.iter().map(|d| d.name()).collect(),
        })
    }
}

impl fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One RDMA device of a [`DeviceList`] (`struct ibv_device`), not yet opened.
#[doc(alias = "ibv_device")]
#[derive(Clone)]
pub struct Device {
    list: Arc<RawList>,
    raw: *mut ffi::ibv_device,
}

// SAFETY: an ibv_device is immutable, and the list it lives in is kept alive by `list`.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    /// The kernel name of the device (`ibv_get_device_name`), e.g. `mlx5_0` or `rxe0`.
    #[doc(alias = "ibv_get_device_name")]
    pub fn name(&self) -> String {
        // SAFETY: raw is a live device of the list we hold; the name is a NUL-terminated
        // string inside it.
        let name = unsafe { ffi::ibv_get_device_name(self.raw) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, alive as long as the list.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// The node GUID (`ibv_get_device_guid`), in host order.
    #[doc(alias = "ibv_get_device_guid")]
    pub fn guid(&self) -> u64 {
        // SAFETY: raw is a live device of the list we hold.
        u64::from_be(unsafe { ffi::ibv_get_device_guid(self.raw) })
    }

    /// The transport (InfiniBand for IB and RoCE, iWARP, ...).
    pub fn transport_type(&self) -> TransportType {
        // SAFETY: raw is a live device; reading a plain field.
        TransportType::from(unsafe { (*self.raw).transport_type } as u32)
    }

    /// The node type (`ibv_node_type`).
    pub fn node_type(&self) -> NodeType {
        // SAFETY: raw is a live device; reading a plain field.
        NodeType::from(unsafe { (*self.raw).node_type } as u32)
    }

    /// Opens the device (`ibv_open_device`).
    #[doc(alias = "ibv_open_device")]
    pub fn open(&self) -> DeviceResult<Arc<DeviceContext>> {
        if super::locking::unlocked(&self.name()) {
            return Err(DeviceError::UnlockedProvider {
                device: self.name(),
            });
        }
        // SAFETY: raw is a live device of the list we hold.
        let ctx = fresh(|| unsafe { ffi::ibv_open_device(self.raw) });
        let ctx = non_null(ctx).map_err(|source| DeviceError::Open {
            device: self.name(),
            source,
        })?;
        let _ = &self.list; // the context does not need the list once open
        Ok(Arc::new(DeviceContext {
            raw: ctx,
            name: self.name(),
            lender: None,
            kept: std::sync::Mutex::new(Vec::new()),
        }))
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name())
            .field("guid", &format_args!("{:#018x}", self.guid()))
            .field("transport_type", &self.transport_type())
            .finish()
    }
}

/// Opens the device named `name`, or the first device when `name` is `None`. The errors say
/// when there is no device at all (and how to get one) and list the devices there are when
/// the name matches none.
pub fn open_device(name: Option<&str>) -> DeviceResult<Arc<DeviceContext>> {
    let list = DeviceList::new()?;
    let device = match name {
        Some(name) => list.find(name)?,
        None => list.iter().next().ok_or(DeviceError::NoDevice)?,
    };
    device.open()
}

/// An open device (`struct ibv_context`): the root of every other verbs object.
///
/// Always held in an `Arc`; protection domains, completion queues and channels hold a clone,
/// so the device is closed (`ibv_close_device`) only after all of them.
///
/// ```no_run
/// # fn demo() -> Result<(), sideway::Report> {
/// let ctx = sideway::open_device(None)?; // or Some("mlx5_0")
/// let attr = ctx.query_device()?;
/// println!("{}: {} ports, fw {}", ctx.name(), attr.phys_port_cnt(), attr.fw_ver());
/// for port in 1..=ctx.port_count()? {
///     let p = ctx.query_port(port)?;
///     println!("port {port}: {:?}, {:?}, LID {:#x}", p.state(), p.link_layer(), p.lid());
/// }
/// for entry in ctx.query_gid_table()? {
///     println!("port {} GID[{}] {:?} ({})", entry.port, entry.index, entry.gid, entry.gid_type);
/// }
/// let pd = ctx.alloc_pd()?; // every other object starts from here
/// # let _ = pd;
/// # Ok(()) }
/// ```
#[doc(alias = "ibv_context")]
pub struct DeviceContext {
    raw: NonNull<ffi::ibv_context>,
    pub(super) name: String,
    /// `Some` when the context is not ours to close: librdmacm opened it, and this value
    /// (its device list reference) keeps it open until dropped; or a test double's owner
    /// ([`ForeignObjects`], from `from_raw_parts`).
    lender: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Values kept until the context closes, after every object made from it: memory that a
    /// request still queued in one of its queues may name
    /// ([`keep_until_closed`](Self::keep_until_closed)).
    kept: std::sync::Mutex<Vec<Box<dyn std::any::Any + Send + Sync>>>,
}

/// The `lender` of a context from [`DeviceContext::from_raw_parts`]: keeps the owner of its
/// objects alive, and marks them as not sideway's to destroy.
struct ForeignObjects {
    _owner: Box<dyn std::any::Any + Send + Sync>,
}

// SAFETY: libibverbs contexts are thread-safe: every verb on a context may be called from any
// thread.
unsafe impl Send for DeviceContext {}
// SAFETY: as above.
unsafe impl Sync for DeviceContext {}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        if self.lender.is_some() {
            // librdmacm owns the context; dropping `lender` gives back our reference to it.
            return;
        }
        // SAFETY: raw came from ibv_open_device and every child object holding an Arc of
        // this context is gone, so this is the last use.
        let ret = fresh(|| unsafe { ffi::ibv_close_device(self.raw.as_ptr()) });
        if let Err(e) = from_ret(ret) {
            crate::diagnostics::report_drop_failure("ibv_close_device", &self.name, &e);
        }
    }
}

impl fmt::Debug for DeviceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceContext")
            .field("name", &self.name)
            .finish()
    }
}

impl DeviceContext {
    /// Wraps a context that someone else opened and will close (librdmacm's, from an
    /// `rdma_cm_id`): dropping the wrapper never calls `ibv_close_device`, only drops `lender`.
    ///
    /// # Safety
    ///
    /// `raw` is an open context that stays open for as long as `lender` is alive.
    pub(crate) unsafe fn from_lent(
        raw: NonNull<ffi::ibv_context>,
        lender: Box<dyn std::any::Any + Send + Sync>,
    ) -> Arc<DeviceContext> {
        Arc::new(DeviceContext {
            raw,
            // SAFETY: the caller guarantees raw is open.
            name: unsafe { context_device_name(raw) },
            lender: Some(lender),
            kept: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Keeps `value` until this context closes (dropped after `ibv_close_device`, or after
    /// the last wrapper of a lent context goes): by then no queue made from the context
    /// exists, so no queued request can name memory that `value` owns.
    pub(crate) fn keep_until_closed(&self, value: Box<dyn std::any::Any + Send + Sync>) {
        self.kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(value);
    }

    /// Refuses a context whose provider runs without the locks the crate relies on
    /// ([`DeviceError::UnlockedProvider`]): for contexts opened by another verb than
    /// [`Device::open`] (which refuses before opening).
    pub(crate) fn refuse_if_unlocked(&self) -> DeviceResult<()> {
        if super::locking::unlocked(self.name()) {
            return Err(DeviceError::UnlockedProvider {
                device: self.name().to_owned(),
            });
        }
        Ok(())
    }

    /// Wraps a context libibverbs opened for sideway by another verb than `ibv_open_device`
    /// (`ibv_import_device`): closed with `ibv_close_device` like any.
    ///
    /// # Safety
    ///
    /// `raw` is an open context that nothing else closes.
    pub(crate) unsafe fn from_opened(raw: NonNull<ffi::ibv_context>) -> Arc<DeviceContext> {
        Arc::new(DeviceContext {
            raw,
            // SAFETY: the caller guarantees raw is open.
            name: unsafe { context_device_name(raw) },
            lender: None,
            kept: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Wraps a context that sideway did not open, for test doubles such as the benchmarks'
    /// null provider: nothing built on it is ever destroyed by sideway. Dropping the returned
    /// context, and every [`ProtectionDomain`](crate::protection_domain::ProtectionDomain),
    /// [`CompletionQueue`](crate::completion_queue::CompletionQueue) and
    /// [`QueuePair`](crate::queue_pair::QueuePair) wrapped around objects of it (their
    /// `from_raw_parts`/`wrap_raw` constructors), calls no destroy verb; `owner` is dropped when
    /// the context is, after all of them.
    ///
    /// # Safety
    ///
    /// - `raw` and every object later wrapped with this context must stay valid until
    ///   `owner` is dropped (typically `owner` is what keeps their memory).
    /// - Only the data path may be used on this context and the objects wrapped around it:
    ///   posting, polling and reading their plain fields, which call the provider function
    ///   pointers stored in the objects (`ops.post_send`, `qp_ex->wr_*`, `cq_ex->start_poll`,
    ///   ...) exactly as verbs.h's inlines do. Those pointers must behave as verbs.h
    ///   documents. Every other method calls libibverbs with these pointers, which requires
    ///   a context libibverbs opened, and must not be called.
    #[doc(hidden)]
    pub unsafe fn from_raw_parts(
        raw: NonNull<ffi::ibv_context>,
        name: &str,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Arc<DeviceContext> {
        Arc::new(DeviceContext {
            raw,
            name: name.to_owned(),
            lender: Some(Box::new(ForeignObjects { _owner: owner })),
            kept: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// False for a context made by [`from_raw_parts`](Self::from_raw_parts): the objects
    /// wrapped with it belong to its owner, and their wrappers destroy nothing on drop.
    pub(crate) fn owns_objects(&self) -> bool {
        !self
            .lender
            .as_ref()
            .is_some_and(|lender| (**lender).is::<ForeignObjects>())
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many completion vectors (interrupts) CQs can be spread over (`num_comp_vectors`).
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: the context is open; reading a plain field it was created with.
        u32::try_from(unsafe { (*self.raw.as_ptr()).num_comp_vectors }).unwrap_or(0)
    }

    /// The raw `ibv_context`, for calls this crate does not wrap. It stays valid while this
    /// context is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_context {
        self.raw.as_ptr()
    }

    pub(super) fn query_err(
        &self,
        call: &'static str,
        port: Option<u8>,
        source: io::Error,
    ) -> DeviceError {
        DeviceError::Query {
            call,
            device: self.name.clone(),
            port,
            source,
        }
    }
}

/// The name of an open context's device ("" when libibverbs does not say).
///
/// # Safety
///
/// `raw` is an open context.
unsafe fn context_device_name(raw: NonNull<ffi::ibv_context>) -> String {
    // SAFETY: the caller guarantees raw is open; its device pointer is set by libibverbs.
    let device = unsafe { (*raw.as_ptr()).device };
    if device.is_null() {
        return String::new();
    }
    // SAFETY: a live device; the name is a NUL-terminated string inside it.
    let name = unsafe { ffi::ibv_get_device_name(device) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL, NUL-terminated, alive as long as the device.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

c_enum! {
    /// How the device talks to the network.
    pub enum TransportType: "ibv_transport_type" {
        /// InfiniBand, and RoCE (InfiniBand transport over Ethernet).
        Infiniband = ffi::ibv_transport_type::IBV_TRANSPORT_IB,
        /// iWARP.
        Iwarp = ffi::ibv_transport_type::IBV_TRANSPORT_IWARP,
        /// Cisco usNIC.
        Usnic = ffi::ibv_transport_type::IBV_TRANSPORT_USNIC,
        /// Cisco usNIC over UDP.
        UsnicUdp = ffi::ibv_transport_type::IBV_TRANSPORT_USNIC_UDP,
        /// Unspecified.
        Unspecified = ffi::ibv_transport_type::IBV_TRANSPORT_UNSPECIFIED,
    }
}

c_enum! {
    /// What kind of node the device is.
    pub enum NodeType: "ibv_node_type" {
        /// A channel adapter (HCA): the usual case, RoCE included.
        Ca = ffi::ibv_node_type::IBV_NODE_CA,
        /// A switch.
        Switch = ffi::ibv_node_type::IBV_NODE_SWITCH,
        /// A router.
        Router = ffi::ibv_node_type::IBV_NODE_ROUTER,
        /// An iWARP RNIC.
        Rnic = ffi::ibv_node_type::IBV_NODE_RNIC,
        /// Cisco usNIC.
        Usnic = ffi::ibv_node_type::IBV_NODE_USNIC,
        /// Cisco usNIC over UDP.
        UsnicUdp = ffi::ibv_node_type::IBV_NODE_USNIC_UDP,
        /// Unspecified.
        Unspecified = ffi::ibv_node_type::IBV_NODE_UNSPECIFIED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::device::{DeviceCapFlags, Mtu, PortSpeed, PortState, PortWidth};

    #[test]
    fn unknown_enum_values_survive() {
        assert_eq!(PortState::from(4), PortState::Active);
        assert!(matches!(PortState::from(77), PortState::Unknown(v) if v.get() == 77));
        assert_eq!(u32::from(PortState::from(77)), 77);
        assert!(matches!(PortSpeed::from(512), PortSpeed::Unknown(v) if v.get() == 512));
        assert_eq!(PortSpeed::Edr.gbps_per_lane(), Some(25.78125));
        assert_eq!(PortWidth::from(2).lanes(), Some(4));
        assert!(matches!(
            TransportType::from(u32::MAX),
            TransportType::Unknown(v) if v.get() == u32::MAX
        ));
    }

    #[test]
    fn mtu_bytes_round_trip() {
        for bytes in [256, 512, 1024, 2048, 4096] {
            assert_eq!(Mtu::from_bytes(bytes).and_then(Mtu::bytes), Some(bytes));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from(3), Mtu::Mtu1024);
    }

    #[test]
    fn unknown_capability_bits_are_kept() {
        let f = DeviceCapFlags::from_bits_retain(1 << 40 | 1);
        assert!(f.contains(DeviceCapFlags::RESIZE_MAX_WR));
        assert_eq!(f.bits(), 1 << 40 | 1);
    }

    #[test]
    fn errors_say_what_to_do() {
        let e = DeviceError::NotFound {
            name: "mlx9".into(),
            available: vec!["rxe0".into(), "mlx5_0".into()],
        };
        assert_eq!(
            e.to_string(),
            "no RDMA device named \"mlx9\"; available: rxe0, mlx5_0"
        );
        assert!(DeviceError::NoDevice.to_string().contains("rdma link add"));
        let e = DeviceError::NoSuchPort {
            device: "rxe0".into(),
            port: 9,
            port_count: 1,
        };
        assert_eq!(e.to_string(), "rxe0 has no port 9; its ports are 1..=1");
    }
}
