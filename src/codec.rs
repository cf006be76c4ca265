//! The one byte codec of the library's messages: set-up messages exchanged through the bootstrap and the
//! bootstrap's own frames. Little-endian fixed-width integers, byte arrays, and length-prefixed byte
//! strings, written in order and read back in the same order. A reader names its message in every error,
//! and a message must be read to its end (`Reader::finish`): a peer speaking another version fails
//! loudly instead of being half understood.

use crate::error::{Error, Result};

/// Writes a message.
#[derive(Default)]
pub struct Writer(Vec<u8>);

impl Writer {
    pub fn new() -> Writer {
        Writer(Vec::new())
    }
    pub fn with_capacity(n: usize) -> Writer {
        Writer(Vec::with_capacity(n))
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes(&[v])
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// A byte string of at most `u32::MAX` bytes, prefixed with its length.
    pub fn string(&mut self, b: &[u8]) -> &mut Self {
        let len = u32::try_from(b.len()).expect("message strings are short");
        self.u32(len).bytes(b)
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// Reads a message; every error names `what` (e.g. "IB set-up message").
pub struct Reader<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { rest: bytes, what }
    }
    /// An error about this message, of the kind a malformed peer message is.
    pub fn malformed(&self, why: impl std::fmt::Display) -> Error {
        Error::remote(format!("{} {why}", self.what))
    }
    pub fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.slice(N)?.try_into().expect("length checked"))
    }
    pub fn slice(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(self.malformed("is truncated"));
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    pub fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.take()?))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    /// A length-prefixed byte string of at most `max` bytes.
    pub fn string(&mut self, max: usize) -> Result<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(self.malformed(format!("holds a string of {len} bytes (at most {max})")));
        }
        self.slice(len)
    }
    /// Reads a `u32` magic and fails unless it is `magic`.
    pub fn magic(&mut self, magic: u32) -> Result<()> {
        let m = self.u32()?;
        if m != magic {
            return Err(self.malformed(format!("has a wrong magic ({m:#x}, not {magic:#x})")));
        }
        Ok(())
    }
    /// The message must end here, but for zero bytes that pad it to a fixed block.
    pub fn finish_padded(self) -> Result<()> {
        if self.rest.iter().all(|&b| b == 0) {
            Ok(())
        } else {
            Err(self.malformed("has non-zero bytes after its end"))
        }
    }
    /// The message must end here.
    pub fn finish(self) -> Result<()> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.malformed(format!("has {} trailing bytes", self.rest.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_order() {
        let mut w = Writer::new();
        w.u32(0x4d53_4331)
            .u8(7)
            .u16(513)
            .i32(-5)
            .u64(u64::MAX)
            .string(b"abc")
            .bytes(&[1, 2]);
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes, "test message");
        r.magic(0x4d53_4331).unwrap();
        assert_eq!(r.u8().unwrap(), 7);
        assert_eq!(r.u16().unwrap(), 513);
        assert_eq!(r.i32().unwrap(), -5);
        assert_eq!(r.u64().unwrap(), u64::MAX);
        assert_eq!(r.string(16).unwrap(), b"abc");
        assert_eq!(r.take::<2>().unwrap(), [1, 2]);
        r.finish().unwrap();
    }

    #[test]
    fn truncated_trailing_oversized_and_wrong_magic_fail_naming_the_message() {
        let mut w = Writer::new();
        w.u32(1).string(b"0123456789");
        let bytes = w.into_bytes();
        let e = Reader::new(&bytes[..3], "test message").u32().unwrap_err();
        assert!(e.message.contains("test message is truncated"), "{}", e.message);
        // Zero padding after a message's end is allowed where asked for, anything else is not.
        let mut padded = bytes.clone();
        padded.extend([0; 5]);
        let mut r = Reader::new(&padded, "test message");
        r.u32().unwrap();
        r.string(16).unwrap();
        r.finish_padded().unwrap();
        *padded.last_mut().unwrap() = 1;
        let mut r = Reader::new(&padded, "test message");
        r.u32().unwrap();
        r.string(16).unwrap();
        assert!(
            r.finish_padded()
                .unwrap_err()
                .message
                .contains("non-zero bytes after its end")
        );
        let e = Reader::new(&bytes, "test message").magic(2).unwrap_err();
        assert!(e.message.contains("wrong magic"), "{}", e.message);
        let mut r = Reader::new(&bytes, "test message");
        r.u32().unwrap();
        assert!(r.string(4).unwrap_err().message.contains("at most 4"));
        let mut r = Reader::new(&bytes, "test message");
        r.u32().unwrap();
        assert!(r.finish().unwrap_err().message.contains("14 trailing bytes"));
    }
}
