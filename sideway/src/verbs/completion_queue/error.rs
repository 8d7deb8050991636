//! Why a completion queue or channel could not be created, or polled: below the queue, its
//! polling and the channel, which all return it.

use std::io;

/// Why a completion queue or channel could not be created, or polled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompletionQueueError {
    /// The create verb failed.
    #[error(
        "{call} with {cqe} entries failed on {device}: {source}{}",
        create_hint(source, call)
    )]
    Create {
        /// `ibv_create_cq` or `ibv_create_cq_ex`.
        call: &'static str,
        /// The device's name.
        device: String,
        /// The requested number of entries.
        cqe: u32,
        /// The errno.
        source: io::Error,
    },
    /// `ibv_create_comp_channel` failed.
    #[error("ibv_create_comp_channel failed on {device}: {source}")]
    CreateChannel {
        /// The device's name.
        device: String,
        /// The errno.
        source: io::Error,
    },
    /// The poll verb failed (the CQ overran, or the device is in error).
    #[error("{call} failed on a CQ: {source}")]
    Poll {
        /// `ibv_poll_cq` or `ibv_start_poll`/`ibv_next_poll`.
        call: &'static str,
        /// The errno.
        source: io::Error,
    },
    /// A CQ on a parent domain was asked for with `build()`: only `ibv_create_cq_ex` takes
    /// a parent domain.
    #[error("a CQ on a parent domain needs ibv_create_cq_ex: use build_ex()")]
    ParentDomainNeedsEx,
    /// A CQ on a parent domain bound to a thread domain: not offered (see
    /// [`CompletionQueueBuilder::parent_domain`](crate::completion_queue::CompletionQueueBuilder::parent_domain)).
    #[error(
        "a CQ on a parent domain bound to a thread domain is not offered on {device}: make \
         the CQ without parent_domain()"
    )]
    ThreadBoundPd {
        /// The device's name.
        device: String,
    },
    /// Another [`Poller`](crate::completion_queue::Poller) or
    /// [`ClaimedCq`](crate::completion_queue::ClaimedCq) of this CQ is still alive: one poller at a
    /// time, classic or extended (see
    /// [`CompletionQueue`](crate::completion_queue::CompletionQueue)'s "Threads").
    #[error("this CQ is already being polled (drop the other Poller or ClaimedCq first)")]
    Busy,
    /// The provider made an extended CQ without a function that polling it needs: one every
    /// extended CQ has (`start_poll`, `read_opcode`, ...), or the reader of a field its WC
    /// flags asked for. Checked when the CQ is created, so polling never meets a NULL one.
    #[error(
        "ibv_create_cq_ex on {device} made a CQ without cq_ex->{function}, which polling it \
         with these WC flags needs (use build(), or leave that field's flag out)"
    )]
    MissingFunction {
        /// The device's name.
        device: String,
        /// The `ibv_cq_ex` field that was NULL, e.g. `read_byte_len`.
        function: &'static str,
    },
}

impl CompletionQueueError {
    /// True when the create verb failed with `EOPNOTSUPP`: the device has no extended CQ, or
    /// not with the WC flags asked for (completion timestamps on rxe).
    pub fn is_not_supported(&self) -> bool {
        matches!(self, CompletionQueueError::Create { source, .. }
            if source.raw_os_error() == Some(libc::EOPNOTSUPP))
    }
}

fn create_hint(source: &io::Error, call: &str) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EOPNOTSUPP) if call == "ibv_create_cq_ex" => {
            " (not supported by this device: it has no extended CQ, or not with these WC \
             flags (completion timestamps need a device with a timestamp mask); use build() \
             or fewer flags instead)"
        }
        Some(libc::EINVAL) => " (more entries than the device's max_cqe?)",
        _ => "",
    }
}
