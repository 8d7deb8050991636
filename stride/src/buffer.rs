//! Test buffers: the registered memory a run's work requests read and write, in host memory,
//! in huge pages, or on a GPU, behind one type.
//!
//! [`Memory`] is a run's choice of memory, prepared once before anything connects (the CUDA
//! driver loaded and the GPU opened, the huge page pool checked), so that a machine that
//! cannot give that memory fails at once. [`Memory::allocate`] then makes each memory
//! region's [`TestBuffer`]: allocated, zeroed and registered with the NIC. [`QpBuffers`] holds
//! a run's regions (one shared by all QPs, or one per QP) and hands each QP its slice.
//!
//! The engine uses a buffer through its address and keys and [`TestBuffer::sge`]; the CPU
//! reaches the bytes only by copy or in place, never through a slice (the NIC may write them
//! at any moment): [`TestBuffer::inline`] (inline sends, host kinds), [`TestBuffer::peek`]
//! (the WRITE latency spin), and [`TestBuffer::fill`], [`TestBuffer::write`] and
//! [`TestBuffer::read`], which go through the CUDA driver for GPU memory.
//!
//! Ownership is the safety argument: each kind's memory (heap, huge page mapping, GPU
//! allocation and its dma-buf descriptor) is owned by its memory region, which frees it only
//! after a successful deregistration and leaks it after a failed one (sideway's rule), so the
//! NIC can never reach freed memory, whatever fails.

#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use sideway::memory_region::{AccessFlags, MemoryRegion, MemoryRegionError, RegisteredBuffer, Sge};
use sideway::protection_domain::ProtectionDomain;
use sideway::queue_pair::SendData;

use crate::cli::RunArgs;
use crate::cuda::{self, CudaError, DeviceMemory, Gpu};

/// How GPU memory is registered with the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuRegistration {
    /// `ibv_reg_mr` on the device address: the NIC driver pins GPU pages through a
    /// peer-memory client (GPUDirect RDMA, `nvidia-peermem`).
    RegMr,
    /// `cuMemGetHandleForAddressRange` exports a dma-buf, and `ibv_reg_dmabuf_mr` registers it.
    DmaBuf,
    /// Not registered (`--staging`): the NIC works in registered host memory, and the data is
    /// copied from the GPU before each transfer and to it after each (`cuMemcpyDtoH`,
    /// `cuMemcpyHtoD`), the way a program without GPUDirect moves it.
    Staged,
}

impl GpuRegistration {
    fn describe(self) -> &'static str {
        match self {
            GpuRegistration::RegMr => "GPUDirect reg_mr",
            GpuRegistration::DmaBuf => "dma-buf",
            GpuRegistration::Staged => "staging through host memory",
        }
    }

    /// What to add to a failed registration of GPU memory: the likely cause.
    pub fn failure_cause(self) -> &'static str {
        match self {
            GpuRegistration::RegMr => {
                "the NIC driver cannot register GPU memory: GPUDirect RDMA needs the \
                 nvidia-peermem module loaded and a NIC that supports it; try --use-cuda-dmabuf"
            }
            GpuRegistration::DmaBuf => {
                "the NIC driver does not support dma-buf registration (needs kernel 5.12+ and a \
                 driver with dma-buf support, e.g. mlx5); SoftRoCE (rxe) supports neither"
            }
            GpuRegistration::Staged => {
                "the NIC driver could not register the host memory the GPU's data is staged in"
            }
        }
    }
}

/// The kind of memory the command line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferKind {
    /// Page-aligned host memory (the default).
    Host,
    /// Huge pages (`--use-hugepages`).
    HugePages,
    /// GPU memory (`--use-cuda`, `--use-cuda-dmabuf`).
    Gpu {
        /// The GPU's index, as CUDA counts them.
        index: u32,
        /// How the NIC registers it.
        registration: GpuRegistration,
    },
}

impl BufferKind {
    /// The kind `args` ask for (clap keeps the three options mutually exclusive; the
    /// parameter check takes `--staging` only with `--use-cuda`).
    pub fn from_args(args: &RunArgs) -> Self {
        match (args.use_cuda, args.use_cuda_dmabuf) {
            (Some(index), _) => BufferKind::Gpu {
                index,
                registration: if args.staging {
                    GpuRegistration::Staged
                } else {
                    GpuRegistration::RegMr
                },
            },
            (None, Some(index)) => BufferKind::Gpu {
                index,
                registration: GpuRegistration::DmaBuf,
            },
            (None, None) if args.use_hugepages => BufferKind::HugePages,
            (None, None) => BufferKind::Host,
        }
    }
}

/// The huge page pool, as `/proc/meminfo` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePagePool {
    /// Bytes per huge page (`Hugepagesize`).
    pub page_size: usize,
    /// Pages reserved (`HugePages_Total`).
    pub total: u64,
    /// Pages reserved and not in use (`HugePages_Free`).
    pub free: u64,
}

