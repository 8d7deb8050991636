//! RDMA devices: listing them, opening one, and what it says about itself.
//!
//! [`DeviceList`] wraps `ibv_get_device_list`; each [`Device`] in it keeps the list alive, so
//! devices can be held and passed around freely. [`Device::open`] (or the one-call
//! [`open_device`]) gives an `Arc<`[`DeviceContext`]`>`, the root every other verbs object
//! holds on to: the context is closed when the last object that needs it is dropped.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::net::Ipv4Addr;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use bitflags::bitflags;
use rdma_mummy_sys as ffi;
use rdma_mummy_sys::{Library, LoadError};

use crate::errno::{count_from_ret, fresh, from_ret, non_null};
use crate::gid::Gid;
use crate::macros::c_enum;

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
    #[error(
        "no RDMA device found; without an RDMA NIC, create a SoftRoCE device \
         (`rdma link add rxe0 type rxe netdev IFACE`, kernel module rdma_rxe), or run inside \
         the project's rig: scripts/softroce run -- COMMAND"
    )]
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

fn ensure_ibverbs() -> DeviceResult<()> {
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
    name: String,
    /// `Some` when the context is not ours to close: librdmacm opened it, and this value
    /// (its device list reference) keeps it open until dropped; or a test double's owner
    /// ([`ForeignObjects`], from `from_raw_parts`).
    lender: Option<Box<dyn std::any::Any + Send + Sync>>,
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
        // SAFETY: the caller guarantees raw is open; its device pointer is set by libibverbs.
        let device = unsafe { (*raw.as_ptr()).device };
        let name = if device.is_null() {
            String::new()
        } else {
            // SAFETY: a live device; the name is a NUL-terminated string inside it.
            let name = unsafe { ffi::ibv_get_device_name(device) };
            if name.is_null() {
                String::new()
            } else {
                // SAFETY: non-NULL, NUL-terminated, alive as long as the device.
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            }
        };
        Arc::new(DeviceContext {
            raw,
            name,
            lender: Some(lender),
        })
    }

    /// Wraps a context that sideway did not open, for test doubles such as the benchmarks'
    /// null provider: nothing built on it is ever destroyed by sideway. Dropping the returned
    /// context, and every [`ProtectionDomain`](crate::ProtectionDomain),
    /// [`CompletionQueue`](crate::CompletionQueue) and [`QueuePair`](crate::queue_pair::QueuePair)
    /// wrapped around objects of it (their `from_raw_parts`/`wrap_raw` constructors), calls
    /// no destroy verb; `owner` is dropped when the context is, after all of them.
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

    fn query_err(&self, call: &'static str, port: Option<u8>, source: io::Error) -> DeviceError {
        DeviceError::Query {
            call,
            device: self.name.clone(),
            port,
            source,
        }
    }

    /// The device's attributes and capabilities (`ibv_query_device_ex`).
    #[doc(alias = "ibv_query_device_ex")]
    #[doc(alias = "ibv_query_device")]
    pub fn query_device(&self) -> DeviceResult<DeviceAttr> {
        let mut attr = MaybeUninit::<ffi::ibv_device_attr_ex>::zeroed();
        // SAFETY: the context is open; a NULL input asks for the default query; attr is a
        // valid, zeroed out-parameter of the right type.
        let ret = fresh(|| unsafe {
            ffi::ibv_query_device_ex(self.as_raw(), std::ptr::null(), attr.as_mut_ptr())
        });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_device_ex", None, e))?;
        // SAFETY: zero is a valid bit pattern for this plain C struct, and the verb filled it.
        let raw = unsafe { attr.assume_init() };
        Ok(DeviceAttr { raw })
    }

    /// The number of physical ports (`phys_port_cnt`); they are numbered `1..=port_count`.
    pub fn port_count(&self) -> DeviceResult<u8> {
        Ok(self.query_device()?.raw.orig_attr.phys_port_cnt)
    }

    fn check_port(&self, port: u8) -> DeviceResult<u8> {
        let port_count = self.port_count()?;
        if port == 0 || port > port_count {
            return Err(DeviceError::NoSuchPort {
                device: self.name.clone(),
                port,
                port_count,
            });
        }
        Ok(port)
    }

    /// A port's attributes (`ibv_query_port`); ports are numbered from 1.
    ///
    /// Ports are `u8` throughout the crate, as the verbs carry them (`port_num` of
    /// `ibv_qp_attr`, `ibv_ah_attr`, `rdma_cm_id`); GID indexes are `u8` too, as
    /// `sgid_index` carries them.
    #[doc(alias = "ibv_query_port")]
    pub fn query_port(&self, port: u8) -> DeviceResult<PortAttr> {
        let port_num = self.check_port(port)?;
        let mut attr = MaybeUninit::<ffi::ibv_port_attr>::zeroed();
        // SAFETY: the context is open, the port exists, attr is a valid out-parameter.
        let ret =
            fresh(|| unsafe { ffi::ibv_query_port(self.as_raw(), port_num, attr.as_mut_ptr()) });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_port", Some(port), e))?;
        // SAFETY: plain C struct, zero-initialised and filled by the verb.
        let raw = unsafe { attr.assume_init() };
        Ok(PortAttr { raw })
    }

    /// One GID table entry with its type and network device (`ibv_query_gid_ex`, or
    /// `ibv_query_gid` plus sysfs on rdma-core builds that lack it). An index past the table
    /// or an empty entry is a [`DeviceError::NoSuchGid`] that says which.
    #[doc(alias = "ibv_query_gid_ex")]
    #[doc(alias = "ibv_query_gid")]
    pub fn query_gid(&self, port: u8, index: u8) -> DeviceResult<GidEntry> {
        let table_len = self.query_port(port)?.gid_table_len();
        let no_such = |empty| DeviceError::NoSuchGid {
            device: self.name.clone(),
            port,
            index,
            table_len,
            empty,
        };
        if u32::from(index) >= table_len {
            return Err(no_such(false));
        }
        let mut entry = MaybeUninit::<ffi::ibv_gid_entry>::zeroed();
        // SAFETY: the context is open, port and index are in range, entry is a valid
        // out-parameter; flags must be 0.
        let ret = fresh(|| unsafe {
            ffi::ibv_query_gid_ex(
                self.as_raw(),
                u32::from(port),
                u32::from(index),
                entry.as_mut_ptr(),
                0,
            )
        });
        match from_ret(ret) {
            // SAFETY: plain C struct, filled by the verb.
            Ok(()) => GidEntry::from_raw(&unsafe { entry.assume_init() }).ok_or_else(|| {
                self.query_err(
                    "ibv_query_gid_ex",
                    Some(port),
                    io::Error::new(io::ErrorKind::InvalidData, "a port or index past 255"),
                )
            }),
            // The kernel reports unused entries as ENODATA (and some as EINVAL).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA) | Some(libc::EINVAL)) => {
                Err(no_such(true))
            }
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => self
                .query_gid_legacy(port, index)?
                .ok_or_else(|| no_such(true)),
            Err(e) => Err(self.query_err("ibv_query_gid_ex", Some(port), e)),
        }
    }

    /// The GID table of every port, unused entries left out (`ibv_query_gid_table`, or one
    /// `ibv_query_gid` per entry plus sysfs for the type and netdev on older rdma-core).
    /// Entries past index 255 are left out too: no work request or address can name them
    /// (`sgid_index` is 8 bits).
    #[doc(alias = "ibv_query_gid_table")]
    pub fn query_gid_table(&self) -> DeviceResult<Vec<GidEntry>> {
        let mut max = 0usize;
        let ports = self.port_count()?;
        for port in 1..=ports {
            max += self.query_port(port)?.gid_table_len() as usize;
        }
        let mut entries: Vec<ffi::ibv_gid_entry> = vec![Default::default(); max];
        // SAFETY: entries has room for max entries; flags must be 0.
        let n = fresh(|| unsafe {
            ffi::ibv_query_gid_table(self.as_raw(), entries.as_mut_ptr(), max, 0)
        });
        match count_from_ret(n) {
            Ok(n) => {
                entries.truncate(n);
                return Ok(entries.iter().filter_map(GidEntry::from_raw).collect());
            }
            Err(e) if e.raw_os_error() != Some(libc::EOPNOTSUPP) => {
                return Err(self.query_err("ibv_query_gid_table", None, e));
            }
            // An older provider: entry by entry below.
            Err(_) => {}
        }
        let mut out = Vec::new();
        for port in 1..=ports {
            let len = self.query_port(port)?.gid_table_len();
            for index in (0..=u8::MAX).take(len as usize) {
                out.extend(self.query_gid_legacy(port, index)?);
            }
        }
        Ok(out)
    }

    /// The RoCE v2 GID of `port` whose IPv4-mapped address is `addr`, or with `None` the
    /// IPv4-mapped RoCE v2 GID of lowest index: the GID to send from on a RoCE network
    /// that routes IPv4 (what `ibv_rc_pingpong -g` and perftest's `-x` are usually given).
    /// Reads the whole table ([`query_gid_table`](Self::query_gid_table)); a port without
    /// such a GID is a [`DeviceError::NoRoceV2Ipv4Gid`] that says what to do.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), sideway::DeviceError> {
    /// let ctx = sideway::open_device(Some("rxe0"))?;
    /// let entry = ctx.roce_v2_ipv4_gid(1, Some("198.18.0.1".parse().unwrap()))?;
    /// let mut opts = sideway::ConnectOptions::new();
    /// opts.port_num(1).gid_index(entry.index);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_query_gid_table")]
    pub fn roce_v2_ipv4_gid(&self, port: u8, addr: Option<Ipv4Addr>) -> DeviceResult<GidEntry> {
        self.check_port(port)?;
        let table = self.query_gid_table()?;
        pick_roce_v2_ipv4(&table, port, addr)
            .cloned()
            .ok_or_else(|| DeviceError::NoRoceV2Ipv4Gid {
                device: self.name.clone(),
                port,
                addr,
            })
    }

    /// `ibv_query_gid` for the GID, sysfs for its type and network device: what older
    /// rdma-core offers. `None` for an unused (all-zero) entry.
    fn query_gid_legacy(&self, port: u8, index: u8) -> DeviceResult<Option<GidEntry>> {
        let mut gid = ffi::ibv_gid::default();
        let port_num = self.check_port(port)?;
        let index_c = c_int::from(index);
        // SAFETY: the context is open, gid is a valid out-parameter.
        let ret =
            fresh(|| unsafe { ffi::ibv_query_gid(self.as_raw(), port_num, index_c, &mut gid) });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_gid", Some(port), e))?;
        // SAFETY: every bit pattern of the union's raw bytes is valid.
        let gid = Gid::from_raw(unsafe { gid.raw });
        if gid.is_zero() {
            return Ok(None);
        }
        let attrs = format!("/sys/class/infiniband/{}/ports/{port}/gid_attrs", self.name);
        let read = |what: &str| {
            std::fs::read_to_string(format!("{attrs}/{what}/{index}"))
                .map(|s| s.trim().to_owned())
                .ok()
        };
        let gid_type = match read("types").as_deref() {
            Some("RoCE v2") => GidType::RoceV2,
            Some(t) if t.contains("RoCE") => GidType::RoceV1,
            _ => GidType::Ib,
        };
        Ok(Some(GidEntry {
            gid,
            index,
            port,
            gid_type,
            netdev: read("ndevs"),
        }))
    }

    /// One entry of a port's P_Key table (`ibv_query_pkey`), in host order.
    #[doc(alias = "ibv_query_pkey")]
    pub fn query_pkey(&self, port: u8, index: u16) -> DeviceResult<u16> {
        let port_num = self.check_port(port)?;
        let mut pkey: u16 = 0;
        // SAFETY: the context is open, the port exists, pkey is a valid out-parameter.
        let ret = fresh(|| unsafe {
            ffi::ibv_query_pkey(self.as_raw(), port_num, c_int::from(index), &mut pkey)
        });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_pkey", Some(port), e))?;
        Ok(u16::from_be(pkey))
    }

    /// The device's free-running clock in raw cycles (`ibv_query_rt_values_ex` with
    /// `IBV_VALUES_MASK_RAW_CLOCK`), as `(seconds, nanoseconds)` fields of the raw value.
    /// Devices without a hardware clock (SoftRoCE) return an `EOPNOTSUPP` query error.
    #[doc(alias = "ibv_query_rt_values_ex")]
    #[allow(clippy::unnecessary_cast)] // time_t and long are 32 bits on 32-bit targets
    pub fn query_raw_clock(&self) -> DeviceResult<RawClock> {
        let mut values = ffi::ibv_values_ex {
            comp_mask: ffi::ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK,
            raw_clock: ffi::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        // SAFETY: the context is open, values is valid and asks for the raw clock only.
        let ret = fresh(|| unsafe { ffi::ibv_query_rt_values_ex(self.as_raw(), &mut values) });
        from_ret(ret).map_err(|e| self.query_err("ibv_query_rt_values_ex", None, e))?;
        if values.comp_mask & ffi::ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK == 0 {
            return Err(self.query_err(
                "ibv_query_rt_values_ex",
                None,
                io::Error::from_raw_os_error(libc::EOPNOTSUPP),
            ));
        }
        Ok(RawClock {
            seconds: values.raw_clock.tv_sec as i64,
            nanoseconds: values.raw_clock.tv_nsec as i64,
        })
    }
}

