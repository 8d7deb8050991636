//! What a work request points at: scatter/gather entries ([`Sge`], `struct ibv_sge`) and a
//! send's local data ([`SendData`]). A leaf: plain values that memory regions hand out and
//! queue pairs and shared receive queues consume, so neither has to import the other.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use rdma_mummy_sys as ffi;

/// A scatter/gather entry (`struct ibv_sge`): a stretch of registered memory for one work
/// request. Built safely from a region
/// ([`MemoryRegion::sge`](crate::memory_region::MemoryRegion::sge),
/// [`RegisteredBuffer::sge`](crate::memory_region::RegisteredBuffer::sge)), which checks the
/// bounds.
#[doc(alias = "ibv_sge")]
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct Sge(pub(crate) ffi::ibv_sge);

impl PartialEq for Sge {
    fn eq(&self, other: &Self) -> bool {
        (self.addr(), self.length(), self.lkey()) == (other.addr(), other.length(), other.lkey())
    }
}

impl Eq for Sge {}

impl Sge {
    /// An entry from raw parts.
    ///
    /// # Safety
    ///
    /// `addr..addr + length` must lie inside the live memory region whose local key is
    /// `lkey`, and stay valid until every work request using the entry has completed. For an
    /// implicit on-demand region, inside which every address lies, that means memory the
    /// caller owns and the device may write (no Rust reference over it) for that long.
    pub unsafe fn from_raw_parts(addr: u64, length: u32, lkey: u32) -> Self {
        Sge(ffi::ibv_sge { addr, length, lkey })
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.0.addr
    }

    /// Length in bytes.
    pub fn length(&self) -> u32 {
        self.0.length
    }

    /// Local key of the region.
    pub fn lkey(&self) -> u32 {
        self.0.lkey
    }

    /// The C struct, for posting.
    pub fn as_raw(&self) -> &ffi::ibv_sge {
        &self.0
    }
}

/// The local data of a send work request.
#[doc(alias = "ibv_wr_set_sge")]
#[doc(alias = "ibv_wr_set_sge_list")]
#[doc(alias = "ibv_wr_set_inline_data")]
#[doc(alias = "ibv_wr_set_inline_data_list")]
#[derive(Debug, Clone, Copy, Default)]
pub enum SendData<'a> {
    /// No data (a zero-length message).
    #[default]
    Empty,
    /// One scatter/gather entry.
    Sge(Sge),
    /// A gather list: the entries' bytes are sent back to back.
    ///
    /// On extended QPs of rxe (SoftRoCE) with rdma-core 56 or older, the provider's
    /// `ibv_wr_set_sge_list` takes the message length to be the number of entries times the
    /// first entry's length (fixed upstream by rdma-core pull request 1744): there, use
    /// entries of equal length, or a classic QP.
    SgeList(&'a [Sge]),
    /// Bytes copied into the request while posting (at most `max_inline_data`).
    Inline(&'a [u8]),
    /// Several buffers copied back to back into the request.
    InlineList(&'a [&'a [u8]]),
    /// Bytes of a registered buffer copied into the request while posting, from
    /// [`RegisteredBuffer::inline`](crate::memory_region::RegisteredBuffer::inline): inline data
    /// straight from memory the device may write, where no `&[u8]` may be formed.
    InlineBuffer(BufferBytes<'a>),
}

/// A stretch of a [`RegisteredBuffer`](crate::memory_region::RegisteredBuffer), borrowed for `'a`,
/// that the CPU copies as inline data while posting; from
/// [`RegisteredBuffer::inline`](crate::memory_region::RegisteredBuffer::inline). It holds a pointer
/// rather than a slice: the device may write the buffer, so no reference to its bytes is formed.
#[derive(Clone, Copy)]
pub struct BufferBytes<'a> {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
    _buffer: PhantomData<&'a [u8]>,
}

// SAFETY: it stands for a shared borrow of a RegisteredBuffer, which is Sync; the bytes are
// only read (copied by the provider while posting).
unsafe impl Send for BufferBytes<'_> {}
// SAFETY: as above.
unsafe impl Sync for BufferBytes<'_> {}

impl BufferBytes<'_> {
    /// `len` bytes at `ptr`, inside a buffer borrowed for the returned lifetime.
    pub(crate) fn new(ptr: NonNull<u8>, len: usize) -> Self {
        BufferBytes {
            ptr,
            len,
            _buffer: PhantomData,
        }
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for BufferBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferBytes")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl From<Sge> for SendData<'_> {
    #[inline]
    fn from(sge: Sge) -> Self {
        SendData::Sge(sge)
    }
}

impl<'a> From<&'a [Sge]> for SendData<'a> {
    fn from(list: &'a [Sge]) -> Self {
        SendData::SgeList(list)
    }
}

impl<'a, const N: usize> From<&'a [Sge; N]> for SendData<'a> {
    fn from(list: &'a [Sge; N]) -> Self {
        SendData::SgeList(list)
    }
}

impl<'a> From<&'a [u8]> for SendData<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        SendData::Inline(bytes)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for SendData<'a> {
    fn from(bytes: &'a [u8; N]) -> Self {
        SendData::Inline(bytes)
    }
}

impl<'a> From<&'a [&'a [u8]]> for SendData<'a> {
    fn from(list: &'a [&'a [u8]]) -> Self {
        SendData::InlineList(list)
    }
}

impl SendData<'_> {
    #[inline]
    pub(crate) fn is_inline(&self) -> bool {
        matches!(
            self,
            SendData::Inline(_) | SendData::InlineList(_) | SendData::InlineBuffer(_)
        )
    }

    /// Scatter/gather entries (or inline buffers) it takes.
    #[inline]
    pub(crate) fn entries(&self) -> usize {
        match self {
            SendData::Empty => 0,
            SendData::Sge(_) | SendData::Inline(_) | SendData::InlineBuffer(_) => 1,
            SendData::SgeList(l) => l.len(),
            SendData::InlineList(l) => l.len(),
        }
    }

    #[inline]
    pub(crate) fn inline_len(&self) -> usize {
        match self {
            SendData::Inline(b) => b.len(),
            SendData::InlineList(l) => l.iter().map(|b| b.len()).sum(),
            SendData::InlineBuffer(b) => b.len,
            _ => 0,
        }
    }
}