impl HugePagePool {
    /// Reads the pool from `/proc/meminfo`'s text; `None` when the huge page lines are
    /// missing (a kernel without huge page support).
    pub fn parse(meminfo: &str) -> Option<Self> {
        let field = |name: &str| {
            meminfo.lines().find_map(|line| {
                let rest = line.strip_prefix(name)?.strip_prefix(':')?;
                let mut words = rest.split_whitespace();
                let value: u64 = words.next()?.parse().ok()?;
                match words.next() {
                    Some("kB") => value.checked_mul(1024),
                    Some(_) => None,
                    None => Some(value),
                }
            })
        };
        let page_size = usize::try_from(field("Hugepagesize")?).ok()?;
        if page_size == 0 || !page_size.is_power_of_two() {
            return None;
        }
        Some(HugePagePool {
            page_size,
            total: field("HugePages_Total")?,
            free: field("HugePages_Free")?,
        })
    }

    /// Reads the pool from `/proc/meminfo`.
    pub fn read() -> Result<Self, BufferError> {
        let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| {
            BufferError::NoHugePageSupport {
                detail: format!("cannot read /proc/meminfo: {e}"),
            }
        })?;
        Self::parse(&text).ok_or_else(|| BufferError::NoHugePageSupport {
            detail: "/proc/meminfo has no Hugepagesize, HugePages_Total and HugePages_Free"
                .to_owned(),
        })
    }
}

/// Why test buffers could not be prepared, allocated, registered or accessed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BufferError {
    /// The CUDA driver, the GPU, or a driver call.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// Registering host memory.
    #[error(transparent)]
    Register(#[from] MemoryRegionError),
    /// Registering GPU memory: sideway's error and the likely cause.
    #[error("{source}; {cause}")]
    GpuRegister {
        /// The registration error.
        source: MemoryRegionError,
        /// [`GpuRegistration::failure_cause`].
        cause: &'static str,
    },
    /// The kernel offers no huge pages at all.
    #[error(
        "--use-hugepages: this kernel offers no huge pages ({detail}); run without --use-hugepages"
    )]
    NoHugePageSupport {
        /// What was missing.
        detail: String,
    },
    /// No huge pages are reserved.
    #[error(
        "--use-hugepages: no huge pages are reserved (HugePages_Total is 0 in /proc/meminfo); \
         reserve some as root with `echo N > /proc/sys/vm/nr_hugepages` (N pages of {} KiB, \
         e.g. 64), or run without --use-hugepages",
        page_size / 1024
    )]
    NoHugePages {
        /// Bytes per huge page.
        page_size: usize,
    },
    /// Mapping huge pages failed, most likely for want of free ones.
    #[error("{}", huge_map_message(*len, *pool, source))]
    HugePageMap {
        /// Bytes asked for (whole huge pages).
        len: usize,
        /// The pool when it failed.
        pool: HugePagePool,
        /// mmap's errno.
        source: io::Error,
    },
    /// Copying in or out of host memory.
    #[error(transparent)]
    Access(#[from] sideway::memory_region::BufferError),
    /// The QPs' slices do not fit one region's length.
    #[error(
        "{qps} QPs of {slice} bytes each do not fit one memory region: use --mr-per-qp, or \
         fewer QPs"
    )]
    TooLarge {
        /// QPs.
        qps: usize,
        /// Bytes per QP.
        slice: usize,
    },
    /// A byte range outside the buffer.
    #[error("bytes {start}..{end} lie outside the {len}-byte test buffer")]
    OutOfRange {
        /// Start of the range.
        start: usize,
        /// End of the range.
        end: usize,
        /// The buffer's length.
        len: usize,
    },
}

fn huge_map_message(len: usize, pool: HugePagePool, source: &io::Error) -> String {
    let kib = pool.page_size / 1024;
    let pages = len.div_ceil(pool.page_size.max(1));
    let shortage = if pool.total == 0 {
        "no huge pages are reserved".to_owned()
    } else {
        format!(
            "{} of the {} reserved huge pages are free",
            pool.free, pool.total
        )
    };
    format!(
        "cannot map {len} bytes of huge pages ({pages} of {kib} KiB) for a memory region: \
         {source}; {shortage} (/proc/meminfo), and each memory region takes {pages} (one for \
         all QPs, or one per QP with --mr-per-qp), on each side running on this machine: \
         reserve more as root with `echo N > /proc/sys/vm/nr_hugepages`, or run without \
         --use-hugepages"
    )
}

/// A run's memory, prepared before anything connects.
#[derive(Debug)]
pub enum Memory {
    /// Page-aligned host memory.
    Host,
    /// Huge pages of this many bytes.
    HugePages {
        /// Bytes per huge page.
        page_size: usize,
    },
    /// GPU memory.
    Gpu {
        /// The GPU, its primary context retained.
        gpu: Arc<Gpu>,
        /// How the NIC registers it.
        registration: GpuRegistration,
    },
}

fn gpu_description(gpu: &Gpu, registration: GpuRegistration) -> String {
    format!("{}, {}", gpu.describe(), registration.describe())
}

fn huge_description(page_size: usize) -> String {
    format!("huge pages ({} KiB)", page_size / 1024)
}

