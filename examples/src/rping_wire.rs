//! What rdma-core's `rping` puts on the wire, so our `rping` and theirs talk: the ping data
//! the client fills its buffer with. The buffer advertisement each SEND carries is
//! [`sideway::connection::RemoteBuffer`].
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

use sideway::peer_text::printable;

/// The first byte value of the rotating pattern (`A`).
const PATTERN_FIRST: u8 = b'A';
/// How many characters the pattern rotates through: `A` up to `z`, 58 of them.
const PATTERN_LEN: u8 = b'z' - b'A' + 1;

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