/// The device's raw clock as `ibv_query_rt_values_ex` reports it (a `timespec` whose fields
/// hold the raw cycle counter as the provider chooses to split it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawClock {
    /// `raw_clock.tv_sec`.
    pub seconds: i64,
    /// `raw_clock.tv_nsec`.
    pub nanoseconds: i64,
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

c_enum! {
    /// Which atomic operations are atomic with respect to what.
    pub enum AtomicCap: "ibv_atomic_cap" {
        /// No atomic operations.
        None = ffi::ibv_atomic_cap::IBV_ATOMIC_NONE,
        /// Atomic among operations through this HCA.
        Hca = ffi::ibv_atomic_cap::IBV_ATOMIC_HCA,
        /// Atomic with respect to every access, the CPU's included.
        Global = ffi::ibv_atomic_cap::IBV_ATOMIC_GLOB,
    }
}

bitflags! {
    /// Device capability flags (`ibv_device_cap_flags`); bits unknown to this crate are kept.
    #[doc(alias = "ibv_device_cap_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct DeviceCapFlags: u64 {
        /// `IBV_DEVICE_RESIZE_MAX_WR`
        const RESIZE_MAX_WR = ffi::ibv_device_cap_flags::IBV_DEVICE_RESIZE_MAX_WR as u64;
        /// `IBV_DEVICE_BAD_PKEY_CNTR`
        const BAD_PKEY_CNTR = ffi::ibv_device_cap_flags::IBV_DEVICE_BAD_PKEY_CNTR as u64;
        /// `IBV_DEVICE_BAD_QKEY_CNTR`
        const BAD_QKEY_CNTR = ffi::ibv_device_cap_flags::IBV_DEVICE_BAD_QKEY_CNTR as u64;
        /// `IBV_DEVICE_RAW_MULTI`
        const RAW_MULTI = ffi::ibv_device_cap_flags::IBV_DEVICE_RAW_MULTI as u64;
        /// `IBV_DEVICE_AUTO_PATH_MIG`
        const AUTO_PATH_MIG = ffi::ibv_device_cap_flags::IBV_DEVICE_AUTO_PATH_MIG as u64;
        /// `IBV_DEVICE_CHANGE_PHY_PORT`
        const CHANGE_PHY_PORT = ffi::ibv_device_cap_flags::IBV_DEVICE_CHANGE_PHY_PORT as u64;
        /// `IBV_DEVICE_UD_AV_PORT_ENFORCE`
        const UD_AV_PORT_ENFORCE = ffi::ibv_device_cap_flags::IBV_DEVICE_UD_AV_PORT_ENFORCE as u64;
        /// `IBV_DEVICE_CURR_QP_STATE_MOD`
        const CURR_QP_STATE_MOD = ffi::ibv_device_cap_flags::IBV_DEVICE_CURR_QP_STATE_MOD as u64;
        /// `IBV_DEVICE_SHUTDOWN_PORT`
        const SHUTDOWN_PORT = ffi::ibv_device_cap_flags::IBV_DEVICE_SHUTDOWN_PORT as u64;
        /// `IBV_DEVICE_INIT_TYPE`
        const INIT_TYPE = ffi::ibv_device_cap_flags::IBV_DEVICE_INIT_TYPE as u64;
        /// `IBV_DEVICE_PORT_ACTIVE_EVENT`
        const PORT_ACTIVE_EVENT = ffi::ibv_device_cap_flags::IBV_DEVICE_PORT_ACTIVE_EVENT as u64;
        /// `IBV_DEVICE_SYS_IMAGE_GUID`
        const SYS_IMAGE_GUID = ffi::ibv_device_cap_flags::IBV_DEVICE_SYS_IMAGE_GUID as u64;
        /// `IBV_DEVICE_RC_RNR_NAK_GEN`
        const RC_RNR_NAK_GEN = ffi::ibv_device_cap_flags::IBV_DEVICE_RC_RNR_NAK_GEN as u64;
        /// `IBV_DEVICE_SRQ_RESIZE`
        const SRQ_RESIZE = ffi::ibv_device_cap_flags::IBV_DEVICE_SRQ_RESIZE as u64;
        /// `IBV_DEVICE_N_NOTIFY_CQ`
        const N_NOTIFY_CQ = ffi::ibv_device_cap_flags::IBV_DEVICE_N_NOTIFY_CQ as u64;
        /// `IBV_DEVICE_MEM_WINDOW`
        const MEM_WINDOW = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW as u64;
        /// `IBV_DEVICE_UD_IP_CSUM`
        const UD_IP_CSUM = ffi::ibv_device_cap_flags::IBV_DEVICE_UD_IP_CSUM as u64;
        /// `IBV_DEVICE_XRC`
        const XRC = ffi::ibv_device_cap_flags::IBV_DEVICE_XRC as u64;
        /// `IBV_DEVICE_MEM_MGT_EXTENSIONS`
        const MEM_MGT_EXTENSIONS = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS as u64;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`
        const MEM_WINDOW_TYPE_2A = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A as u64;
        /// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`
        const MEM_WINDOW_TYPE_2B = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B as u64;
        /// `IBV_DEVICE_RC_IP_CSUM`
        const RC_IP_CSUM = ffi::ibv_device_cap_flags::IBV_DEVICE_RC_IP_CSUM as u64;
        /// `IBV_DEVICE_RAW_IP_CSUM`
        const RAW_IP_CSUM = ffi::ibv_device_cap_flags::IBV_DEVICE_RAW_IP_CSUM as u64;
        /// `IBV_DEVICE_MANAGED_FLOW_STEERING`
        const MANAGED_FLOW_STEERING = ffi::ibv_device_cap_flags::IBV_DEVICE_MANAGED_FLOW_STEERING as u64;
        // Bits from newer rdma-core (and the extended flags above bit 31) survive.
        const _ = !0;
    }
}