impl Memory {
    /// Prepares `kind`: for GPU memory loads the CUDA driver and opens the GPU (and checks it
    /// can export dma-buf, for that registration); for huge pages reads the page size and
    /// checks some are reserved.
    pub fn prepare(kind: BufferKind) -> Result<Self, BufferError> {
        match kind {
            BufferKind::Host => Ok(Memory::Host),
            BufferKind::HugePages => {
                let pool = HugePagePool::read()?;
                if pool.total == 0 {
                    return Err(BufferError::NoHugePages {
                        page_size: pool.page_size,
                    });
                }
                Ok(Memory::HugePages {
                    page_size: pool.page_size,
                })
            }
            BufferKind::Gpu {
                index,
                registration,
            } => {
                let gpu = cuda::open_gpu(index)?;
                if registration == GpuRegistration::DmaBuf {
                    gpu.check_dma_buf_export()?;
                }
                Ok(Memory::Gpu { gpu, registration })
            }
        }
    }

    /// For the banner and the JSON report: `host`, `huge pages (2048 KiB)`,
    /// `GPU 0 (NAME, PCI 0000:1b:00.0), GPUDirect reg_mr` or `..., dma-buf`.
    pub fn description(&self) -> String {
        match self {
            Memory::Host => "host".to_owned(),
            Memory::HugePages { page_size } => huge_description(*page_size),
            Memory::Gpu { gpu, registration } => gpu_description(gpu, *registration),
        }
    }

    /// Whether the NIC works in memory the CPU can address (and so copy inline data from):
    /// host memory, huge pages, and the host side of staged GPU memory.
    pub fn is_host(&self) -> bool {
        !matches!(
            self,
            Memory::Gpu {
                registration: GpuRegistration::RegMr | GpuRegistration::DmaBuf,
                ..
            }
        )
    }

    /// Whether the data is staged between GPU and host memory (`--staging`).
    pub fn is_staged(&self) -> bool {
        matches!(
            self,
            Memory::Gpu {
                registration: GpuRegistration::Staged,
                ..
            }
        )
    }

    /// Allocates `len` zeroed bytes of this memory and registers them on `pd` with `access`.
    ///
    /// Each kind's memory is owned by its memory region (sideway's rule: freed only after a
    /// successful deregistration, leaked after a failed one), so no failure can let the NIC
    /// reach freed memory.
    pub fn allocate(
        &self,
        pd: &Arc<ProtectionDomain>,
        len: usize,
        access: AccessFlags,
    ) -> Result<TestBuffer, BufferError> {
        let inner = match self {
            Memory::Host => Inner::Host {
                buf: pd.reg_buffer(len, access)?,
                huge_page: None,
            },
            Memory::HugePages { page_size } => {
                let mapping = HugePageMapping::map(len, *page_size)?;
                let (ptr, mapped) = (mapping.ptr, mapping.len);
                // SAFETY: the mapping is `mapped` zero-filled bytes at a fixed address, owned
                // by `mapping` alone and unmapped only when it drops; the region takes it over.
                let buf = unsafe { pd.reg_buffer_owned(mapping, ptr, mapped, access)? };
                Inner::Host {
                    buf,
                    huge_page: Some(*page_size),
                }
            }
            Memory::Gpu {
                gpu,
                registration: GpuRegistration::Staged,
            } => {
                let host = pd.reg_buffer(len, access)?;
                let memory = gpu.alloc(len)?;
                memory.fill(0..memory.len(), 0)?;
                Inner::Staged(StagedBuffer { host, memory })
            }
            Memory::Gpu { gpu, registration } => {
                let memory = gpu.alloc(len)?;
                memory.set_sync_memops()?;
                let span = memory.len();
                memory.fill(0..span, 0)?;
                let memory = Arc::new(memory);
                // RegMr or DmaBuf: Staged took the arm above.
                let registered = if *registration == GpuRegistration::RegMr {
                    {
                        // SAFETY: device memory that stays allocated while the region's clone
                        // of `memory` lives; the CPU never addresses it.
                        unsafe {
                            pd.reg_mr_owned(
                                Arc::clone(&memory),
                                memory.addr() as *mut u8,
                                span,
                                access,
                            )
                        }
                    }
                } else {
                    {
                        let fd = memory.export_dma_buf()?;
                        // Offset 0 of the dma-buf is memory.addr(), which is also the address
                        // (iova) the work requests use. The region keeps the descriptor and the
                        // memory until it is deregistered.
                        let raw = fd.as_raw_fd();
                        // SAFETY: raw is `fd`, open until the region (its owner) drops it,
                        // which is after this call.
                        let fd_ref = unsafe { BorrowedFd::borrow_raw(raw) };
                        pd.reg_dmabuf_mr_owned(
                            (Arc::clone(&memory), fd),
                            fd_ref,
                            0,
                            span,
                            memory.addr(),
                            access,
                        )
                    }
                };
                let mr = registered.map_err(|source| BufferError::GpuRegister {
                    source,
                    cause: registration.failure_cause(),
                })?;
                Inner::Gpu(GpuBuffer {
                    mr,
                    memory,
                    registration: *registration,
                })
            }
        };
        Ok(TestBuffer { len, inner })
    }
}

/// Anonymous huge page memory; unmapped on drop (by the memory region that owns it, once
/// deregistered).
struct HugePageMapping {
    ptr: NonNull<u8>,
    /// Bytes mapped: whole huge pages.
    len: usize,
}

