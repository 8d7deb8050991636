//! Parent domains (`ibv_alloc_parent_domain`): a PD of its own, made on a protection domain,
//! optionally bound to a thread domain and optionally with allocator callbacks the provider
//! calls for the buffers of the objects made on it. A parent domain holds its protection
//! domain, its thread domain and its allocator; the objects made on it hold the parent
//! domain, so the allocator outlives every buffer it handed out.

use std::ffi::c_void;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys as ffi;

use crate::errno::{fresh, non_null};
use crate::verbs::protection_domain::ProtectionDomain;
use crate::verbs::thread_domain::{DomainError, ThreadDomain};

/// `IBV_ALLOCATOR_USE_DEFAULT` of verbs.h, `(void *) -1`: "allocate this one yourself".
const IBV_ALLOCATOR_USE_DEFAULT: *mut c_void = usize::MAX as *mut c_void;

/// One buffer the provider asks a [`DomainAllocator`] for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AllocRequest {
    /// Bytes (`size`).
    pub size: usize,
    /// The alignment the buffer's address needs (`alignment`).
    pub alignment: usize,
    /// What the buffer is for (`resource_type`): a provider's value, e.g. mlx5dv's
    /// `MLX5DV_RES_TYPE_QP`, `_RWQ`, `_DBR`, `_SRQ`, `_CQ`.
    pub resource_type: u64,
}

/// What a [`DomainAllocator`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// A buffer of at least the size asked for, at the alignment asked for.
    Memory(NonNull<c_void>),
    /// Let the provider allocate this one itself (`IBV_ALLOCATOR_USE_DEFAULT`).
    ProviderDefault,
    /// No memory: the verb creating the object fails (`NULL`; `ENOMEM` on mlx5).
    Failed,
}

/// The allocator callbacks of a parent domain (`alloc` and `free` of `struct
/// ibv_parent_domain_init_attr`): the provider asks it for the queue buffers, doorbell
/// records, ... of every QP, CQ and SRQ made on the domain, and gives each back when the
/// object is destroyed.
///
/// # Panics
///
/// A panic never crosses into C: it is caught at the callback. A panicking `alloc` counts
/// as [`Allocation::Failed`] (creating the object fails); after a panicking `free` the
/// buffer is neither freed nor reused (it leaks). Both are logged at error level, target
/// `sideway`.
///
/// # Safety
///
/// The provider and the device use what `alloc` returns as queue memory. A
/// [`Allocation::Memory`] must point to at least `size` bytes aligned to `alignment`,
/// readable and writable, used by nothing else, and valid until `free` is called with the
/// same pointer (or forever, if it never is).
pub unsafe trait DomainAllocator: Send + Sync + 'static {
    /// Allocates a buffer (the `alloc` callback).
    fn alloc(&self, request: AllocRequest) -> Allocation;

    /// Frees a buffer `alloc` returned (the `free` callback); `resource_type` is the one it
    /// was allocated for.
    fn free(&self, ptr: NonNull<c_void>, resource_type: u64);
}

/// The `pd_context` the callbacks get: the allocator, boxed so that the pointer is thin.
type AllocatorBox = Box<Arc<dyn DomainAllocator>>;

/// The `alloc` callback handed to the provider.
unsafe extern "C" fn alloc_trampoline(
    _pd: *mut ffi::ibv_pd,
    pd_context: *mut c_void,
    size: usize,
    alignment: usize,
    resource_type: u64,
) -> *mut c_void {
    if pd_context.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: pd_context is the AllocatorBox of the parent domain the provider calls this
    // for, which lives until after the parent domain is deallocated (ParentParts).
    let allocator = unsafe { &*pd_context.cast::<Arc<dyn DomainAllocator>>() };
    let request = AllocRequest {
        size,
        alignment,
        resource_type,
    };
    match catch_unwind(AssertUnwindSafe(|| allocator.alloc(request))) {
        Ok(Allocation::Memory(ptr)) => ptr.as_ptr(),
        Ok(Allocation::ProviderDefault) => IBV_ALLOCATOR_USE_DEFAULT,
        Ok(Allocation::Failed) => std::ptr::null_mut(),
        Err(_) => {
            log::error!(
                target: "sideway",
                "a parent domain's allocator panicked in alloc({request:?}): the object \
                 being created fails"
            );
            std::ptr::null_mut()
        }
    }
}

/// The `free` callback handed to the provider.
unsafe extern "C" fn free_trampoline(
    _pd: *mut ffi::ibv_pd,
    pd_context: *mut c_void,
    ptr: *mut c_void,
    resource_type: u64,
) {
    let Some(ptr) = NonNull::new(ptr) else {
        return;
    };
    if pd_context.is_null() || ptr.as_ptr() == IBV_ALLOCATOR_USE_DEFAULT {
        return;
    }
    // SAFETY: as in alloc_trampoline.
    let allocator = unsafe { &*pd_context.cast::<Arc<dyn DomainAllocator>>() };
    if catch_unwind(AssertUnwindSafe(|| allocator.free(ptr, resource_type))).is_err() {
        log::error!(
            target: "sideway",
            "a parent domain's allocator panicked in free({ptr:p}, resource type \
             {resource_type}): the buffer leaks"
        );
    }
}