/// A device's attributes (`struct ibv_device_attr_ex`), from [`DeviceContext::query_device`].
#[doc(alias = "ibv_device_attr_ex")]
#[derive(Clone, Copy)]
pub struct DeviceAttr {
    raw: ffi::ibv_device_attr_ex,
}

macro_rules! limits {
    ($( $(#[$m:meta])* $name:ident ),* $(,)?) => {
        $(
            $(#[$m])*
            pub fn $name(&self) -> u32 {
                u32::try_from(self.raw.orig_attr.$name).unwrap_or(0)
            }
        )*
    };
}

impl DeviceAttr {
    /// The raw struct, for fields this type does not expose.
    pub fn as_raw(&self) -> &ffi::ibv_device_attr_ex {
        &self.raw
    }

    /// Firmware version text.
    pub fn fw_ver(&self) -> String {
        let bytes: Vec<u8> = self
            .raw
            .orig_attr
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Node GUID, host order.
    pub fn node_guid(&self) -> u64 {
        u64::from_be(self.raw.orig_attr.node_guid)
    }

    /// System image GUID, host order.
    pub fn sys_image_guid(&self) -> u64 {
        u64::from_be(self.raw.orig_attr.sys_image_guid)
    }

    /// Largest registrable memory region, in bytes.
    pub fn max_mr_size(&self) -> u64 {
        self.raw.orig_attr.max_mr_size
    }

    /// Supported page sizes, as a bit mask.
    pub fn page_size_cap(&self) -> u64 {
        self.raw.orig_attr.page_size_cap
    }

    /// IEEE vendor id.
    pub fn vendor_id(&self) -> u32 {
        self.raw.orig_attr.vendor_id
    }

    /// Vendor part id.
    pub fn vendor_part_id(&self) -> u32 {
        self.raw.orig_attr.vendor_part_id
    }

    /// Hardware version.
    pub fn hw_ver(&self) -> u32 {
        self.raw.orig_attr.hw_ver
    }

    limits! {
        /// Most QPs.
        max_qp,
        /// Most outstanding work requests per queue.
        max_qp_wr,
        /// Most scatter/gather entries per send or receive request.
        max_sge,
        /// Most scatter/gather entries per RDMA READ request.
        max_sge_rd,
        /// Most CQs.
        max_cq,
        /// Most entries per CQ.
        max_cqe,
        /// Most MRs.
        max_mr,
        /// Most PDs.
        max_pd,
        /// Most outstanding RDMA READ and atomic operations a QP can receive.
        max_qp_rd_atom,
        /// Most outstanding RDMA READ and atomic operations an EE context can receive.
        max_ee_rd_atom,
        /// Most resources for incoming RDMA READ and atomic operations.
        max_res_rd_atom,
        /// Most outstanding RDMA READ and atomic operations a QP can initiate.
        max_qp_init_rd_atom,
        /// Most RDMA READ and atomic operations an EE context can initiate.
        max_ee_init_rd_atom,
        /// Most EE contexts.
        max_ee,
        /// Most RD domains.
        max_rdd,
        /// Most memory windows.
        max_mw,
        /// Most raw IPv6 datagram QPs.
        max_raw_ipv6_qp,
        /// Most raw Ethertype datagram QPs.
        max_raw_ethy_qp,
        /// Most multicast groups.
        max_mcast_grp,
        /// Most QPs per multicast group.
        max_mcast_qp_attach,
        /// Most QPs attached to multicast groups in all.
        max_total_mcast_qp_attach,
        /// Most address handles.
        max_ah,
        /// Most FMRs.
        max_fmr,
        /// Most remaps per FMR before an unmap.
        max_map_per_fmr,
        /// Most SRQs.
        max_srq,
        /// Most work requests per SRQ.
        max_srq_wr,
        /// Most scatter/gather entries per SRQ request.
        max_srq_sge,
    }

    /// P_Key table size.
    pub fn max_pkeys(&self) -> u16 {
        self.raw.orig_attr.max_pkeys
    }

    /// Local CA ACK delay (as the exponent in 4.096 µs × 2^n).
    pub fn local_ca_ack_delay(&self) -> u8 {
        self.raw.orig_attr.local_ca_ack_delay
    }

    /// Number of physical ports.
    pub fn phys_port_cnt(&self) -> u8 {
        self.raw.orig_attr.phys_port_cnt
    }

    /// Capability flags: the classic ones and the extended ones (`device_cap_flags_ex`).
    pub fn device_cap_flags(&self) -> DeviceCapFlags {
        DeviceCapFlags::from_bits_retain(
            u64::from(self.raw.orig_attr.device_cap_flags) | self.raw.device_cap_flags_ex,
        )
    }

    /// Atomic operation support.
    pub fn atomic_cap(&self) -> AtomicCap {
        AtomicCap::from(self.raw.orig_attr.atomic_cap)
    }

    /// Mask of the valid bits of completion timestamps (0: no timestamps).
    pub fn completion_timestamp_mask(&self) -> u64 {
        self.raw.completion_timestamp_mask
    }

    /// Frequency of the device clock that stamps completions, in kHz (0: unknown).
    pub fn hca_core_clock(&self) -> u64 {
        self.raw.hca_core_clock
    }

    /// PCIe atomic operation support: `(fetch_add, swap, compare_swap)` operand-size masks.
    pub fn pci_atomic_caps(&self) -> PciAtomicCaps {
        let c = self.raw.pci_atomic_caps;
        PciAtomicCaps {
            fetch_add: c.fetch_add,
            swap: c.swap,
            compare_swap: c.compare_swap,
        }
    }

    /// Largest device memory allocation, in bytes.
    pub fn max_dm_size(&self) -> u64 {
        self.raw.max_dm_size
    }

    /// Physical port count from the extended attributes (can exceed 255).
    pub fn phys_port_cnt_ex(&self) -> u32 {
        self.raw.phys_port_cnt_ex
    }
}

impl fmt::Debug for DeviceAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceAttr")
            .field("fw_ver", &self.fw_ver())
            .field("node_guid", &format_args!("{:#018x}", self.node_guid()))
            .field("vendor_id", &format_args!("{:#x}", self.vendor_id()))
            .field("max_qp", &self.max_qp())
            .field("max_qp_wr", &self.max_qp_wr())
            .field("max_cqe", &self.max_cqe())
            .field("max_sge", &self.max_sge())
            .field("device_cap_flags", &self.device_cap_flags())
            .field("atomic_cap", &self.atomic_cap())
            .field("phys_port_cnt", &self.phys_port_cnt())
            .finish_non_exhaustive()
    }
}

/// PCIe atomic capabilities: for each operation, a mask of supported operand sizes
/// (`IBV_PCI_ATOMIC_OPERATION_4_BYTE_SIZE_SUP` = 1, 8 bytes = 2, 16 bytes = 4).
#[doc(alias = "ibv_pci_atomic_caps")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PciAtomicCaps {
    /// Fetch-and-add.
    pub fetch_add: u16,
    /// Swap.
    pub swap: u16,
    /// Compare-and-swap.
    pub compare_swap: u16,
}

c_enum! {
    /// A port's logical state.
    pub enum PortState: "ibv_port_state" {
        /// No state change.
        Nop = ffi::ibv_port_state::IBV_PORT_NOP,
        /// Down.
        Down = ffi::ibv_port_state::IBV_PORT_DOWN,
        /// Initializing.
        Init = ffi::ibv_port_state::IBV_PORT_INIT,
        /// Armed.
        Armed = ffi::ibv_port_state::IBV_PORT_ARMED,
        /// Active: traffic can flow.
        Active = ffi::ibv_port_state::IBV_PORT_ACTIVE,
        /// Active, deferred.
        ActiveDefer = ffi::ibv_port_state::IBV_PORT_ACTIVE_DEFER,
    }
}

c_enum! {
    /// A path MTU.
    pub enum Mtu: "ibv_mtu" {
        /// 256 bytes.
        Mtu256 = ffi::ibv_mtu::IBV_MTU_256,
        /// 512 bytes.
        Mtu512 = ffi::ibv_mtu::IBV_MTU_512,
        /// 1024 bytes.
        Mtu1024 = ffi::ibv_mtu::IBV_MTU_1024,
        /// 2048 bytes.
        Mtu2048 = ffi::ibv_mtu::IBV_MTU_2048,
        /// 4096 bytes.
        Mtu4096 = ffi::ibv_mtu::IBV_MTU_4096,
    }
}

impl Mtu {
    /// The MTU in bytes, `None` for an unknown value.
    pub fn bytes(self) -> Option<u32> {
        match self {
            Mtu::Mtu256 => Some(256),
            Mtu::Mtu512 => Some(512),
            Mtu::Mtu1024 => Some(1024),
            Mtu::Mtu2048 => Some(2048),
            Mtu::Mtu4096 => Some(4096),
            Mtu::Unknown(_) => None,
        }
    }

    /// The MTU of this many bytes, if it is one of the five path MTUs.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ]
        .into_iter()
        .find(|m| m.bytes() == Some(bytes))
    }
}

