//! The device contexts librdmacm opens and lends to its ids, wrapped once per device.

use std::io;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use rdma_mummy_sys as ffi;

use super::channel::lock;
use crate::errno::{fresh, non_null};
use crate::verbs::device::DeviceContext;

pub(super) fn device_name(verbs: *mut ffi::ibv_context) -> String {
    // SAFETY: verbs is an open context (the caller's id is bound); device and its name are
    // set by libibverbs and live as long as the context.
    unsafe {
        let device = (*verbs).device;
        if device.is_null() {
            return String::new();
        }
        let name = ffi::ibv_get_device_name(device);
        if name.is_null() {
            return String::new();
        }
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    }
}

/// librdmacm's device list from `rdma_get_devices`: while it is held, every device in it
/// (and so its context) stays open.
struct RdmacmDevices {
    list: NonNull<*mut ffi::ibv_context>,
}

// SAFETY: the list is only freed, once, in Drop; librdmacm's device bookkeeping is locked.
unsafe impl Send for RdmacmDevices {}
// SAFETY: as above; nothing reads it through a shared reference.
unsafe impl Sync for RdmacmDevices {}

impl Drop for RdmacmDevices {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and is freed once, here, after the
        // DeviceContext that borrowed from it (and everything built on that) is gone.
        unsafe { ffi::rdma_free_devices(self.list.as_ptr()) };
    }
}

/// Live wrappers of librdmacm's contexts, so ids on one device share one `DeviceContext`.
static LENT_CONTEXTS: Mutex<Vec<Weak<DeviceContext>>> = Mutex::new(Vec::new());

pub(super) fn lent_context(
    verbs: NonNull<ffi::ibv_context>,
) -> Result<Arc<DeviceContext>, io::Error> {
    let mut cache = lock(&LENT_CONTEXTS);
    cache.retain(|w| w.strong_count() > 0);
    if let Some(ctx) = cache
        .iter()
        .filter_map(Weak::upgrade)
        .find(|c| c.as_raw() == verbs.as_ptr())
    {
        return Ok(ctx);
    }
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer; the list is owned by RdmacmDevices below.
    let list = non_null(fresh(|| unsafe { ffi::rdma_get_devices(&mut n) }))?;
    let devices = RdmacmDevices { list };
    let len = usize::try_from(n).unwrap_or(0);
    // SAFETY: the list holds n context pointers (then NULL).
    let found = (0..len).any(|i| unsafe { *list.as_ptr().add(i) } == verbs.as_ptr());
    if !found {
        return Err(io::Error::from_raw_os_error(libc::ENODEV));
    }
    // SAFETY: verbs is in the list, which keeps it open while `devices` lives; the wrapper
    // owns `devices`.
    let ctx = unsafe { DeviceContext::from_lent(verbs, Box::new(devices)) };
    if let Err(e) = ctx.refuse_if_unlocked() {
        return Err(io::Error::new(io::ErrorKind::Unsupported, e.to_string()));
    }
    cache.push(Arc::downgrade(&ctx));
    Ok(ctx)
}