// SAFETY: the mapping is owned exclusively by its region; moving or sharing this value moves
// or shares only the right to unmap it, which needs `&mut` (drop).
unsafe impl Send for HugePageMapping {}
// SAFETY: as above: `&HugePageMapping` gives no access to the bytes.
unsafe impl Sync for HugePageMapping {}

impl HugePageMapping {
    /// Maps at least `len` bytes (`mmap` with `MAP_HUGETLB`), rounded up to whole pages.
    fn map(len: usize, page_size: usize) -> Result<Self, BufferError> {
        let pool_now = || {
            HugePagePool::read().unwrap_or(HugePagePool {
                page_size,
                total: 0,
                free: 0,
            })
        };
        let Some(mapped) = cuda::round_up(len.max(1), page_size) else {
            return Err(BufferError::HugePageMap {
                len,
                pool: pool_now(),
                source: io::Error::from_raw_os_error(libc::ENOMEM),
            });
        };
        // SAFETY: a new private anonymous mapping; no existing memory is named.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(BufferError::HugePageMap {
                len: mapped,
                pool: pool_now(),
                source: io::Error::last_os_error(),
            });
        }
        // mmap never returns NULL for a successful mapping without MAP_FIXED.
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| BufferError::HugePageMap {
            len: mapped,
            pool: pool_now(),
            source: io::Error::from_raw_os_error(libc::EFAULT),
        })?;
        // Anonymous mappings are zero-filled.
        Ok(HugePageMapping { ptr, len: mapped })
    }
}

impl Drop for HugePageMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in map(), unmapped exactly once; the region that owns it
        // drops it only after a successful deregistration.
        if unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) } != 0 {
            eprintln!(
                "stride-perf: warning: munmap of {} bytes of huge pages failed: {}",
                self.len,
                io::Error::last_os_error()
            );
        }
    }
}

/// GPU memory, shared with the region that owns it: the region's clone keeps it (and, for a
/// dma-buf, the descriptor) until deregistration succeeded; this one serves the copies.
struct GpuBuffer {
    mr: Arc<MemoryRegion>,
    memory: Arc<DeviceMemory>,
    registration: GpuRegistration,
}

/// GPU memory staged through registered host memory of the same length (`--staging`).
struct StagedBuffer {
    /// What the NIC reads and writes.
    host: RegisteredBuffer,
    /// Where the data comes from and goes to; the NIC never sees it.
    memory: DeviceMemory,
}

enum Inner {
    /// Host memory: the heap, or huge pages of `huge_page` bytes.
    Host {
        buf: RegisteredBuffer,
        huge_page: Option<usize>,
    },
    Gpu(GpuBuffer),
    Staged(StagedBuffer),
}

/// One QP's registered test buffer, in the memory the run chose.
pub struct TestBuffer {
    /// Bytes asked for; the registration may cover more (whole huge or GPU pages).
    len: usize,
    inner: Inner,
}

impl fmt::Debug for TestBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestBuffer")
            .field("memory", &self.description())
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .finish()
    }
}

fn check_range(range: &Range<usize>, len: usize) -> Result<(), BufferError> {
    if range.start > range.end || range.end > len {
        return Err(BufferError::OutOfRange {
            start: range.start,
            end: range.end,
            len,
        });
    }
    Ok(())
}

impl TestBuffer {
    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address work requests (ours and the peer's) use for the first byte: a host
    /// address, or a GPU device address.
    pub fn addr(&self) -> u64 {
        match &self.inner {
            Inner::Host { buf, .. } | Inner::Staged(StagedBuffer { host: buf, .. }) => buf.addr(),
            Inner::Gpu(b) => b.memory.addr(),
        }
    }

    /// The memory region, which owns the memory.
    pub fn mr(&self) -> &Arc<MemoryRegion> {
        match &self.inner {
            Inner::Host { buf, .. } | Inner::Staged(StagedBuffer { host: buf, .. }) => buf.mr(),
            Inner::Gpu(b) => &b.mr,
        }
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.mr().lkey()
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.mr().rkey()
    }

    /// What memory this is, as [`Memory::description`] says it.
    pub fn description(&self) -> String {
        match &self.inner {
            Inner::Host {
                huge_page: None, ..
            } => "host".to_owned(),
            Inner::Host {
                huge_page: Some(page_size),
                ..
            } => huge_description(*page_size),
            Inner::Gpu(b) => gpu_description(b.memory.gpu(), b.registration),
            Inner::Staged(b) => gpu_description(b.memory.gpu(), GpuRegistration::Staged),
        }
    }

    /// Whether the NIC works in memory the CPU can address (host memory, huge pages, the
    /// host side of a staged buffer).
    pub fn is_host(&self) -> bool {
        !matches!(self.inner, Inner::Gpu(_))
    }

    /// Whether the data is staged between the GPU and host memory (`--staging`).
    pub fn is_staged(&self) -> bool {
        matches!(self.inner, Inner::Staged(_))
    }

    /// A scatter/gather entry for `range` of the buffer, `None` when out of bounds.
    pub fn sge(&self, range: Range<usize>) -> Option<Sge> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        // The region starts at addr() for every kind (a dma-buf region at its iova) and
        // covers at least len bytes.
        self.mr().sge(range)
    }

