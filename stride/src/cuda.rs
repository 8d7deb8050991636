//! The CUDA driver API, loaded at run time: just what GPU test buffers need.
//!
//! stride links against no CUDA library. The first use `dlopen`s `libcuda.so.1` (the NVIDIA
//! driver's own library, not the toolkit's runtime; the variable [`LIBCUDA_ENV`] names another
//! file, which the tests use to load a stand-in), resolves every entry point this module calls
//! at once, and keeps the result for the life of the process. So building stride needs no CUDA
//! toolkit, and one binary runs with or without a GPU: only `--use-cuda` and
//! `--use-cuda-dmabuf` ever load the library, and its absence is an error that says what to
//! install, never a failure to start.
//!
//! The surface is small on purpose: initialise, find a GPU, retain its primary context,
//! allocate and free, copy in and out, set a byte range, mark an allocation for GPUDirect, and
//! export a range as a dma-buf. Every call here is on the control path (setup, between sizes,
//! validation); the data path is the NIC's.
//!
//! Constants are the values of the driver API's C enums (`cuda.h`), which NVIDIA keeps stable.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString, OsString};
use std::fmt;
use std::ops::Range;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, OnceLock};

/// The driver library loaded when [`LIBCUDA_ENV`] is not set.
pub const LIBCUDA: &str = "libcuda.so.1";

/// The environment variable that names another file to load instead of [`LIBCUDA`].
pub const LIBCUDA_ENV: &str = "STRIDE_LIBCUDA";

/// The GPU page: what GPUDirect RDMA pins and what allocations are rounded up to.
pub const GPU_PAGE: usize = 64 << 10;

// `CUresult`, `CUdevice`, `CUdeviceptr` and `CUcontext` as the C API declares them.
type CuResult = c_int;
type CuDevice = c_int;
type CuDevicePtr = u64;
type CuContext = *mut c_void;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_NO_DEVICE: CuResult = 100;
const CUDA_ERROR_INVALID_DEVICE: CuResult = 101;

// `CUdevice_attribute` values.
const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;
const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;

// `CUpointer_attribute`: synchronous copies to and from the allocation complete before they
// return, which GPUDirect RDMA relies on.
const CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: c_int = 6;

// `CUmemRangeHandleType`.
const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

/// Why a CUDA operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The driver library could not be loaded.
    #[error(
        "the CUDA driver library {library} was not found ({reason}): install the NVIDIA \
         driver, or run without --use-cuda"
    )]
    NotFound {
        /// The file asked for.
        library: String,
        /// `dlerror()`'s text.
        reason: String,
    },
    /// The library loaded but lacks an entry point stride needs.
    #[error(
        "the CUDA driver library {library} has no {symbol} ({reason}): it is too old or not \
         NVIDIA's driver; install a current NVIDIA driver"
    )]
    MissingSymbol {
        /// The file loaded.
        library: String,
        /// The entry point.
        symbol: &'static str,
        /// `dlerror()`'s text.
        reason: String,
    },
    /// A driver call returned an error.
    #[error("{call} failed: {name} ({description})")]
    Call {
        /// The call and what it was asked, e.g. `cuMemAlloc_v2 of 65536 bytes on GPU 0`.
        call: String,
        /// The `CUresult`.
        code: i32,
        /// The driver's name for the code, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// The driver's description of the code.
        description: String,
    },
    /// The driver is there but sees no GPU.
    #[error("the CUDA driver found no GPU ({detail}): run without --use-cuda")]
    NoGpu {
        /// What said so.
        detail: String,
    },
    /// The GPU index asked for does not exist.
    #[error("there is no GPU {index}: {}; pass one of those", gpus_present(*count))]
    NoSuchGpu {
        /// The index asked for.
        index: u32,
        /// How many GPUs the driver sees.
        count: u32,
    },
    /// The driver predates dma-buf export.
    #[error(
        "this driver cannot export dma-buf (needs CUDA 11.7+ driver): {library} has no \
         cuMemGetHandleForAddressRange; update the NVIDIA driver, or use --use-cuda"
    )]
    NoDmaBufExport {
        /// The file loaded.
        library: String,
    },
    /// The GPU (or its kernel driver) cannot export dma-buf.
    #[error(
        "GPU {index} ({name}) cannot export dma-buf: the driver reports \
         CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0 (dma-buf needs NVIDIA's open kernel modules \
         and a 5.12+ kernel); use --use-cuda"
    )]
    DmaBufUnsupported {
        /// The GPU's index.
        index: u32,
        /// The GPU's name.
        name: String,
    },
    /// A size that cannot be allocated (it overflows once rounded up to GPU pages).
    #[error("cannot allocate {len} bytes on a GPU: the size overflows once rounded up")]
    TooLarge {
        /// The size asked for.
        len: usize,
    },
    /// A byte range that does not lie inside the allocation.
    #[error("bytes {start}..{end} lie outside the {len}-byte GPU allocation")]
    OutOfRange {
        /// Start of the range.
        start: usize,
        /// End of the range.
        end: usize,
        /// Usable length of the allocation.
        len: usize,
    },
}

