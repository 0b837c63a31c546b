//! The probe's message format, shared by client and server.
//!
//! Every message (UDP datagram, or TCP frame body) starts with a 24-byte header, followed by
//! zero padding up to the configured size:
//!
//! | bytes  | field     | meaning                                                        |
//! |--------|-----------|----------------------------------------------------------------|
//! | 0..3   | magic     | `b"vqP"`                                                       |
//! | 3      | kind      | `b'Q'` request (client → server), `b'R'` response (echo)       |
//! | 4..8   | session   | u32 LE, random per client run; stale echoes are not counted    |
//! | 8..16  | seq       | u64 LE, 0, 1, 2, … per run                                     |
//! | 16..24 | send time | u64 LE, ns since the client's start on its monotonic clock     |
//!
//! The server answers a request with the same bytes, only the kind changed to `b'R'`. Over TCP
//! each message is preceded by its length as a u32 LE; a length outside
//! [`MIN_SIZE`]`..=`[`MAX_SIZE`] cannot be resynchronised and closes the connection.

use std::io::{self, ErrorKind, Read};

/// Length of the header every message starts with.
pub const HEADER_LEN: usize = 24;
/// Smallest message size (the header alone).
pub const MIN_SIZE: usize = HEADER_LEN;
/// Largest message size (the largest UDP payload over IPv4).
pub const MAX_SIZE: usize = 65_507;
/// Length of the TCP length prefix.
pub const PREFIX_LEN: usize = 4;

const MAGIC: [u8; 3] = *b"vqP";
const KIND_REQUEST: u8 = b'Q';
const KIND_RESPONSE: u8 = b'R';

/// Whether a message is a request or its echo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Client → server.
    Request,
    /// Server → client.
    Response,
}

/// The decoded header of a probe message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Request or response.
    pub kind: Kind,
    /// The client run's session id.
    pub session: u32,
    /// Sequence number within the run.
    pub seq: u64,
    /// Send time, ns since the client's start (monotonic clock).
    pub send_ns: u64,
}

impl Header {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `buf`; returns false (and writes
    /// nothing) when `buf` is shorter.
    pub fn encode_into(&self, buf: &mut [u8]) -> bool {
        let Some(h) = buf.get_mut(..HEADER_LEN) else {
            return false;
        };
        h[..3].copy_from_slice(&MAGIC);
        h[3] = match self.kind {
            Kind::Request => KIND_REQUEST,
            Kind::Response => KIND_RESPONSE,
        };
        h[4..8].copy_from_slice(&self.session.to_le_bytes());
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.send_ns.to_le_bytes());
        true
    }