c_enum! {
    /// A port's link layer.
    pub enum LinkLayer: "IBV_LINK_LAYER_*" {
        /// Not reported (InfiniBand, on old drivers).
        Unspecified = ffi::IBV_LINK_LAYER_UNSPECIFIED,
        /// InfiniBand.
        Infiniband = ffi::IBV_LINK_LAYER_INFINIBAND,
        /// Ethernet: RoCE.
        Ethernet = ffi::IBV_LINK_LAYER_ETHERNET,
    }
}

c_enum! {
    /// A port's active link width (lanes).
    pub enum PortWidth: "active_width" {
        /// 1 lane.
        X1 = 1,
        /// 4 lanes.
        X4 = 2,
        /// 8 lanes.
        X8 = 4,
        /// 12 lanes.
        X12 = 8,
        /// 2 lanes.
        X2 = 16,
    }
}

impl PortWidth {
    /// The number of lanes, `None` for an unknown value.
    pub fn lanes(self) -> Option<u32> {
        match self {
            PortWidth::X1 => Some(1),
            PortWidth::X2 => Some(2),
            PortWidth::X4 => Some(4),
            PortWidth::X8 => Some(8),
            PortWidth::X12 => Some(12),
            PortWidth::Unknown(_) => None,
        }
    }
}

