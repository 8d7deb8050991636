//! The frame codec: a message's frame (header, then JSON), and [`FrameBuffer`], which cuts
//! the peer's byte stream back into frames, one at a time.

use std::io::{self, Read};

use super::error::OobError;
use super::message::{Message, MAGIC, MAX_PAYLOAD, VERSION};
use sideway::peer_text::{printable, PEER_TEXT_MAX};

/// A frame's header: the magic, the version and the payload length.
const HEADER_LEN: usize = 10;
/// The most bytes one read asks for.
const READ_CHUNK: usize = 64 << 10;

/// How many more bytes the frame at the start of `buf` needs (0: it is whole); an error as
/// soon as its header shows it is not a frame of ours.
fn frame_needs(buf: &[u8]) -> Result<usize, OobError> {
    if buf.iter().zip(MAGIC).any(|(got, want)| got != want) {
        let head = buf.get(..MAGIC.len()).unwrap_or(buf);
        return Err(OobError::Garbage(format!(
            "the first bytes were \"{}\", not the stride-perf frame magic",
            printable(&String::from_utf8_lossy(head), PEER_TEXT_MAX)
        )));
    }
    let Some(&[_, _, _, _, v0, v1, l0, l1, l2, l3]) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(HEADER_LEN - buf.len());
    };
    let version = u16::from_be_bytes([v0, v1]);
    if version != VERSION {
        return Err(OobError::Version { peer: version });
    }
    let len = u32::from_be_bytes([l0, l1, l2, l3]);
    if len > MAX_PAYLOAD {
        return Err(OobError::Garbage(format!(
            "a {len}-byte message is too large"
        )));
    }
    // len <= MAX_PAYLOAD: the sum fits any usize.
    Ok((HEADER_LEN + len as usize).saturating_sub(buf.len()))
}

/// The frame a message travels in: the header, then the message as JSON.
pub fn encode_frame(msg: &Message) -> Result<Vec<u8>, OobError> {
    let payload = serde_json::to_vec(msg).map_err(|e| OobError::Io {
        what: "encoding a message".into(),
        source: io::Error::other(e),
    })?;
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= MAX_PAYLOAD)
        .ok_or_else(|| OobError::Garbage("a message of ours is too large".into()))?;
    let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&VERSION.to_be_bytes());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// The peer's byte stream cut back into frames: gathers the bytes of one frame at a time,
/// never more (a read asks for at most what the frame still needs), and decodes the frame
/// once it is whole. [`OobChannel`](super::OobChannel) reads through it; it holds no socket,
/// so anything that implements [`Read`] can feed it.
#[derive(Debug, Default)]
pub struct FrameBuffer {
    bytes: Vec<u8>,
}

impl FrameBuffer {
    /// An empty buffer, waiting for the first byte of a frame.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many more bytes the frame being gathered needs (0: it is whole, call
    /// [`FrameBuffer::take`]); an error as soon as the bytes show that it is not a frame of
    /// ours (wrong magic or version, a payload over [`MAX_PAYLOAD`]).
    pub fn needs(&self) -> Result<usize, OobError> {
        frame_needs(&self.bytes)
    }

    /// One read from `source` of at most `want` bytes (pass [`FrameBuffer::needs`]),
    /// appended to the frame; returns what the read returned.
    pub fn read_from(&mut self, source: &mut impl Read, want: usize) -> io::Result<usize> {
        let old = self.bytes.len();
        self.bytes.resize(old + want.min(READ_CHUNK), 0);
        let read = source.read(&mut self.bytes[old..]);
        let got = *read.as_ref().unwrap_or(&0);
        self.bytes.truncate(old + got);
        read
    }

    /// Decodes the whole frame gathered and empties the buffer for the next one, whether or
    /// not the frame decodes. A peer's `Abort` comes back as [`OobError::PeerAborted`].
    pub fn take(&mut self) -> Result<Message, OobError> {
        let decoded = serde_json::from_slice(self.bytes.get(HEADER_LEN..).unwrap_or_default());
        self.bytes.clear();
        // serde's messages quote what they could not decode, which is the peer's text.
        let msg: Message = decoded.map_err(|e| {
            OobError::Garbage(format!(
                "undecodable message: {}",
                printable(&e.to_string(), PEER_TEXT_MAX)
            ))
        })?;
        if let Message::Abort { reason } = msg {
            return Err(OobError::PeerAborted(printable(&reason, PEER_TEXT_MAX)));
        }
        Ok(msg)
    }

    /// How many bytes of the frame have come.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True when no byte of a frame has come.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes of the frame so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}