    /// Decodes a whole message; `None` when its length is outside
    /// [`MIN_SIZE`]`..=`[`MAX_SIZE`], the magic is wrong or the kind unknown.
    pub fn parse(msg: &[u8]) -> Option<Header> {
        if msg.len() < MIN_SIZE || msg.len() > MAX_SIZE || msg[..3] != MAGIC {
            return None;
        }
        let kind = match msg[3] {
            KIND_REQUEST => Kind::Request,
            KIND_RESPONSE => Kind::Response,
            _ => return None,
        };
        let u32_at = |i: usize| u32::from_le_bytes([msg[i], msg[i + 1], msg[i + 2], msg[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        Some(Header {
            kind,
            session: u32_at(4),
            seq: u64_at(8),
            send_ns: u64_at(16),
        })
    }
}

/// Turns a valid request into its response in place; returns false (and changes nothing) when
/// `msg` is not a valid request.
pub fn answer_in_place(msg: &mut [u8]) -> bool {
    match Header::parse(msg) {
        Some(h) if h.kind == Kind::Request => {
            msg[3] = KIND_RESPONSE;
            true
        }
        _ => false,
    }
}

/// What one [`FrameReader::poll`] produced.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameEvent {
    /// A whole frame is available through [`FrameReader::frame`].
    Frame,
    /// The read timed out before a whole frame arrived (the partial frame is kept).
    Idle,
    /// The peer closed the connection.
    Eof,
    /// A length prefix outside the allowed range: the stream cannot be resynchronised.
    BadLength(usize),
}

/// Reassembles length-prefixed frames from a stream read with a timeout, without losing partial
/// frames when the timeout fires.
pub(crate) struct FrameReader {
    buf: Vec<u8>,
    len: usize,
    consumed: usize,
}

impl FrameReader {
    pub(crate) fn new() -> Self {
        FrameReader {
            buf: vec![0; PREFIX_LEN + MAX_SIZE],
            len: 0,
            consumed: 0,
        }
    }

    /// Reads until a whole frame is buffered, the read times out, or the stream ends.
    pub(crate) fn poll(&mut self, r: &mut impl Read) -> io::Result<FrameEvent> {
        if self.consumed > 0 {
            self.buf.copy_within(self.consumed..self.len, 0);
            self.len -= self.consumed;
            self.consumed = 0;
        }
        loop {
            if self.len >= PREFIX_LEN {
                let n = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
                    as usize;
                if !(MIN_SIZE..=MAX_SIZE).contains(&n) {
                    return Ok(FrameEvent::BadLength(n));
                }
                if self.len >= PREFIX_LEN + n {
                    self.consumed = PREFIX_LEN + n;
                    return Ok(FrameEvent::Frame);
                }
            }
            match r.read(&mut self.buf[self.len..]) {
                Ok(0) => return Ok(FrameEvent::Eof),
                Ok(k) => self.len += k,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(FrameEvent::Idle)
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The frame (prefix included) returned by the last [`FrameEvent::Frame`].
    pub(crate) fn frame(&mut self) -> &mut [u8] {
        &mut self.buf[..self.consumed]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(seq: u64, size: usize) -> Vec<u8> {
        let mut m = vec![0u8; size];
        let h = Header {
            kind: Kind::Request,
            session: 0xdead_beef,
            seq,
            send_ns: 123_456_789_012,
        };
        assert!(h.encode_into(&mut m));
        m
    }

    #[test]
    fn header_round_trip_and_answer() {
        let mut m = request(u64::MAX - 1, 64);
        let h = Header::parse(&m).unwrap();
        assert_eq!(h.kind, Kind::Request);
        assert_eq!(h.session, 0xdead_beef);
        assert_eq!(h.seq, u64::MAX - 1);
        assert_eq!(h.send_ns, 123_456_789_012);
        assert!(answer_in_place(&mut m));
        let r = Header::parse(&m).unwrap();
        assert_eq!(
            r,
            Header {
                kind: Kind::Response,
                ..h
            }
        );
        // A response is not answered again (no ping-pong between two servers).
        assert!(!answer_in_place(&mut m));
        assert!(!Header {
            kind: Kind::Request,
            session: 0,
            seq: 0,
            send_ns: 0
        }
        .encode_into(&mut [0u8; 10]));
    }

    #[test]
    fn garbage_is_rejected_without_panic() {
        assert!(Header::parse(&[]).is_none());
        assert!(Header::parse(&[0u8; 23]).is_none());
        assert!(Header::parse(&[0u8; 64]).is_none());
        let mut m = request(1, 64);
        m[3] = b'X';
        assert!(Header::parse(&m).is_none());
        assert!(Header::parse(&vec![0u8; MAX_SIZE + 1]).is_none());
        // Pseudo-random buffers of every length up to 100 bytes: never a panic.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..100 {
            let mut b = vec![0u8; len];
            for byte in &mut b {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            let _ = Header::parse(&b);
            let _ = answer_in_place(&mut b);
        }
    }

    #[test]
    fn frame_reader_reassembles_split_frames() {
        let mut stream = Vec::new();
        for seq in 0..3 {
            let m = request(seq, 40);
            stream.extend_from_slice(&(m.len() as u32).to_le_bytes());
            stream.extend_from_slice(&m);
        }
        stream.extend_from_slice(&5u32.to_le_bytes());
        // A reader that hands out 7 bytes at a time, then times out once, repeatedly.
        struct Trickle(Vec<u8>, usize, bool);
        impl Read for Trickle {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                self.2 = !self.2;
                if self.2 {
                    return Err(ErrorKind::WouldBlock.into());
                }
                let n = out.len().min(7).min(self.0.len() - self.1);
                out[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
                self.1 += n;
                Ok(n)
            }
        }
        let mut r = Trickle(stream, 0, false);
        let mut fr = FrameReader::new();
        let mut seqs = Vec::new();
        loop {
            match fr.poll(&mut r).unwrap() {
                FrameEvent::Frame => {
                    let f = fr.frame();
                    assert_eq!(f.len(), PREFIX_LEN + 40);
                    seqs.push(Header::parse(&f[PREFIX_LEN..]).unwrap().seq);
                }
                FrameEvent::Idle => {}
                FrameEvent::BadLength(n) => {
                    assert_eq!(n, 5);
                    break;
                }
                FrameEvent::Eof => panic!("unexpected eof"),
            }
        }
        assert_eq!(seqs, vec![0, 1, 2]);
    }
}