c_enum! {
    /// A port's active per-lane speed.
    pub enum PortSpeed: "active_speed" {
        /// SDR, 2.5 Gb/s.
        Sdr = 1,
        /// DDR, 5 Gb/s.
        Ddr = 2,
        /// QDR, 10 Gb/s (also reported by RoCE ports).
        Qdr = 4,
        /// FDR10, 10.3125 Gb/s.
        Fdr10 = 8,
        /// FDR, 14.0625 Gb/s.
        Fdr = 16,
        /// EDR, 25.78125 Gb/s.
        Edr = 32,
        /// HDR, 50 Gb/s.
        Hdr = 64,
        /// NDR, 100 Gb/s.
        Ndr = 128,
        /// XDR, 200 Gb/s.
        Xdr = 256,
    }
}

impl PortSpeed {
    /// The per-lane signalling rate in Gb/s, `None` for an unknown value.
    pub fn gbps_per_lane(self) -> Option<f64> {
        Some(match self {
            PortSpeed::Sdr => 2.5,
            PortSpeed::Ddr => 5.0,
            PortSpeed::Qdr => 10.0,
            PortSpeed::Fdr10 => 10.3125,
            PortSpeed::Fdr => 14.0625,
            PortSpeed::Edr => 25.78125,
            PortSpeed::Hdr => 50.0,
            PortSpeed::Ndr => 100.0,
            PortSpeed::Xdr => 200.0,
            PortSpeed::Unknown(_) => return None,
        })
    }
}