    /// `range` as inline data for a send, when the CPU can address the bytes (copied
    /// straight from registered memory while posting); `None` for GPU memory or out of
    /// bounds.
    pub fn inline(&self, range: Range<usize>) -> Option<SendData<'_>> {
        match &self.inner {
            Inner::Host { buf, .. } | Inner::Staged(StagedBuffer { host: buf, .. })
                if range.end <= self.len =>
            {
                buf.inline(range)
            }
            _ => None,
        }
    }

    /// Reads byte `index` as the NIC left it (a volatile read, so that a spin loop reads
    /// memory every turn); `None` for GPU memory or past the end.
    #[inline(always)]
    pub fn peek(&self, index: usize) -> Option<u8> {
        match &self.inner {
            Inner::Host { buf, .. } | Inner::Staged(StagedBuffer { host: buf, .. })
                if index < self.len =>
            {
                buf.read_volatile::<u8>(index).ok()
            }
            _ => None,
        }
    }

    /// Sets byte `index` of the memory the NIC works in (a ping-pong's counter): for a
    /// staged buffer its host side only.
    #[inline]
    pub fn poke(&mut self, index: usize, byte: u8) -> Result<(), BufferError> {
        check_range(&(index..index.saturating_add(1)), self.len)?;
        match &mut self.inner {
            Inner::Host { buf, .. } | Inner::Staged(StagedBuffer { host: buf, .. }) => {
                Ok(buf.write_at(index, &[byte])?)
            }
            Inner::Gpu(b) => Ok(b.memory.write(index, &[byte])?),
        }
    }

    /// Sets every byte of `range` to `byte` (both sides of a staged buffer).
    pub fn fill(&mut self, range: Range<usize>, byte: u8) -> Result<(), BufferError> {
        check_range(&range, self.len)?;
        match &mut self.inner {
            Inner::Gpu(b) => Ok(b.memory.fill(range, byte)?),
            Inner::Host { buf, .. } => Ok(buf.fill(range, byte)?),
            Inner::Staged(b) => {
                b.host.fill(range.clone(), byte)?;
                Ok(b.memory.fill(range, byte)?)
            }
        }
    }

    /// Copies `data` into the buffer at `offset` (both sides of a staged buffer).
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), BufferError> {
        let range = offset..offset.saturating_add(data.len());
        check_range(&range, self.len)?;
        match &mut self.inner {
            Inner::Gpu(b) => Ok(b.memory.write(offset, data)?),
            Inner::Host { buf, .. } => Ok(buf.write_at(offset, data)?),
            Inner::Staged(b) => {
                b.host.write_at(offset, data)?;
                Ok(b.memory.write(offset, data)?)
            }
        }
    }

    /// Copies `range` out of the buffer (for validation): for a staged buffer, out of the
    /// GPU, where the staging copies put what the NIC received.
    pub fn read(&self, range: Range<usize>) -> Result<Vec<u8>, BufferError> {
        check_range(&range, self.len)?;
        match &self.inner {
            Inner::Gpu(b) => Ok(b.memory.read(range)?),
            Inner::Staged(b) => Ok(b.memory.read(range)?),
            Inner::Host { buf, .. } => Ok(buf.to_vec(range)?),
        }
    }

    /// Staging, before the NIC reads `range`: copies it from the GPU into the host memory
    /// the NIC reads (`cuMemcpyDtoH`). Nothing for other kinds.
    #[inline]
    pub fn stage_from_gpu(&self, range: Range<usize>) -> Result<(), BufferError> {
        let Inner::Staged(b) = &self.inner else {
            return Ok(());
        };
        check_range(&range, self.len)?;
        // SAFETY: range lies inside the host buffer (checked: len <= its length), which lives
        // while self does; the CPU reaches it only through copies and volatile reads, so no
        // Rust reference covers the bytes written.
        unsafe {
            b.memory
                .copy_to_host(range.clone(), b.host.as_ptr().add(range.start))?;
        }
        Ok(())
    }

    /// Staging, after the NIC wrote `range`: copies it from host memory to the GPU
    /// (`cuMemcpyHtoD`). Nothing for other kinds.
    #[inline]
    pub fn stage_to_gpu(&self, range: Range<usize>) -> Result<(), BufferError> {
        let Inner::Staged(b) = &self.inner else {
            return Ok(());
        };
        check_range(&range, self.len)?;
        // SAFETY: range lies inside the host buffer (checked), which lives while self does.
        unsafe {
            b.memory.copy_from_host(
                range.start,
                b.host.as_ptr().add(range.start),
                range.end - range.start,
            )?;
        }
        Ok(())
    }
}

/// How a run's QPs share registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrLayout {
    /// One memory region for all QPs, each QP using its own slice of it (perftest's default).
    Shared,
    /// One memory region per QP (`--mr-per-qp`, perftest's `--mr_per_qp`).
    PerQp,
}

impl MrLayout {
    /// The layout `--mr-per-qp` asks for.
    pub fn from_flag(mr_per_qp: bool) -> Self {
        if mr_per_qp {
            MrLayout::PerQp
        } else {
            MrLayout::Shared
        }
    }

