//! What rdma-core's `rping` puts on the wire, so our `rping` and theirs talk: the buffer
//! advertisement each SEND carries, and the ping data the client fills its buffer with.
//!
//! One ping, as both programs run it over an RC connection made with rdma_cm:
//!
//! 1. the client SENDs the address, rkey and length of its *source* buffer (the ping data);
//! 2. the server RDMA READs that much from it, and SENDs back a "go ahead";
//! 3. the client SENDs its *sink* buffer's advertisement;
//! 4. the server RDMA WRITEs the data it read into the sink, and SENDs a "go ahead";
//! 5. the client compares sink and source (`-V`) and starts the next ping.
//!
//! Each side keeps one receive posted for the other's next SEND, reposting it before it
//! sends again, so no SEND ever finds the peer without a receive.

use std::fmt;

use sideway::peer_text::printable;

/// The bytes of a [`BufferAdvert`] on the wire.
pub const ADVERT_LEN: usize = 16;

/// The first byte value of the rotating pattern (`A`).
const PATTERN_FIRST: u8 = b'A';
/// How many characters the pattern rotates through: `A` up to `z`, 58 of them.
const PATTERN_LEN: u8 = b'z' - b'A' + 1;

/// Where a buffer of the sender lies: `struct { u64 buf; u32 rkey; u32 size; }`, each field
/// in network byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferAdvert {
    /// The buffer's address in the sender's memory.
    pub addr: u64,
    /// The rkey of its memory region.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u32,
}

impl BufferAdvert {
    /// The 16 bytes a SEND carries.
    pub fn to_bytes(self) -> [u8; ADVERT_LEN] {
        let mut out = [0; ADVERT_LEN];
        out[..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Reads an advertisement from a received message, which must be exactly 16 bytes long.
    pub fn from_bytes(msg: &[u8]) -> Result<Self, ShortAdvert> {
        let bytes: &[u8; ADVERT_LEN] = msg.try_into().map_err(|_| ShortAdvert(msg.len()))?;
        let (addr, rest) = bytes.split_at(8);
        let (rkey, len) = rest.split_at(4);
        // The splits above are 8, 4 and 4 bytes long: the conversions cannot fail.
        let addr = u64::from_be_bytes(addr.try_into().unwrap_or_default());
        let rkey = u32::from_be_bytes(rkey.try_into().unwrap_or_default());
        let len = u32::from_be_bytes(len.try_into().unwrap_or_default());
        Ok(BufferAdvert { addr, rkey, len })
    }
}

/// A message that cannot be a buffer advertisement: its length, which is not 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortAdvert(pub usize);

impl fmt::Display for ShortAdvert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the peer sent a {}-byte message where a {ADVERT_LEN}-byte buffer advertisement \
             (address, rkey, length) belongs",
            self.0
        )
    }
}

impl std::error::Error for ShortAdvert {}

/// The smallest `-S` rdma-core's `rping` accepts: room for the longest prefix
/// (`rdma-ping-2147483647: `) and the terminating NUL.
pub const MIN_SIZE: usize = "rdma-ping-2147483647: ".len() + 1;
/// The largest `-S`: 64 KiB.
pub const MAX_SIZE: usize = 64 * 1024;

/// Fills `buf` with ping number `ping`'s data: `rdma-ping-N: `, then characters from `A` to
/// `z` round and round, starting `ping` places further along each ping, and a NUL in the
/// last byte. The prefix is cut short if `buf` is shorter than it.
pub fn fill_ping(buf: &mut [u8], ping: u64) {
    let Some(last) = buf.len().checked_sub(1) else {
        return;
    };
    let prefix = format!("rdma-ping-{ping}: ");
    let n = prefix.len().min(last);
    buf[..n].copy_from_slice(&prefix.as_bytes()[..n]);
    // The remainder of a division by 58 fits in a u8.
    let mut c = (ping % u64::from(PATTERN_LEN)) as u8;
    for b in &mut buf[n..last] {
        *b = PATTERN_FIRST + c;
        c = (c + 1) % PATTERN_LEN;
    }
    buf[last] = 0;
}

/// The ping data in `buf` as text: up to the first NUL, as rping prints it, and at most
/// `max_chars` characters of it. The data came from the peer: its control characters are
/// written out as escapes ([`printable`]), so that it cannot drive the terminal.
pub fn ping_text(buf: &[u8], max_chars: usize) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    printable(
        &String::from_utf8_lossy(buf.get(..end).unwrap_or(buf)),
        max_chars,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adverts_are_big_endian_and_round_trip() {
        let a = BufferAdvert {
            addr: 0x0102_0304_0506_0708,
            rkey: 0x1112_1314,
            len: 64,
        };
        let bytes = a.to_bytes();
        assert_eq!(
            bytes,
            [1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x12, 0x13, 0x14, 0, 0, 0, 64]
        );
        assert_eq!(BufferAdvert::from_bytes(&bytes), Ok(a));
        assert_eq!(BufferAdvert::from_bytes(&bytes[..15]), Err(ShortAdvert(15)));
        assert!(ShortAdvert(3).to_string().contains("3-byte"));
    }

    #[test]
    fn ping_data_matches_what_rdma_core_prints() {
        // As rdma-core's rping -v prints pings 0, 1 and 58 with the default size (64).
        let mut buf = [0xffu8; 64];
        fill_ping(&mut buf, 0);
        assert_eq!(
            ping_text(&buf, MAX_SIZE),
            "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
        assert_eq!(buf[63], 0);
        fill_ping(&mut buf, 1);
        assert_eq!(
            ping_text(&buf, MAX_SIZE),
            "rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs"
        );
        // After z the pattern starts over at A; ping 58 starts at A again.
        let mut buf = [0u8; 150];
        fill_ping(&mut buf, 58);
        let text = ping_text(&buf, MAX_SIZE);
        assert_eq!(text.len(), 149);
        assert!(text.starts_with("rdma-ping-58: ABC"), "{text}");
        assert!(text.ends_with("xyzABCDEFGHIJKLMNOPQRS"), "{text}");
    }

    #[test]
    fn ping_text_cannot_drive_the_terminal() {
        let mut buf = *b"rdma-ping-0: \x1b]0;owned\x07\x1b[2J\x7f\xc2\x9b1A\0junk";
        assert_eq!(
            ping_text(&buf, MAX_SIZE),
            "rdma-ping-0: \\x1b]0;owned\\x07\\x1b[2J\\x7f\\u{9b}1A"
        );
        assert_eq!(ping_text(&buf, 4), "rdma... (27 more characters not shown)");
        buf.fill(b'A');
        assert_eq!(ping_text(&buf, MAX_SIZE).len(), buf.len());
    }

    #[test]
    fn short_buffers_do_not_panic() {
        let mut buf = [9u8; 5];
        fill_ping(&mut buf, 7);
        assert_eq!(&buf, b"rdma\0");
        fill_ping(&mut [], 1);
        assert_eq!(MIN_SIZE, 23);
    }
}