/// A port's attributes (`struct ibv_port_attr`), from [`DeviceContext::query_port`].
#[doc(alias = "ibv_port_attr")]
#[derive(Clone, Copy)]
pub struct PortAttr {
    raw: ffi::ibv_port_attr,
}

impl PortAttr {
    /// The raw struct, for fields this type does not expose.
    pub fn as_raw(&self) -> &ffi::ibv_port_attr {
        &self.raw
    }

    /// Logical state.
    pub fn state(&self) -> PortState {
        PortState::from(self.raw.state)
    }

    /// Largest MTU the port supports.
    pub fn max_mtu(&self) -> Mtu {
        Mtu::from(self.raw.max_mtu)
    }

    /// MTU in use.
    pub fn active_mtu(&self) -> Mtu {
        Mtu::from(self.raw.active_mtu)
    }

    /// GID table length.
    pub fn gid_table_len(&self) -> u32 {
        u32::try_from(self.raw.gid_tbl_len).unwrap_or(0)
    }

    /// Port capability flags (`port_cap_flags`).
    pub fn port_cap_flags(&self) -> u32 {
        self.raw.port_cap_flags
    }

    /// Second word of port capability flags (`port_cap_flags2`).
    pub fn port_cap_flags2(&self) -> u16 {
        self.raw.port_cap_flags2
    }