    /// For the banner and the JSON report, with `qps` QPs.
    pub fn describe(self, qps: usize) -> String {
        match (self, qps) {
            (_, 1) => "one memory region".to_owned(),
            (MrLayout::Shared, n) => format!("one memory region shared by {n} QPs"),
            (MrLayout::PerQp, n) => format!("{n} memory regions, one per QP (--mr-per-qp)"),
        }
    }
}

/// The test buffers of a run's QPs: each QP owns a slice of `slice` bytes, in one memory
/// region shared by all (laid end to end, so that no two QPs' data overlap) or in a region of
/// its own.
pub struct QpBuffers {
    regions: Vec<TestBuffer>,
    layout: MrLayout,
    qps: usize,
    slice: usize,
}

impl fmt::Debug for QpBuffers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpBuffers")
            .field("layout", &self.layout)
            .field("qps", &self.qps)
            .field("slice", &self.slice)
            .field("regions", &self.regions)
            .finish()
    }
}

/// Bytes of one region holding `qps` slices of `slice` bytes in `layout`.
pub fn region_len(layout: MrLayout, qps: usize, slice: usize) -> Option<usize> {
    match layout {
        MrLayout::Shared => slice.checked_mul(qps.max(1)),
        MrLayout::PerQp => Some(slice),
    }
}

impl QpBuffers {
    /// Allocates and registers the buffers of `qps` QPs, `slice` bytes each, in `memory`.
    pub fn allocate(
        memory: &Memory,
        pd: &Arc<ProtectionDomain>,
        layout: MrLayout,
        qps: usize,
        slice: usize,
        access: AccessFlags,
    ) -> Result<Self, BufferError> {
        let qps = qps.max(1);
        let len = region_len(layout, qps, slice).ok_or(BufferError::TooLarge { qps, slice })?;
        let count = match layout {
            MrLayout::Shared => 1,
            MrLayout::PerQp => qps,
        };
        let regions = (0..count)
            .map(|_| memory.allocate(pd, len, access))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(QpBuffers {
            regions,
            layout,
            qps,
            slice,
        })
    }

    /// Whether the data is staged between the GPU and host memory (`--staging`).
    pub fn is_staged(&self) -> bool {
        self.regions.first().is_some_and(TestBuffer::is_staged)
    }

    /// How the QPs share memory.
    pub fn layout(&self) -> MrLayout {
        self.layout
    }

    /// The number of memory regions.
    pub fn regions(&self) -> usize {
        self.regions.len()
    }

    /// The number of QPs.
    pub fn qps(&self) -> usize {
        self.qps
    }

    /// Bytes of each QP's slice.
    pub fn slice_len(&self) -> usize {
        self.slice
    }

    #[inline]
    fn place(&self, q: usize) -> (usize, usize) {
        assert!(q < self.qps, "QP {q} of {}", self.qps);
        match self.layout {
            MrLayout::Shared => (0, q * self.slice),
            MrLayout::PerQp => (q, 0),
        }
    }

    /// QP `q`'s slice. Panics when `q` is not one of the QPs (an index the engine owns).
    #[inline]
    pub fn qp(&self, q: usize) -> QpBuffer<'_> {
        let (region, base) = self.place(q);
        QpBuffer {
            buf: &self.regions[region],
            base,
            len: self.slice,
        }
    }

    /// QP `q`'s slice, to write. Panics like [`QpBuffers::qp`].
    #[inline]
    pub fn qp_mut(&mut self, q: usize) -> QpBufferMut<'_> {
        let (region, base) = self.place(q);
        QpBufferMut {
            buf: &mut self.regions[region],
            base,
            len: self.slice,
        }
    }
}

fn shift(range: Range<usize>, base: usize, len: usize) -> Option<Range<usize>> {
    if range.start > range.end || range.end > len {
        return None;
    }
    Some(base + range.start..base + range.end)
}

/// One QP's slice of a registered test buffer; its offsets count from the slice's start.
#[derive(Clone, Copy)]
pub struct QpBuffer<'a> {
    buf: &'a TestBuffer,
    base: usize,
    len: usize,
}

impl<'a> QpBuffer<'a> {
    /// Bytes in the slice.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty slice.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the slice's first byte, as work requests use it.
    pub fn addr(&self) -> u64 {
        self.buf.addr() + self.base as u64
    }

    /// The region's local key.
    pub fn lkey(&self) -> u32 {
        self.buf.lkey()
    }

    /// The region's remote key.
    pub fn rkey(&self) -> u32 {
        self.buf.rkey()
    }

    /// A scatter/gather entry for `range` of the slice, `None` when out of bounds.
    #[inline]
    pub fn sge(&self, range: Range<usize>) -> Option<Sge> {
        self.buf.sge(shift(range, self.base, self.len)?)
    }

