/// The bytes of a [`RemoteBuffer`].
pub const REMOTE_BUFFER_LEN: usize = 16;

/// Where a buffer lies in its owner's memory, for the peer's RDMA READ, WRITE or atomics.
///
/// 16 bytes, every field big-endian: `struct { u64 addr; u32 rkey; u32 len; }`, the layout
/// rdma-core's `rping` sends in a SEND, and small enough for the private data of
/// `rdma_connect` (56 bytes on InfiniBand and RoCE) and `rdma_accept` (196).
///
/// ```
/// use sideway::connection::RemoteBuffer;
///
/// let mine = RemoteBuffer { addr: 0x7f00_1234_0000, rkey: 0x1d2e, len: 4096 };
/// let bytes = mine.to_bytes();
/// // Private data arrives zero-padded to the transport's size: read the first 16 bytes.
/// let mut padded = bytes.to_vec();
/// padded.resize(56, 0);
/// assert_eq!(RemoteBuffer::from_private_data(&padded)?, mine);
/// assert_eq!(RemoteBuffer::from_bytes(&bytes)?, mine);
/// # Ok::<(), sideway::connection::RemoteBufferError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RemoteBuffer {
    /// The buffer's address in its owner's memory (the `remote_addr` of the peer's work
    /// requests).
    pub addr: u64,
    /// The rkey of its memory region.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u32,
}

/// Bytes that cannot hold a [`RemoteBuffer`]: how many there were.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the peer sent {got} bytes where a {REMOTE_BUFFER_LEN}-byte buffer description \
     (address, rkey, length) belongs{}", if *exact { "" } else { " (at least)" }
)]
pub struct RemoteBufferError {
    /// How many bytes there were.
    pub got: usize,
    /// Whether exactly 16 were needed (a message) or at least 16 (private data).
    pub exact: bool,
}

impl RemoteBuffer {
    /// The 16 bytes on the wire.
    pub fn to_bytes(self) -> [u8; REMOTE_BUFFER_LEN] {
        let mut out = [0; REMOTE_BUFFER_LEN];
        out[..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Reads a message that is exactly 16 bytes (a SEND's payload, as `rping` sends it).
    pub fn from_bytes(msg: &[u8]) -> Result<Self, RemoteBufferError> {
        let b: &[u8; REMOTE_BUFFER_LEN] = msg.try_into().map_err(|_| RemoteBufferError {
            got: msg.len(),
            exact: true,
        })?;
        Ok(Self::read(b))
    }

    /// Reads the first 16 bytes of private data (an event's
    /// [`private_data`](crate::rdmacm::Event::private_data)), which InfiniBand and RoCE pad
    /// with zeros to the transport's size; the rest is ignored.
    pub fn from_private_data(data: &[u8]) -> Result<Self, RemoteBufferError> {
        match data.first_chunk::<REMOTE_BUFFER_LEN>() {
            Some(b) => Ok(Self::read(b)),
            None => Err(RemoteBufferError {
                got: data.len(),
                exact: false,
            }),
        }
    }

    fn read(b: &[u8; REMOTE_BUFFER_LEN]) -> Self {
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[..8]);
        RemoteBuffer {
            addr: u64::from_be_bytes(addr),
            rkey: u32_at(8),
            len: u32_at(12),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_rpings() {
        let b = RemoteBuffer {
            addr: 0x0102_0304_0506_0708,
            rkey: 0x090a_0b0c,
            len: 0x0d0e_0f10,
        };
        assert_eq!(
            b.to_bytes(),
            *b"\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10"
        );
        assert_eq!(RemoteBuffer::from_bytes(&b.to_bytes()), Ok(b));
    }

    #[test]
    fn short_or_long_messages_are_refused() {
        assert_eq!(
            RemoteBuffer::from_bytes(&[0; 15]),
            Err(RemoteBufferError {
                got: 15,
                exact: true
            })
        );
        assert!(RemoteBuffer::from_bytes(&[0; 17]).is_err());
        assert!(RemoteBuffer::from_private_data(&[0; 56]).is_ok());
        let e = RemoteBuffer::from_private_data(&[0; 3]).unwrap_err();
        assert!(e.to_string().contains("at least"), "{e}");
    }
}