    /// Largest message size, in bytes.
    pub fn max_msg_sz(&self) -> u32 {
        self.raw.max_msg_sz
    }

    /// Bad P_Key counter.
    pub fn bad_pkey_cntr(&self) -> u32 {
        self.raw.bad_pkey_cntr
    }

    /// Q_Key violation counter.
    pub fn qkey_viol_cntr(&self) -> u32 {
        self.raw.qkey_viol_cntr
    }

    /// P_Key table length.
    pub fn pkey_table_len(&self) -> u16 {
        self.raw.pkey_tbl_len
    }

    /// The port's LID (0 on RoCE).
    pub fn lid(&self) -> u16 {
        self.raw.lid
    }

    /// The subnet manager's LID.
    pub fn sm_lid(&self) -> u16 {
        self.raw.sm_lid
    }

    /// LID mask control.
    pub fn lmc(&self) -> u8 {
        self.raw.lmc
    }

    /// Most virtual lanes.
    pub fn max_vl_num(&self) -> u8 {
        self.raw.max_vl_num
    }

    /// The subnet manager's service level.
    pub fn sm_sl(&self) -> u8 {
        self.raw.sm_sl
    }

    /// Subnet propagation delay.
    pub fn subnet_timeout(&self) -> u8 {
        self.raw.subnet_timeout
    }

    /// Type of initialization the SM performed.
    pub fn init_type_reply(&self) -> u8 {
        self.raw.init_type_reply
    }

    /// Active link width.
    pub fn active_width(&self) -> PortWidth {
        PortWidth::from(u32::from(self.raw.active_width))
    }

    /// Active per-lane speed.
    pub fn active_speed(&self) -> PortSpeed {
        PortSpeed::from(u32::from(self.raw.active_speed))
    }

    /// Physical port state (5 = LinkUp).
    pub fn phys_state(&self) -> u8 {
        self.raw.phys_state
    }

    /// Link layer: InfiniBand or Ethernet (RoCE).
    pub fn link_layer(&self) -> LinkLayer {
        LinkLayer::from(u32::from(self.raw.link_layer))
    }

    /// Port flags (`IBV_QPF_GRH_REQUIRED`, ...).
    pub fn flags(&self) -> u8 {
        self.raw.flags
    }
}

impl fmt::Debug for PortAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortAttr")
            .field("state", &self.state())
            .field("active_mtu", &self.active_mtu())
            .field("lid", &self.lid())
            .field("link_layer", &self.link_layer())
            .field("active_width", &self.active_width())
            .field("active_speed", &self.active_speed())
            .field("gid_table_len", &self.gid_table_len())
            .finish_non_exhaustive()
    }
}

c_enum! {
    /// What a GID table entry is for.
    pub enum GidType: "ibv_gid_type" {
        /// InfiniBand.
        Ib = ffi::ibv_gid_type::IBV_GID_TYPE_IB,
        /// RoCE v1 (Ethernet, no IP header).
        RoceV1 = ffi::ibv_gid_type::IBV_GID_TYPE_ROCE_V1,
        /// RoCE v2 (UDP/IP): the routable one.
        RoceV2 = ffi::ibv_gid_type::IBV_GID_TYPE_ROCE_V2,
    }
}