    /// `range` of the slice as inline data, as [`TestBuffer::inline`].
    #[inline]
    pub fn inline(&self, range: Range<usize>) -> Option<SendData<'a>> {
        self.buf.inline(shift(range, self.base, self.len)?)
    }

    /// Byte `index` of the slice as the NIC left it, as [`TestBuffer::peek`].
    #[inline(always)]
    pub fn peek(&self, index: usize) -> Option<u8> {
        if index >= self.len {
            return None;
        }
        self.buf.peek(self.base + index)
    }

    /// Copies `range` of the slice out, as [`TestBuffer::read`].
    pub fn read(&self, range: Range<usize>) -> Result<Vec<u8>, BufferError> {
        check_range(&range, self.len)?;
        self.buf
            .read(self.base + range.start..self.base + range.end)
    }

    /// Whether the data is staged between the GPU and host memory (`--staging`).
    pub fn is_staged(&self) -> bool {
        self.buf.is_staged()
    }

    /// Staging, before the NIC reads `range` of the slice: [`TestBuffer::stage_from_gpu`].
    #[inline]
    pub fn stage_from_gpu(&self, range: Range<usize>) -> Result<(), BufferError> {
        check_range(&range, self.len)?;
        self.buf
            .stage_from_gpu(self.base + range.start..self.base + range.end)
    }

    /// Staging, after the NIC wrote `range` of the slice: [`TestBuffer::stage_to_gpu`].
    #[inline]
    pub fn stage_to_gpu(&self, range: Range<usize>) -> Result<(), BufferError> {
        check_range(&range, self.len)?;
        self.buf
            .stage_to_gpu(self.base + range.start..self.base + range.end)
    }
}

/// One QP's slice of a registered test buffer, to write.
pub struct QpBufferMut<'a> {
    buf: &'a mut TestBuffer,
    base: usize,
    len: usize,
}