/// What the parent domain's PD keeps until after its `ibv_dealloc_pd`, dropped in this
/// order: the protection domain, the thread domain, the allocator.
struct ParentParts {
    _pd: Arc<ProtectionDomain>,
    _td: Option<Arc<ThreadDomain>>,
    _allocator: Option<AllocatorBox>,
}

// SAFETY: the parts are only held, and dropped once. The thread domain's drop calls
// ibv_dealloc_td, which is thread-safe; what a thread domain forbids is using its objects
// from two threads at once, not freeing it on another thread once they are gone. The PD
// and the allocator are Send + Sync.
unsafe impl Send for ParentParts {}
// SAFETY: nothing is reachable through `&ParentParts`.
unsafe impl Sync for ParentParts {}

impl ProtectionDomain {
    /// A builder for a parent domain on this protection domain.
    pub fn create_parent_domain_builder(self: &Arc<Self>) -> ParentDomainBuilder {
        ParentDomainBuilder {
            pd: Arc::clone(self),
            td: None,
            allocator: None,
        }
    }
}

/// Builds a [`ParentDomain`]; from [`ProtectionDomain::create_parent_domain_builder`].
/// Setters are named after the fields of `struct ibv_parent_domain_init_attr`.
#[doc(alias = "ibv_parent_domain_init_attr")]
#[derive(Clone)]
#[must_use = "a builder does nothing until build()"]
pub struct ParentDomainBuilder {
    pd: Arc<ProtectionDomain>,
    td: Option<Arc<ThreadDomain>>,
    allocator: Option<Arc<dyn DomainAllocator>>,
}

impl fmt::Debug for ParentDomainBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParentDomainBuilder")
            .field("pd", &self.pd)
            .field("td", &self.td)
            .field("allocator", &self.allocator.is_some())
            .finish()
    }
}

impl ParentDomainBuilder {
    /// Binds the parent domain to a thread domain (`td`): the provider takes no lock for
    /// the objects made on it. See [`ParentDomain`]'s "Threads".
    pub fn thread_domain(&mut self, td: &Arc<ThreadDomain>) -> &mut Self {
        self.td = Some(Arc::clone(td));
        self
    }

    /// Custom allocator callbacks (`alloc`, `free` and `pd_context`, with
    /// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT`).
    pub fn allocator(&mut self, allocator: impl DomainAllocator) -> &mut Self {
        self.allocator = Some(Arc::new(allocator));
        self
    }

    /// Allocates the parent domain (`ibv_alloc_parent_domain`). Devices without parent
    /// domains (rxe, siw) fail with `EOPNOTSUPP` ([`DomainError::is_not_supported`]).
    #[doc(alias = "ibv_alloc_parent_domain")]
    pub fn build(&self) -> Result<Arc<ParentDomain>, DomainError> {
        let ctx = self.pd.context();
        let allocator: Option<AllocatorBox> = self.allocator.clone().map(Box::new);
        let pd_context = allocator.as_ref().map_or(std::ptr::null_mut(), |a| {
            std::ptr::from_ref::<Arc<dyn DomainAllocator>>(a)
                .cast_mut()
                .cast::<c_void>()
        });
        let mut attr = ffi::ibv_parent_domain_init_attr {
            pd: self.pd.as_raw(),
            td: self
                .td
                .as_ref()
                .map_or(std::ptr::null_mut(), |td| td.as_raw()),
            comp_mask: 0,
            alloc: None,
            free: None,
            pd_context: std::ptr::null_mut(),
        };
        if allocator.is_some() {
            attr.comp_mask =
                ffi::ibv_parent_domain_init_attr_mask::IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS
                    | ffi::ibv_parent_domain_init_attr_mask::IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
            attr.alloc = Some(alloc_trampoline);
            attr.free = Some(free_trampoline);
            attr.pd_context = pd_context;
        }
        // SAFETY: the context, PD and TD are alive, and stay so for the parent domain's life
        // (ParentParts); pd_context points into the allocator box, which ParentParts keeps
        // until after the parent domain is deallocated; attr is fully initialised.
        let raw = fresh(|| unsafe { ffi::ibv_alloc_parent_domain(ctx.as_raw(), &mut attr) });
        let raw = non_null(raw).map_err(|source| DomainError {
            call: "ibv_alloc_parent_domain",
            device: ctx.name().to_owned(),
            source,
        })?;
        let parts = ParentParts {
            _pd: Arc::clone(&self.pd),
            _td: self.td.clone(),
            _allocator: allocator,
        };
        // SAFETY: raw is the parent domain just allocated on ctx, known to nothing else;
        // parts holds everything it depends on.
        let as_pd = unsafe {
            ProtectionDomain::from_parent_domain(raw, ctx, Box::new(parts), self.td.is_some())
        };
        // An Arc like every other verbs object, though it stays on this thread: code that
        // holds objects reads the same whatever their kind, at the cost of an atomic count
        // on the control path.
        #[allow(clippy::arc_with_non_send_sync)]
        let made = Arc::new(ParentDomain {
            as_pd,
            pd: Arc::clone(&self.pd),
            td: self.td.clone(),
        });
        Ok(made)
    }
}