fn gpus_present(count: u32) -> String {
    match count {
        0 => "this machine has no GPU".to_owned(),
        1 => "this machine has 1 GPU (index 0)".to_owned(),
        n => format!("this machine has {n} GPUs (indices 0 to {})", n - 1),
    }
}

/// The error of a failed call, from the driver's own name and description of `code` (either
/// may be unknown to an older driver).
fn call_error(
    call: String,
    code: CuResult,
    name: Option<&str>,
    description: Option<&str>,
) -> CudaError {
    CudaError::Call {
        call,
        code,
        name: name.map_or_else(|| format!("CUresult {code}"), str::to_owned),
        description: description
            .unwrap_or("a code this driver does not describe")
            .to_owned(),
    }
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub(crate) fn round_up(x: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// How much to allocate for a `len`-byte buffer, and how much of it the buffer spans: the
/// buffer starts on the first GPU page boundary of the allocation and spans whole GPU pages,
/// so that dma-buf export (which wants aligned ranges) and GPUDirect pinning see only this
/// buffer's pages. Returns `(allocation length, span)`, or `None` on overflow.
fn gpu_layout(len: usize) -> Option<(usize, usize)> {
    let span = round_up(len.max(1), GPU_PAGE)?;
    // One page more, so that an aligned span fits whatever alignment the driver gives.
    Some((span.checked_add(GPU_PAGE)?, span))
}

/// Checks `range` against a `len`-byte buffer.
fn check_range(range: &Range<usize>, len: usize) -> Result<(), CudaError> {
    if range.start > range.end || range.end > len {
        return Err(CudaError::OutOfRange {
            start: range.start,
            end: range.end,
            len,
        });
    }
    Ok(())
}

// The entry points' C signatures (cuda.h).
type InitFn = unsafe extern "C" fn(c_uint) -> CuResult;
type DeviceGetCountFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type DeviceGetFn = unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult;
type DeviceGetNameFn = unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult;
type DeviceGetAttributeFn = unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult;
type PrimaryCtxRetainFn = unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult;
type PrimaryCtxReleaseFn = unsafe extern "C" fn(CuDevice) -> CuResult;
type CtxSetCurrentFn = unsafe extern "C" fn(CuContext) -> CuResult;
type MemAllocFn = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
type MemFreeFn = unsafe extern "C" fn(CuDevicePtr) -> CuResult;
type MemcpyHtoDFn = unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult;
type MemcpyDtoHFn = unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult;
type MemsetD8Fn = unsafe extern "C" fn(CuDevicePtr, u8, usize) -> CuResult;
type PointerSetAttributeFn = unsafe extern "C" fn(*const c_void, c_int, CuDevicePtr) -> CuResult;
type GetHandleForAddressRangeFn =
    unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, u64) -> CuResult;
type GetErrorTextFn = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;

/// The entry points, resolved once.
struct Api {
    init: InitFn,
    device_get_count: DeviceGetCountFn,
    device_get: DeviceGetFn,
    device_get_name: DeviceGetNameFn,
    device_get_attribute: DeviceGetAttributeFn,
    primary_ctx_retain: PrimaryCtxRetainFn,
    primary_ctx_release: PrimaryCtxReleaseFn,
    ctx_set_current: CtxSetCurrentFn,
    mem_alloc: MemAllocFn,
    mem_free: MemFreeFn,
    memcpy_htod: MemcpyHtoDFn,
    memcpy_dtoh: MemcpyDtoHFn,
    memset_d8: MemsetD8Fn,
    pointer_set_attribute: PointerSetAttributeFn,
    /// Absent before the CUDA 11.7 driver.
    get_handle_for_address_range: Option<GetHandleForAddressRangeFn>,
    get_error_name: GetErrorTextFn,
    get_error_string: GetErrorTextFn,
}

/// The text of the last `dlopen`/`dlsym` failure on this thread.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
    // on this thread; it is copied at once.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        return "no reason given".to_owned();
    }
    // SAFETY: non-NULL, NUL-terminated, see above.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// An open library, for resolving symbols.