impl QpBufferMut<'_> {
    /// Sets every byte of `range` of the slice to `byte`.
    pub fn fill(&mut self, range: Range<usize>, byte: u8) -> Result<(), BufferError> {
        check_range(&range, self.len)?;
        self.buf
            .fill(self.base + range.start..self.base + range.end, byte)
    }

    /// Sets byte `index` of the slice in the memory the NIC works in, as
    /// [`TestBuffer::poke`].
    #[inline]
    pub fn poke(&mut self, index: usize, byte: u8) -> Result<(), BufferError> {
        check_range(&(index..index.saturating_add(1)), self.len)?;
        self.buf.poke(self.base + index, byte)
    }

    /// Copies `data` into the slice at `offset`.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), BufferError> {
        check_range(&(offset..offset.saturating_add(data.len())), self.len)?;
        self.buf.write(self.base + offset, data)
    }

    /// Copies `range` of the slice out.
    pub fn read(&self, range: Range<usize>) -> Result<Vec<u8>, BufferError> {
        check_range(&range, self.len)?;
        self.buf
            .read(self.base + range.start..self.base + range.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    const MEMINFO: &str = "MemTotal:        2014284 kB\n\
        HugePages_Total:      64\n\
        HugePages_Free:       62\n\
        HugePages_Rsvd:        0\n\
        HugePages_Surp:        0\n\
        Hugepagesize:       2048 kB\n\
        Hugetlb:          131072 kB\n";

    #[test]
    fn the_huge_page_pool_is_read_from_meminfo() {
        assert_eq!(
            HugePagePool::parse(MEMINFO),
            Some(HugePagePool {
                page_size: 2 << 20,
                total: 64,
                free: 62
            })
        );
        let gigantic = MEMINFO.replace("2048 kB", "1048576 kB");
        assert_eq!(
            HugePagePool::parse(&gigantic).map(|p| p.page_size),
            Some(1 << 30)
        );
        assert_eq!(HugePagePool::parse("MemTotal: 1 kB\n"), None);
        assert_eq!(
            HugePagePool::parse(&MEMINFO.replace("2048 kB", "3000 kB")),
            None
        );
        // A field whose name only starts like the one looked for is not taken.
        assert_eq!(
            HugePagePool::parse("Hugepagesize_x: 4 kB\nHugepagesize: 2048 kB\nHugePages_Total: 1\nHugePages_Free: 1\n")
                .map(|p| p.page_size),
            Some(2 << 20)
        );
    }

    #[test]
    fn huge_page_errors_say_how_to_reserve_them() {
        let none = BufferError::NoHugePages { page_size: 2 << 20 }.to_string();
        assert!(none.contains("no huge pages are reserved"), "{none}");
        assert!(
            none.contains("`echo N > /proc/sys/vm/nr_hugepages` (N pages of 2048 KiB"),
            "{none}"
        );
        let pool = HugePagePool {
            page_size: 2 << 20,
            total: 0,
            free: 0,
        };
        let e = BufferError::HugePageMap {
            len: 4 << 20,
            pool,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        }
        .to_string();
        assert!(
            e.starts_with(
                "cannot map 4194304 bytes of huge pages (2 of 2048 KiB) for a memory region: "
            ),
            "{e}"
        );
        assert!(e.contains("; no huge pages are reserved"), "{e}");
        assert!(
            e.contains(
                "each memory region takes 2 (one for all QPs, or one per QP with --mr-per-qp)"
            ),
            "{e}"
        );
        assert!(e.contains("`echo N > /proc/sys/vm/nr_hugepages`"), "{e}");
        let e = BufferError::HugePageMap {
            len: 2 << 20,
            pool: HugePagePool {
                total: 4,
                free: 0,
                ..pool
            },
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        }
        .to_string();
        assert!(e.contains("0 of the 4 reserved huge pages are free"), "{e}");
        assert!(e.contains("each memory region takes 1 ("), "{e}");
    }

    #[test]
    fn gpu_registration_failures_name_the_cause() {
        let source = || MemoryRegionError::Register {
            call: "ibv_reg_mr",
            device: "rxe0".into(),
            addr: 0x7f00_0000_0000,
            len: 131072,
            access: AccessFlags::LOCAL_WRITE,
            source: io::Error::from_raw_os_error(libc::EFAULT),
        };
        let e = BufferError::GpuRegister {
            source: source(),
            cause: GpuRegistration::RegMr.failure_cause(),
        }
        .to_string();
        assert!(e.starts_with("ibv_reg_mr of 131072 bytes"), "{e}");
        assert!(
            e.contains("; the NIC driver cannot register GPU memory: GPUDirect RDMA needs the nvidia-peermem module"),
            "{e}"
        );
        assert!(e.ends_with("try --use-cuda-dmabuf"), "{e}");
        let e = BufferError::GpuRegister {
            source: source(),
            cause: GpuRegistration::DmaBuf.failure_cause(),
        }
        .to_string();
        assert!(
            e.contains("the NIC driver does not support dma-buf registration (needs kernel 5.12+"),
            "{e}"
        );
        assert!(e.ends_with("SoftRoCE (rxe) supports neither"), "{e}");
    }

    #[test]
    fn the_kind_follows_the_command_line() {
        let kind = |args: &[&str]| {
            let mut argv = vec!["stride-perf", "write", "bw"];
            argv.extend_from_slice(args);
            let cli = Cli::try_parse_from(argv).unwrap();
            let (_, a) = cli.command.run_args().unwrap();
            BufferKind::from_args(a)
        };
        assert_eq!(kind(&[]), BufferKind::Host);
        assert_eq!(kind(&["--use-hugepages"]), BufferKind::HugePages);
        assert_eq!(
            kind(&["--use-cuda", "1"]),
            BufferKind::Gpu {
                index: 1,
                registration: GpuRegistration::RegMr
            }
        );
        assert_eq!(
            kind(&["--use-cuda", "2", "--staging"]),
            BufferKind::Gpu {
                index: 2,
                registration: GpuRegistration::Staged
            }
        );
        assert_eq!(
            kind(&["--use-cuda-dmabuf", "0"]),
            BufferKind::Gpu {
                index: 0,
                registration: GpuRegistration::DmaBuf
            }
        );
    }

    #[test]
    fn descriptions_name_the_memory() {
        assert_eq!(Memory::Host.description(), "host");
        assert!(Memory::Host.is_host());
        let huge = Memory::HugePages { page_size: 2 << 20 };
        assert_eq!(huge.description(), "huge pages (2048 KiB)");
        assert!(huge.is_host());
        assert_eq!(GpuRegistration::RegMr.describe(), "GPUDirect reg_mr");
        assert_eq!(GpuRegistration::DmaBuf.describe(), "dma-buf");
        assert_eq!(
            GpuRegistration::Staged.describe(),
            "staging through host memory"
        );
    }

    #[test]
    fn qps_share_one_region_unless_mr_per_qp() {
        assert_eq!(MrLayout::from_flag(false), MrLayout::Shared);
        assert_eq!(MrLayout::from_flag(true), MrLayout::PerQp);
        assert_eq!(region_len(MrLayout::Shared, 4, 128), Some(512));
        assert_eq!(region_len(MrLayout::PerQp, 4, 128), Some(128));
        assert_eq!(region_len(MrLayout::Shared, 0, 128), Some(128));
        assert_eq!(region_len(MrLayout::Shared, 3, usize::MAX / 2), None);
        assert_eq!(MrLayout::Shared.describe(1), "one memory region");
        assert_eq!(MrLayout::PerQp.describe(1), "one memory region");
        assert_eq!(
            MrLayout::Shared.describe(4),
            "one memory region shared by 4 QPs"
        );
        assert_eq!(
            MrLayout::PerQp.describe(4),
            "4 memory regions, one per QP (--mr-per-qp)"
        );
        let e = BufferError::TooLarge { qps: 3, slice: 64 }.to_string();
        assert!(e.contains("use --mr-per-qp, or fewer QPs"), "{e}");
    }

    #[test]
    fn slices_are_offset_and_bounded() {
        assert_eq!(shift(0..8, 256, 128), Some(256..264));
        assert_eq!(shift(120..128, 256, 128), Some(376..384));
        assert_eq!(shift(120..129, 256, 128), None);
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 9..8;
        assert_eq!(shift(backwards, 0, 128), None);
    }

    #[test]
    fn ranges_are_checked() {
        assert!(check_range(&(0..8), 8).is_ok());
        let e = check_range(&(4..9), 8).unwrap_err().to_string();
        assert_eq!(e, "bytes 4..9 lie outside the 8-byte test buffer");
    }

    #[test]
    fn preparing_host_memory_touches_nothing() {
        assert!(matches!(
            Memory::prepare(BufferKind::Host),
            Ok(Memory::Host)
        ));
    }
}