/// A parent domain (`ibv_alloc_parent_domain`): a PD of its own on a protection domain,
/// optionally bound to a thread domain, optionally with a [`DomainAllocator`]. Queue pairs
/// are made on it with [`create_qp_builder`](Self::create_qp_builder) (bound to one thread),
/// or, without a thread domain, through [`as_pd`](Self::as_pd) like on any PD; extended CQs
/// (without a thread domain) with
/// [`CompletionQueueBuilder::parent_domain`](crate::completion_queue::CompletionQueueBuilder::parent_domain);
/// SRQs (without a thread domain) and memory regions through `as_pd`. Each object holds the parent
/// domain, which is deallocated (`ibv_dealloc_pd`) after the last of them and before its protection
/// domain, thread domain and allocator.
///
/// # Threads
///
/// A `ParentDomain` is neither `Send` nor `Sync`, like the [`ThreadDomain`] it may hold:
/// it is used on the thread that made it. What is made on it:
///
/// - Queue pairs from [`create_qp_builder`](Self::create_qp_builder) are
///   `QueuePair<OneThread>`: neither `Send` nor `Sync`, and neither are their posting guards
///   (compile-fail tests there). The QPs bound to one thread domain share provider state (on
///   mlx5, the domain's doorbell register, written without a lock), so each QP's `&mut`
///   posting is not enough: all of them must post from one thread.
/// - CQs: only on a parent domain without a thread domain
///   ([`CompletionQueueError::ThreadBoundPd`](crate::completion_queue::CompletionQueueError::ThreadBoundPd)
///   otherwise; see
///   [`CompletionQueueBuilder::parent_domain`](crate::completion_queue::CompletionQueueBuilder::parent_domain)).
///   A thread domain's QPs use ordinary CQs.
/// - Memory regions are made through [`as_pd`](Self::as_pd) as on any PD. On a
///   thread-domain-bound parent domain its `create_qp_builder` fails
///   ([`QueuePairError::ThreadBoundPd`](crate::queue_pair::QueuePairError::ThreadBoundPd): its QPs
///   would be `Send`), and so do SRQs
///   ([`SharedReceiveQueueError::ThreadBoundPd`](crate::shared_receive_queue::SharedReceiveQueueError::ThreadBoundPd):
///   the provider takes no SRQ lock there, while polling on another thread hands the SRQ's
///   receives back; a one-thread SRQ type is not offered yet).
///
/// ```compile_fail,E0277
/// # fn demo(parent: std::sync::Arc<sideway::parent_domain::ParentDomain>) {
/// std::thread::spawn(move || drop(parent)); // a parent domain stays on its thread
/// # }
/// ```
#[doc(alias = "ibv_alloc_parent_domain")]
pub struct ParentDomain {
    /// The parent domain itself, as a PD; its `keep` holds `pd`, `td` and the allocator.
    as_pd: Arc<ProtectionDomain>,
    pd: Arc<ProtectionDomain>,
    td: Option<Arc<ThreadDomain>>,
}

impl ParentDomain {
    /// The parent domain as a protection domain, to make memory regions on, and queue pairs
    /// and SRQs when it is not bound to a thread domain (when it is, they fail with
    /// `ThreadBoundPd`: make QPs with [`create_qp_builder`](Self::create_qp_builder)).
    pub fn as_pd(&self) -> &Arc<ProtectionDomain> {
        &self.as_pd
    }

    /// The protection domain the parent domain is made on.
    pub fn protection_domain(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The thread domain it is bound to, if any.
    pub fn thread_domain(&self) -> Option<&Arc<ThreadDomain>> {
        self.td.as_ref()
    }

    /// The raw `ibv_pd` of the parent domain, valid while it is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        self.as_pd.as_raw()
    }

    /// The parent domain as a PD, for the builders inside the crate (a CQ's
    /// `parent_domain`, [`create_qp_builder`](Self::create_qp_builder)).
    pub(crate) fn pd_inner(&self) -> &Arc<ProtectionDomain> {
        &self.as_pd
    }
}

impl fmt::Debug for ParentDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParentDomain")
            .field("device", &self.pd.context().name())
            .field("pd_handle", &self.pd.handle())
            .field("thread_domain", &self.td.is_some())
            .finish_non_exhaustive()
    }
}
