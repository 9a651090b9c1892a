//! Little-endian cursor helpers shared by the RPC encoders and decoders.
//!
//! [`Reader`] never panics: every read checks the remaining length first and
//! returns [`FormatError::Short`] when the bytes run out.

use crate::FormatError;

/// A bounds-checked little-endian reader over a borrowed body.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if self.remaining() < n {
            return Err(FormatError::Short {
                what: self.what,
                need: self.pos.saturating_add(n),
                have: self.buf.len(),
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn u128(&mut self) -> Result<u128, FormatError> {
        Ok(u128::from_le_bytes(self.array()?))
    }

    /// A byte string whose length was read earlier, bounded by `max`.
    pub(crate) fn vec(
        &mut self,
        len: usize,
        max: usize,
        field: &'static str,
    ) -> Result<Vec<u8>, FormatError> {
        if len > max {
            return Err(self.range(field, len as u64));
        }
        Ok(self.bytes(len)?.to_vec())
    }

    pub(crate) fn range(&self, field: &'static str, value: u64) -> FormatError {
        FormatError::Range {
            what: self.what,
            field,
            value,
        }
    }

    /// Fails if bytes are left over: every body is decoded exactly.
    pub(crate) fn finish(self) -> Result<(), FormatError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(self.range("trailing bytes", n as u64)),
        }
    }
}

/// Appending little-endian writer methods for `Vec<u8>`.
pub(crate) trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_u128(&mut self, v: u128);
    fn put_bytes(&mut self, v: &[u8]);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u128(&mut self, v: u128) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_bytes(&mut self, v: &[u8]) {
        self.extend_from_slice(v);
    }
}

/// Length as the narrower wire integer; callers validate bounds first.
pub(crate) fn len_u16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// Length as u32; callers validate bounds first.
pub(crate) fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_refuses_short_and_trailing() {
        let mut r = Reader::new(&[1, 2, 3], "t");
        assert_eq!(r.u16(), Ok(0x0201));
        assert!(r.u16().is_err());
        assert!(r.finish().is_err(), "one byte left");
        let mut r = Reader::new(&[5], "t");
        assert!(r.vec(1, 0, "x").is_err(), "over max");
    }
}