struct Library {
    handle: *mut c_void,
    name: String,
}

impl Library {
    fn open(path: &OsString) -> Result<Self, CudaError> {
        let name = path.to_string_lossy().into_owned();
        let c_path = CString::new(path.as_bytes()).map_err(|_| CudaError::NotFound {
            library: name.clone(),
            reason: "the path holds a NUL byte".to_owned(),
        })?;
        // SAFETY: c_path is NUL-terminated; loading runs the library's constructors, which is
        // what loading NVIDIA's driver library is for.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(CudaError::NotFound {
                library: name,
                reason: dl_error(),
            });
        }
        Ok(Library { handle, name })
    }

    /// The first of `names` the library exports (a versioned name first, then older ones).
    fn find(&self, names: &[&'static str]) -> Result<*mut c_void, (&'static str, String)> {
        let mut reason = String::new();
        for &name in names {
            let c_name = CString::new(name).map_err(|_| (name, "bad name".to_owned()))?;
            // SAFETY: handle is a live dlopen handle (never closed) and c_name is
            // NUL-terminated.
            let p = unsafe { libc::dlsym(self.handle, c_name.as_ptr()) };
            if !p.is_null() {
                return Ok(p);
            }
            reason = dl_error();
        }
        Err((names[0], reason))
    }

    fn require(&self, names: &[&'static str]) -> Result<*mut c_void, CudaError> {
        self.find(names)
            .map_err(|(symbol, reason)| CudaError::MissingSymbol {
                library: self.name.clone(),
                symbol,
                reason,
            })
    }
}

/// Resolves one entry point (the first of the names exported) as a `$ty` function pointer.
macro_rules! entry {
    ($lib:expr, $ty:ty, $($name:literal),+) => {{
        let p = $lib.require(&[$($name),+])?;
        // SAFETY: the symbol is the driver API function of that name, whose C signature $ty
        // mirrors (cuda.h); a non-NULL pointer from dlsym is the function's address.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

/// The loaded driver library.
pub struct Driver {
    api: Api,
    library: String,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("library", &self.library)
            .field(
                "dma_buf_export",
                &self.api.get_handle_for_address_range.is_some(),
            )
            .finish_non_exhaustive()
    }
}

static DRIVER: OnceLock<Result<Driver, CudaError>> = OnceLock::new();

/// The driver, loaded on first use from [`LIBCUDA`] (or the file [`LIBCUDA_ENV`] names).
/// Later calls return the same driver, or the same error.
pub fn driver() -> Result<&'static Driver, CudaError> {
    DRIVER
        .get_or_init(|| {
            let path = std::env::var_os(LIBCUDA_ENV)
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| OsString::from(LIBCUDA));
            Driver::load(&path)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Opens GPU `index` of the process's driver ([`driver`]).
pub fn open_gpu(index: u32) -> Result<Arc<Gpu>, CudaError> {
    driver()?.open_gpu(index)
}

impl Driver {
    /// Loads the driver library at `path` and resolves every entry point. The library is
    /// never unloaded (the driver does not support it).
    pub fn load(path: impl Into<OsString>) -> Result<Self, CudaError> {
        let lib = Library::open(&path.into())?;
        let get_handle_for_address_range = match lib.find(&["cuMemGetHandleForAddressRange"]) {
            Ok(p) => {
                // SAFETY: as in entry!: the symbol is that function, the type mirrors cuda.h.
                let f =
                    unsafe { std::mem::transmute::<*mut c_void, GetHandleForAddressRangeFn>(p) };
                Some(f)
            }
            Err(_) => None,
        };
        let api = Api {
            init: entry!(lib, InitFn, "cuInit"),
            device_get_count: entry!(lib, DeviceGetCountFn, "cuDeviceGetCount"),
            device_get: entry!(lib, DeviceGetFn, "cuDeviceGet"),
            device_get_name: entry!(lib, DeviceGetNameFn, "cuDeviceGetName"),
            device_get_attribute: entry!(lib, DeviceGetAttributeFn, "cuDeviceGetAttribute"),
            primary_ctx_retain: entry!(lib, PrimaryCtxRetainFn, "cuDevicePrimaryCtxRetain"),
            primary_ctx_release: entry!(
                lib,
                PrimaryCtxReleaseFn,
                "cuDevicePrimaryCtxRelease_v2",
                "cuDevicePrimaryCtxRelease"
            ),
            ctx_set_current: entry!(lib, CtxSetCurrentFn, "cuCtxSetCurrent"),
            mem_alloc: entry!(lib, MemAllocFn, "cuMemAlloc_v2"),
            mem_free: entry!(lib, MemFreeFn, "cuMemFree_v2"),
            memcpy_htod: entry!(lib, MemcpyHtoDFn, "cuMemcpyHtoD_v2"),
            memcpy_dtoh: entry!(lib, MemcpyDtoHFn, "cuMemcpyDtoH_v2"),
            memset_d8: entry!(lib, MemsetD8Fn, "cuMemsetD8_v2"),
            pointer_set_attribute: entry!(lib, PointerSetAttributeFn, "cuPointerSetAttribute"),
            get_handle_for_address_range,
            get_error_name: entry!(lib, GetErrorTextFn, "cuGetErrorName"),
            get_error_string: entry!(lib, GetErrorTextFn, "cuGetErrorString"),
        };
        Ok(Driver {
            api,
            library: lib.name,
        })
    }

    /// The file the driver was loaded from.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Whether the driver can export dma-buf at all (CUDA 11.7 and later).
    pub fn can_export_dma_buf(&self) -> bool {
        self.api.get_handle_for_address_range.is_some()
    }

    /// `Ok` for `CUDA_SUCCESS`, else the error of `call()` (built only on failure).
    fn check(&self, code: CuResult, call: impl FnOnce() -> String) -> Result<(), CudaError> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        let describe = |f: GetErrorTextFn| {
            let mut text: *const c_char = std::ptr::null();
            // SAFETY: f writes a pointer to a static NUL-terminated string, or fails.
            let ret = unsafe { f(code, &mut text) };
            if ret != CUDA_SUCCESS || text.is_null() {
                return None;
            }
            // SAFETY: the driver's static string, NUL-terminated.
            Some(
                unsafe { CStr::from_ptr(text) }
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        let name = describe(self.api.get_error_name);
        let description = describe(self.api.get_error_string);
        Err(call_error(
            call(),
            code,
            name.as_deref(),
            description.as_deref(),
        ))
    }

    /// `cuInit`, which may be called any number of times.
    fn init(&self) -> Result<(), CudaError> {
        // SAFETY: no pointers; flags must be 0.
        let ret = unsafe { (self.api.init)(0) };
        if ret == CUDA_ERROR_NO_DEVICE {
            return Err(CudaError::NoGpu {
                detail: "cuInit returned CUDA_ERROR_NO_DEVICE".to_owned(),
            });
        }
        self.check(ret, || "cuInit".to_owned())
    }

    /// How many GPUs the driver sees (`cuDeviceGetCount`).
    #[doc(alias = "cuDeviceGetCount")]
    pub fn device_count(&self) -> Result<u32, CudaError> {
        self.init()?;
        let mut count: c_int = 0;
        // SAFETY: count is a valid out-pointer.
        let ret = unsafe { (self.api.device_get_count)(&mut count) };
        self.check(ret, || "cuDeviceGetCount".to_owned())?;
        Ok(u32::try_from(count).unwrap_or(0))
    }

    /// Opens GPU `index`: checks it exists, reads its name and PCI address, and retains its
    /// primary context for as long as the returned [`Gpu`] lives.
    #[doc(alias = "cuDevicePrimaryCtxRetain")]
    pub fn open_gpu(&'static self, index: u32) -> Result<Arc<Gpu>, CudaError> {
        let count = self.device_count()?;
        if count == 0 {
            return Err(CudaError::NoGpu {
                detail: "cuDeviceGetCount says 0".to_owned(),
            });
        }
        if index >= count {
            return Err(CudaError::NoSuchGpu { index, count });
        }
        let ordinal = c_int::try_from(index).map_err(|_| CudaError::NoSuchGpu { index, count })?;
        let mut device: CuDevice = 0;
        // SAFETY: device is a valid out-pointer.
        let ret = unsafe { (self.api.device_get)(&mut device, ordinal) };
        if ret == CUDA_ERROR_INVALID_DEVICE {
            return Err(CudaError::NoSuchGpu { index, count });
        }
        self.check(ret, || format!("cuDeviceGet({index})"))?;

        let mut name_buf = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 chars and the driver writes at most that many,
        // NUL-terminated.
        let ret = unsafe { (self.api.device_get_name)(name_buf.as_mut_ptr(), 256, device) };
        self.check(ret, || format!("cuDeviceGetName of GPU {index}"))?;
        // The last byte is forced to NUL so that the read below stays in the buffer.
        name_buf[255] = 0;
        // SAFETY: NUL-terminated within the buffer (see above).
        let name = unsafe { CStr::from_ptr(name_buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();

        let attr = |attribute: c_int, what: &str| -> Result<i32, CudaError> {
            let mut value: c_int = 0;
            // SAFETY: value is a valid out-pointer.
            let ret = unsafe { (self.api.device_get_attribute)(&mut value, attribute, device) };
            self.check(ret, || {
                format!("cuDeviceGetAttribute({what}) of GPU {index}")
            })?;
            Ok(value)
        };
        let domain = attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, "PCI_DOMAIN_ID")?;
        let bus = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, "PCI_BUS_ID")?;
        let dev = attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, "PCI_DEVICE_ID")?;
        // An older driver does not know the attribute: it cannot export dma-buf either.
        let dma_buf =
            attr(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, "DMA_BUF_SUPPORTED").is_ok_and(|v| v != 0);

        let mut context: CuContext = std::ptr::null_mut();
        // SAFETY: context is a valid out-pointer; the retain is released in Gpu's Drop.
        let ret = unsafe { (self.api.primary_ctx_retain)(&mut context, device) };
        self.check(ret, || format!("cuDevicePrimaryCtxRetain of GPU {index}"))?;
        Ok(Arc::new(Gpu {
            driver: self,
            index,
            device,
            context,
            name,
            pci_bus_id: format!("{domain:04x}:{bus:02x}:{dev:02x}.0"),
            dma_buf_supported: dma_buf,
        }))
    }
}

/// One GPU with its primary context retained.
pub struct Gpu {
    driver: &'static Driver,
    index: u32,
    device: CuDevice,
    context: CuContext,
    name: String,
    pci_bus_id: String,
    dma_buf_supported: bool,
}

// SAFETY: a CUcontext is a handle that the driver lets any thread make current
// (cuCtxSetCurrent); this type never dereferences it. Every other field is plain data.
unsafe impl Send for Gpu {}
// SAFETY: as above; shared use only passes the handle to the driver, which is thread-safe.
unsafe impl Sync for Gpu {}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("index", &self.index)
            .field("name", &self.name)
            .field("pci_bus_id", &self.pci_bus_id)
            .field("dma_buf_supported", &self.dma_buf_supported)
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// The index it was opened with.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The driver's name for it, e.g. `NVIDIA H100 80GB HBM3`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its PCI address, `domain:bus:device.0` in hex.
    pub fn pci_bus_id(&self) -> &str {
        &self.pci_bus_id
    }

    /// What `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` says (false when the driver does not know
    /// the attribute).
    pub fn dma_buf_supported(&self) -> bool {
        self.dma_buf_supported
    }

    /// `GPU 0 (NAME, PCI 0000:1b:00.0)`.
    pub fn describe(&self) -> String {
        format!(
            "GPU {} ({}, PCI {})",
            self.index, self.name, self.pci_bus_id
        )
    }

    /// Says why this GPU's memory cannot be exported as dma-buf, if it cannot.
    pub fn check_dma_buf_export(&self) -> Result<(), CudaError> {
        if !self.driver.can_export_dma_buf() {
            return Err(CudaError::NoDmaBufExport {
                library: self.driver.library.clone(),
            });
        }
        if !self.dma_buf_supported {
            return Err(CudaError::DmaBufUnsupported {
                index: self.index,
                name: self.name.clone(),
            });
        }
        Ok(())
    }

    /// Makes the primary context current on the calling thread (`cuCtxSetCurrent`): every
    /// memory call needs one, and the thread may be new to CUDA.
    fn make_current(&self) -> Result<(), CudaError> {
        // SAFETY: the context is retained while self lives.
        let ret = unsafe { (self.driver.api.ctx_set_current)(self.context) };
        self.driver
            .check(ret, || format!("cuCtxSetCurrent for GPU {}", self.index))
    }

    /// Allocates at least `len` bytes on the GPU (`cuMemAlloc`): a whole number of GPU pages
    /// starting on a GPU page boundary. The contents are undefined until written.
    #[doc(alias = "cuMemAlloc")]
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<DeviceMemory, CudaError> {
        let (alloc_len, span) = gpu_layout(len).ok_or(CudaError::TooLarge { len })?;
        self.make_current()?;
        let mut base: CuDevicePtr = 0;
        // SAFETY: base is a valid out-pointer; the context is current.
        let ret = unsafe { (self.driver.api.mem_alloc)(&mut base, alloc_len) };
        self.driver.check(ret, || {
            format!("cuMemAlloc_v2 of {alloc_len} bytes on GPU {}", self.index)
        })?;
        // The first GPU page boundary at or after base: at most GPU_PAGE - 1 bytes in, so
        // span bytes from there stay inside the alloc_len = span + GPU_PAGE allocated.
        let page = GPU_PAGE as u64;
        let aligned = base.checked_add(page - 1).map(|a| a & !(page - 1));
        // Owned from here on: dropping it frees the allocation, on the error path too.
        let memory = DeviceMemory {
            gpu: Arc::clone(self),
            base,
            addr: aligned.unwrap_or(base),
            len: span,
        };
        if aligned.is_none() {
            return Err(CudaError::TooLarge { len });
        }
        Ok(memory)
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: the retain in open_gpu is released exactly once.
        let ret = unsafe { (self.driver.api.primary_ctx_release)(self.device) };
        if let Err(e) = self
            .driver
            .check(ret, || "cuDevicePrimaryCtxRelease".to_owned())
        {
            eprintln!(
                "stride-perf: warning: releasing GPU {}'s context: {e}",
                self.index
            );
        }
    }
}

/// GPU memory this process allocated; freed (`cuMemFree`) on drop.
///
/// Everything that touches the bytes goes through the driver: the CPU cannot address them.
pub struct DeviceMemory {
    gpu: Arc<Gpu>,
    /// What cuMemAlloc returned, for cuMemFree.
    base: CuDevicePtr,
    /// The usable start, on a GPU page boundary inside the allocation.
    addr: CuDevicePtr,
    /// Usable bytes from `addr`: whole GPU pages.
    len: usize,
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("gpu", &self.gpu.index)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceMemory {
    /// The GPU it lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The device address of the first usable byte (GPU-page aligned).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Usable bytes: the size asked for, rounded up to whole GPU pages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an allocation holds at least one GPU page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` to `offset` (`cuMemcpyHtoD`).
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), CudaError> {
        // SAFETY: data is data.len() readable bytes, borrowed for the call.
        unsafe { self.copy_from_host(offset, data.as_ptr(), data.len()) }
    }

    /// Copies `range` out (`cuMemcpyDtoH`).
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn read(&self, range: Range<usize>) -> Result<Vec<u8>, CudaError> {
        check_range(&range, self.len)?;
        let mut out = vec![0u8; range.end - range.start];
        // SAFETY: out is out.len() writable bytes, owned here.
        unsafe { self.copy_to_host(range, out.as_mut_ptr())? };
        Ok(out)
    }

    /// Copies `len` bytes from host memory at `src` to `offset` (`cuMemcpyHtoD`, which
    /// returns once the source may be reused).
    ///
    /// # Safety
    /// `src` must be valid for `len` bytes of reads for the whole call. Other writers (a NIC)
    /// may change those bytes meanwhile; the copy then holds some mix of them, nothing worse.
    #[doc(alias = "cuMemcpyHtoD")]
    pub unsafe fn copy_from_host(
        &self,
        offset: usize,
        src: *const u8,
        len: usize,
    ) -> Result<(), CudaError> {
        let range = offset..offset.saturating_add(len);
        check_range(&range, self.len)?;
        if len == 0 {
            return Ok(());
        }
        self.gpu.make_current()?;
        // SAFETY: the destination range lies inside the allocation (checked), the source is
        // len readable bytes (the caller's promise), and the context is current.
        let ret = unsafe {
            (self.gpu.driver.api.memcpy_htod)(self.addr + offset as u64, src.cast(), len)
        };
        self.gpu.driver.check(ret, || {
            format!("cuMemcpyHtoD_v2 of {len} bytes to GPU {}", self.gpu.index)
        })
    }

    /// Copies `range` to host memory at `dst` (`cuMemcpyDtoH`, which returns once the bytes
    /// are there).
    ///
    /// # Safety
    /// `dst` must be valid for `range.len()` bytes of writes for the whole call, and no Rust
    /// reference may point into them meanwhile.
    #[doc(alias = "cuMemcpyDtoH")]
    pub unsafe fn copy_to_host(&self, range: Range<usize>, dst: *mut u8) -> Result<(), CudaError> {
        check_range(&range, self.len)?;
        let len = range.end - range.start;
        if len == 0 {
            return Ok(());
        }
        self.gpu.make_current()?;
        // SAFETY: the source range lies inside the allocation (checked), the destination is
        // len writable bytes no reference covers (the caller's promise), and the context is
        // current.
        let ret = unsafe {
            (self.gpu.driver.api.memcpy_dtoh)(dst.cast(), self.addr + range.start as u64, len)
        };
        self.gpu.driver.check(ret, || {
            format!("cuMemcpyDtoH_v2 of {len} bytes from GPU {}", self.gpu.index)
        })
    }

    /// Sets every byte of `range` to `byte` (`cuMemsetD8`).
    #[doc(alias = "cuMemsetD8")]
    pub fn fill(&self, range: Range<usize>, byte: u8) -> Result<(), CudaError> {
        check_range(&range, self.len)?;
        let n = range.end - range.start;
        if n == 0 {
            return Ok(());
        }
        self.gpu.make_current()?;
        // SAFETY: the range lies inside the allocation (checked); the context is current.
        let ret =
            unsafe { (self.gpu.driver.api.memset_d8)(self.addr + range.start as u64, byte, n) };
        self.gpu.driver.check(ret, || {
            format!("cuMemsetD8_v2 of {n} bytes on GPU {}", self.gpu.index)
        })
    }

    /// Marks the allocation `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` (`cuPointerSetAttribute`), as
    /// GPUDirect RDMA asks: a synchronous copy then completes before it returns, so the NIC
    /// and the CPU never see stale bytes.
    #[doc(alias = "cuPointerSetAttribute")]
    pub fn set_sync_memops(&self) -> Result<(), CudaError> {
        self.gpu.make_current()?;
        let one: c_uint = 1;
        // SAFETY: the value points at an unsigned int, as this attribute wants; base is the
        // start of a live allocation; the context is current.
        let ret = unsafe {
            (self.gpu.driver.api.pointer_set_attribute)(
                (&one as *const c_uint).cast(),
                CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                self.base,
            )
        };
        self.gpu.driver.check(ret, || {
            format!(
                "cuPointerSetAttribute(SYNC_MEMOPS) on GPU {}",
                self.gpu.index
            )
        })
    }

    /// Exports the usable range as a dma-buf (`cuMemGetHandleForAddressRange`), for
    /// `ibv_reg_dmabuf_mr`. Offset 0 of the dma-buf is [`DeviceMemory::addr`].
    #[doc(alias = "cuMemGetHandleForAddressRange")]
    pub fn export_dma_buf(&self) -> Result<OwnedFd, CudaError> {
        let export = self
            .gpu
            .driver
            .api
            .get_handle_for_address_range
            .ok_or_else(|| CudaError::NoDmaBufExport {
                library: self.gpu.driver.library.clone(),
            })?;
        self.gpu.make_current()?;
        let mut fd: c_int = -1;
        // SAFETY: for the dma-buf handle type the handle is an int the driver writes;
        // addr..addr + len is page-aligned and inside the allocation; the context is current.
        let ret = unsafe {
            export(
                (&mut fd as *mut c_int).cast(),
                self.addr,
                self.len,
                CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        let call = || {
            format!(
                "cuMemGetHandleForAddressRange(DMA_BUF_FD) of {} bytes on GPU {}",
                self.len, self.gpu.index
            )
        };
        self.gpu.driver.check(ret, call)?;
        if fd < 0 {
            return Err(call_error(
                call(),
                ret,
                None,
                Some("the driver returned no file descriptor"),
            ));
        }
        // SAFETY: the driver just opened fd for this process and hands it over.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        let freed = self.gpu.make_current().and_then(|()| {
            // SAFETY: base came from cuMemAlloc and is freed exactly once; whoever registered
            // it with a NIC deregistered it first (see the buffer module).
            let ret = unsafe { (self.gpu.driver.api.mem_free)(self.base) };
            self.gpu.driver.check(ret, || "cuMemFree_v2".to_owned())
        });
        if let Err(e) = freed {
            eprintln!(
                "stride-perf: warning: freeing GPU {} memory: {e} (it may leak)",
                self.gpu.index
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_says_what_to_install() {
        let e = Driver::load("/nonexistent/stride-test/libcuda.so.1").unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(
                "the CUDA driver library /nonexistent/stride-test/libcuda.so.1 was not found ("
            ),
            "{text}"
        );
        assert!(
            text.ends_with("): install the NVIDIA driver, or run without --use-cuda"),
            "{text}"
        );
        // dlerror's own words are kept.
        assert!(text.contains("No such file"), "{text}");
    }

    #[test]
    fn a_library_that_is_not_the_driver_is_named() {
        // The C library is loaded in every process and exports no CUDA function.
        let e = Driver::load("libc.so.6").unwrap_err();
        assert!(
            matches!(
                &e,
                CudaError::MissingSymbol {
                    symbol: "cuInit",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("libc.so.6 has no cuInit"), "{e}");
    }

    #[test]
    fn call_errors_carry_the_call_and_the_drivers_words() {
        let e = call_error(
            "cuMemAlloc_v2 of 131072 bytes on GPU 0".into(),
            2,
            Some("CUDA_ERROR_OUT_OF_MEMORY"),
            Some("out of memory"),
        );
        assert_eq!(
            e.to_string(),
            "cuMemAlloc_v2 of 131072 bytes on GPU 0 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
        );
        let e = call_error("cuInit".into(), 12345, None, None);
        assert_eq!(
            e.to_string(),
            "cuInit failed: CUresult 12345 (a code this driver does not describe)"
        );
    }

    #[test]
    fn gpu_index_errors_say_how_many_there_are() {
        let one = CudaError::NoSuchGpu { index: 3, count: 1 }.to_string();
        assert_eq!(
            one,
            "there is no GPU 3: this machine has 1 GPU (index 0); pass one of those"
        );
        let many = CudaError::NoSuchGpu { index: 8, count: 8 }.to_string();
        assert!(many.contains("has 8 GPUs (indices 0 to 7)"), "{many}");
        let old = CudaError::NoDmaBufExport {
            library: LIBCUDA.into(),
        }
        .to_string();
        assert!(
            old.starts_with("this driver cannot export dma-buf (needs CUDA 11.7+ driver)"),
            "{old}"
        );
    }

    #[test]
    fn allocations_are_whole_gpu_pages_with_room_to_align() {
        assert_eq!(round_up(1, GPU_PAGE), Some(GPU_PAGE));
        assert_eq!(round_up(GPU_PAGE, GPU_PAGE), Some(GPU_PAGE));
        assert_eq!(round_up(usize::MAX, GPU_PAGE), None);
        assert_eq!(gpu_layout(0), Some((2 * GPU_PAGE, GPU_PAGE)));
        assert_eq!(gpu_layout(128 << 10), Some((192 << 10, 128 << 10)));
        assert_eq!(gpu_layout((128 << 10) + 1), Some((256 << 10, 192 << 10)));
        assert_eq!(gpu_layout(usize::MAX - GPU_PAGE), None);
    }

    #[test]
    fn ranges_are_checked() {
        assert!(check_range(&(0..64), 64).is_ok());
        assert!(check_range(&(64..64), 64).is_ok());
        let e = check_range(&(60..70), 64).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bytes 60..70 lie outside the 64-byte GPU allocation"
        );
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 8..4;
        assert!(check_range(&backwards, 64).is_err());
    }
}