impl fmt::Display for GidType {
    /// The way sysfs and `show_gids` name the types.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::Ib => f.write_str("IB"),
            GidType::RoceV1 => f.write_str("RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Unknown(n) => write!(f, "unknown ({n})"),
        }
    }
}

/// One GID table entry (`struct ibv_gid_entry`).
#[doc(alias = "ibv_gid_entry")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table.
    pub index: u8,
    /// The port, from 1.
    pub port: u8,
    /// What the GID is for.
    pub gid_type: GidType,
    /// The network device behind a RoCE GID (`eth0`), `None` for InfiniBand.
    pub netdev: Option<String>,
}

impl GidEntry {
    /// The entry, or `None` for one whose port or index does not fit in 8 bits (the verbs
    /// that use a GID cannot name it).
    fn from_raw(raw: &ffi::ibv_gid_entry) -> Option<Self> {
        Some(GidEntry {
            // SAFETY: every bit pattern of the union's raw bytes is valid.
            gid: Gid::from_raw(unsafe { raw.gid.raw }),
            index: u8::try_from(raw.gid_index).ok()?,
            port: u8::try_from(raw.port_num).ok()?,
            gid_type: GidType::from(raw.gid_type),
            netdev: netdev_name(raw.ndev_ifindex),
        })
    }
}

/// The RoCE v2 entry of `port` in `table` with the IPv4-mapped address `addr` (any IPv4
/// address for `None`), lowest index first.
fn pick_roce_v2_ipv4(table: &[GidEntry], port: u8, addr: Option<Ipv4Addr>) -> Option<&GidEntry> {
    table
        .iter()
        .filter(|e| e.port == port && e.gid_type == GidType::RoceV2)
        .filter(|e| match (e.gid.to_ipv4_mapped(), addr) {
            (Some(v4), Some(want)) => v4 == want,
            (Some(_), None) => true,
            (None, _) => false,
        })
        .min_by_key(|e| e.index)
}

/// The name of the network interface with this index (`if_indextoname`), `None` for 0.
fn netdev_name(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has the IF_NAMESIZE bytes if_indextoname requires.
    let name = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if name.is_null() {
        return None;
    }
    // SAFETY: on success buf holds a NUL-terminated name.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_enum_values_survive() {
        assert_eq!(PortState::from(4), PortState::Active);
        assert_eq!(PortState::from(77), PortState::Unknown(77));
        assert_eq!(u32::from(PortState::Unknown(77)), 77);
        assert_eq!(PortSpeed::from(512), PortSpeed::Unknown(512));
        assert_eq!(PortSpeed::Edr.gbps_per_lane(), Some(25.78125));
        assert_eq!(PortWidth::from(2).lanes(), Some(4));
        assert_eq!(
            TransportType::from(u32::MAX),
            TransportType::Unknown(u32::MAX)
        );
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
    fn gid_type_names_match_sysfs() {
        assert_eq!(GidType::RoceV2.to_string(), "RoCE v2");
        assert_eq!(GidType::from(7).to_string(), "unknown (7)");
    }

    fn entry(port: u8, index: u8, gid: &str, gid_type: GidType) -> GidEntry {
        GidEntry {
            gid: gid.parse().unwrap(),
            index,
            port,
            gid_type,
            netdev: None,
        }
    }

    #[test]
    fn the_roce_v2_ipv4_picker_takes_the_v2_entry_of_the_address_on_the_port() {
        // SoftRoCE's usual table on two ports, out of order.
        let table = [
            entry(1, 3, "::ffff:198.18.0.1", GidType::RoceV2),
            entry(1, 0, "fe80::1", GidType::RoceV1),
            entry(1, 1, "fe80::1", GidType::RoceV2),
            entry(1, 2, "::ffff:198.18.0.1", GidType::RoceV1),
            entry(1, 5, "::ffff:10.0.0.7", GidType::RoceV2),
            entry(2, 3, "::ffff:192.0.2.9", GidType::RoceV2),
        ];
        let pick = |port, addr: Option<&str>| {
            pick_roce_v2_ipv4(&table, port, addr.map(|a| a.parse().unwrap())).map(|e| e.index)
        };
        assert_eq!(pick(1, None), Some(3), "the lowest IPv4-mapped v2 index");
        assert_eq!(pick(1, Some("10.0.0.7")), Some(5));
        assert_eq!(pick(1, Some("192.0.2.9")), None, "that address is port 2's");
        assert_eq!(pick(2, None), Some(3));
        assert_eq!(pick(3, None), None);
        let e = DeviceError::NoRoceV2Ipv4Gid {
            device: "rxe0".into(),
            port: 1,
            addr: Some("192.0.2.9".parse().unwrap()),
        };
        assert_eq!(
            e.to_string(),
            "rxe0 port 1 has no RoCE v2 GID for 192.0.2.9: give its network interface \
             192.0.2.9 (ip addr add), or pick a GID index by hand"
        );
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
