//! Byte cursors for the trace's primitive encodings (FORMAT.md §1), and the crate's one byte
//! reader: the unwinder parses DWARF call-frame information with [`ReadCursor`] too.
//!
//! [`WriteBuf`] is a fixed-size output buffer with a write position; it never grows past its
//! capacity, and a write that does not fit sets a sticky overflow flag instead of panicking,
//! so the writer can check once per event. [`ReadCursor`] walks a byte slice; every read is
//! bounds-checked and running out of bytes is an [`Error`] carrying the absolute offset in the
//! file.

use crate::format::error::{Error, ErrorKind, Result};

/// A fixed-capacity little-endian output buffer (upstream `Buf.Write`).
///
/// Its storage is allocated whole but not written until used (not zeroed), so that memory
/// no packet reaches costs nothing: a short trace's packets fill a page or two of the
/// writer's 32 KiB buffers, whose zeroing took the writer a page fault per page as it started.
#[derive(Debug, Clone)]
pub struct WriteBuf {
    /// The bytes written so far: never longer than `capacity`, so that it never reallocates.
    bytes: Vec<u8>,
    capacity: usize,
    overflowed: bool,
}

impl WriteBuf {
    /// A buffer of exactly `capacity` bytes, empty.
    pub fn with_capacity(capacity: usize) -> WriteBuf {
        WriteBuf { bytes: Vec::with_capacity(capacity), capacity, overflowed: false }
    }

    /// The bytes written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The write position (number of bytes written).
    pub fn position(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes that can still be written.
    pub fn remaining(&self) -> usize {
        self.capacity - self.bytes.len()
    }

    /// The buffer's fixed size.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// True once any write did not fit (the bytes of that write were not stored).
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Forget everything written, keeping the storage.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.overflowed = false;
    }

    /// Append raw bytes.
    #[inline]
    pub fn put_bytes(&mut self, data: &[u8]) {
        if data.len() <= self.remaining() {
            self.bytes.extend_from_slice(data);
        } else {
            self.overflowed = true;
        }
    }

    /// Append one byte (the low 8 bits of the value).
    #[inline]
    pub fn put_u8(&mut self, v: u8) {
        self.put_bytes(&[v]);
    }

    /// Append a little-endian u16.
    #[inline]
    pub fn put_u16(&mut self, v: u16) {
        self.put_bytes(&v.to_le_bytes());
    }

    /// Append a little-endian u32.
    #[inline]
    pub fn put_u32(&mut self, v: u32) {
        self.put_bytes(&v.to_le_bytes());
    }

    /// Append a little-endian u64.
    #[inline]
    pub fn put_u64(&mut self, v: u64) {
        self.put_bytes(&v.to_le_bytes());
    }

    /// Append an IEEE-754 binary64 as its little-endian bit pattern.
    pub fn put_f64(&mut self, v: f64) {
        self.put_u64(v.to_bits());
    }

    /// Append a vint (FORMAT.md §1.3): the first matching form of 1, 3, 5 or 9 bytes.
    #[inline]
    pub fn put_vint(&mut self, v: i64) {
        if (0..=252).contains(&v) {
            self.put_u8(v as u8);
        } else if (253..=0xFFFF).contains(&v) {
            self.put_u8(0xFD);
            self.put_u16(v as u16);
        } else if i32::try_from(v).is_ok() {
            self.put_u8(0xFE);
            self.put_u32(v as i32 as u32);
        } else {
            self.put_u8(0xFF);
            self.put_u64(v as u64);
        }
    }

    /// Append a string: its bytes up to the first NUL, then a NUL terminator (§1.4).
    pub fn put_string(&mut self, s: &[u8]) {
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        self.put_bytes(&s[..end]);
        self.put_u8(0);
    }

    /// Reserve `n` bytes to be patched later; returns their position.
    pub fn reserve(&mut self, n: usize) -> usize {
        let at = self.bytes.len();
        if self.remaining() >= n {
            self.bytes.resize(at + n, 0);
        } else {
            self.overflowed = true;
        }
        at
    }

    fn patch(&mut self, at: usize, data: &[u8]) {
        match self.bytes.get_mut(at..at.saturating_add(data.len())) {
            Some(dst) => dst.copy_from_slice(data),
            None => self.overflowed = true,
        }
    }

    /// Overwrite an already written u8 at `at`.
    pub fn patch_u8(&mut self, at: usize, v: u8) {
        self.patch(at, &[v]);
    }

    /// Overwrite an already written u16 at `at`.
    pub fn patch_u16(&mut self, at: usize, v: u16) {
        self.patch(at, &v.to_le_bytes());
    }

    /// Overwrite an already written u32 at `at`.
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        self.patch(at, &v.to_le_bytes());
    }

    /// Overwrite an already written u64 at `at`.
    pub fn patch_u64(&mut self, at: usize, v: u64) {
        self.patch(at, &v.to_le_bytes());
    }
}

/// A bounds-checked little-endian read cursor over a byte slice (upstream `Buf.Read`).
///
/// `base` is the absolute file offset of `data[0]`, so errors name positions in the file.
/// The `get_*` reads, the trace reader's, return such an [`Error`]; the `try_*` reads return
/// `None` instead, for the unwinder's parser of DWARF call-frame information: it runs inside
/// the allocator, reads memory rather than a file, and only needs to know that its input is
/// malformed.
#[derive(Debug, Clone)]
pub struct ReadCursor<'a> {
    data: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> ReadCursor<'a> {
    /// A cursor at the start of `data`, which begins at file offset `base`.
    pub fn new(data: &'a [u8], base: u64) -> ReadCursor<'a> {
        ReadCursor { data, pos: 0, base }
    }

    /// Absolute file offset of the next byte to read.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Bytes left to read.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// True when nothing is left.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pos == self.data.len()
    }

    /// An error at the current offset.
    #[cold]
    pub fn error(&self, kind: ErrorKind) -> Error {
        Error::at(self.offset(), kind)
    }

    /// An error `ahead` bytes past the current offset (for callers parsing [`Self::rest`]).
    pub fn error_at(&self, ahead: usize, kind: ErrorKind) -> Error {
        Error::at(self.offset() + ahead as u64, kind)
    }

    /// The bytes not yet read, for tight loops that parse in place and then [`Self::skip`].
    #[inline]
    pub fn rest(&self) -> &'a [u8] {
        &self.data[self.pos..]
    }

    /// Take the next `N` bytes.
    #[inline]
    fn try_take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let bytes = self.data.get(self.pos..self.pos + N)?;
        self.pos += N;
        let mut out = [0; N];
        out.copy_from_slice(bytes);
        Some(out)
    }

    /// [`Self::try_take`], or an error naming the bytes missing.
    #[inline]
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        self.try_take().ok_or_else(|| self.error(ErrorKind::UnexpectedEnd { needed: N - self.remaining() }))
    }

    /// Skip `n` bytes.
    #[inline]
    pub fn skip(&mut self, n: usize) -> Result<()> {
        self.try_skip(n).ok_or_else(|| self.error(ErrorKind::UnexpectedEnd { needed: n - self.remaining() }))
    }

    /// Skip `n` bytes; `None` (and nothing skipped) if fewer remain.
    #[inline]
    pub fn try_skip(&mut self, n: usize) -> Option<()> {
        (n <= self.remaining()).then(|| self.pos += n)
    }

    /// Read a u8.
    #[inline]
    pub fn get_u8(&mut self) -> Result<u8> {
        self.try_u8().ok_or_else(|| self.error(ErrorKind::UnexpectedEnd { needed: 1 }))
    }

    /// Read a u8; `None` at the end.
    #[inline]
    pub fn try_u8(&mut self) -> Option<u8> {
        let byte = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(byte)
    }

    /// Read a little-endian u16.
    #[inline]
    pub fn get_u16(&mut self) -> Result<u16> {
        self.take().map(u16::from_le_bytes)
    }

    /// Read a little-endian u16; `None` if fewer than 2 bytes remain.
    #[inline]
    pub fn try_u16(&mut self) -> Option<u16> {
        self.try_take().map(u16::from_le_bytes)
    }

    /// Read a little-endian u32.
    #[inline]
    pub fn get_u32(&mut self) -> Result<u32> {
        self.take().map(u32::from_le_bytes)
    }

    /// Read a little-endian u32; `None` if fewer than 4 bytes remain.
    #[inline]
    pub fn try_u32(&mut self) -> Option<u32> {
        self.try_take().map(u32::from_le_bytes)
    }

    /// Read a little-endian u64.
    #[inline]
    pub fn get_u64(&mut self) -> Result<u64> {
        self.take().map(u64::from_le_bytes)
    }

    /// Read a binary64 float.
    pub fn get_f64(&mut self) -> Result<f64> {
        self.get_u64().map(f64::from_bits)
    }

    /// Read a vint (FORMAT.md §1.3); the 4-byte form is sign-extended.
    #[inline]
    pub fn get_vint(&mut self) -> Result<i64> {
        Ok(match self.get_u8()? {
            0xFD => self.get_u16()? as i64,
            0xFE => self.get_u32()? as i32 as i64,
            0xFF => self.get_u64()? as i64,
            tag => tag as i64,
        })
    }

    /// Take the next `n` bytes as a slice; `None` (and nothing taken) if fewer remain.
    #[inline]
    pub fn try_bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let start = self.pos;
        self.try_skip(n)?;
        Some(&self.data[start..self.pos])
    }

    /// Read an unsigned LEB128 integer (DWARF's variable-length encoding); `None` when the
    /// bytes end first or the value needs more than 64 bits.
    // Always inlined in optimised builds (the compiler inlines the fixed-width reads by
    // itself): as an out-of-line call it made the CFI interpreter's rule computation slower
    // (see docs/BENCHMARKS.md). Not in debug builds, where every inlined copy keeps stack
    // slots of its own and the interpreter, which runs inside the allocator, grew its frame by
    // about 6 KiB.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn try_uleb128(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for (i, &byte) in self.rest().iter().enumerate().take(10) {
            let low = (byte & 0x7f) as u64;
            if i == 9 && low > 1 {
                return None; // Bits beyond the 64th.
            }
            value |= low << (7 * i);
            if byte & 0x80 == 0 {
                self.pos += i + 1;
                return Some(value);
            }
        }
        None
    }

    /// Read a signed LEB128 integer, sign-extended from its last byte's bit 6; `None` as for
    /// [`Self::try_uleb128`].
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn try_sleb128(&mut self) -> Option<i64> {
        let mut value = 0i64;
        for (i, &byte) in self.rest().iter().enumerate().take(10) {
            let shift = 7 * i;
            value |= ((byte & 0x7f) as i64) << shift;
            if byte & 0x80 == 0 {
                if shift + 7 < 64 && byte & 0x40 != 0 {
                    value |= -1 << (shift + 7);
                }
                self.pos += i + 1;
                return Some(value);
            }
        }
        None
    }

    /// Read a NUL-terminated string, returning its bytes without the terminator.
    pub fn get_string(&mut self) -> Result<&'a [u8]> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == 0) {
            Some(len) => {
                self.pos += len + 1;
                Ok(&rest[..len])
            }
            None => Err(self.error(ErrorKind::UnexpectedEnd { needed: 1 })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vint_bytes(v: i64) -> Vec<u8> {
        let mut b = WriteBuf::with_capacity(16);
        b.put_vint(v);
        b.as_bytes().to_vec()
    }

    #[test]
    fn vint_forms_match_the_spec_examples() {
        assert_eq!(vint_bytes(0), [0]);
        assert_eq!(vint_bytes(252), [252]);
        assert_eq!(vint_bytes(253), [0xFD, 253, 0]);
        assert_eq!(vint_bytes(65535), [0xFD, 0xFF, 0xFF]);
        assert_eq!(vint_bytes(65536), [0xFE, 0, 0, 1, 0]);
        assert_eq!(vint_bytes(-1), [0xFE, 0xFF, 0xFF, 0xFF, 0xFF]);
        assert_eq!(vint_bytes(0x8123_4567), [0xFF, 0x67, 0x45, 0x23, 0x81, 0, 0, 0, 0]);
    }

    #[test]
    fn vint_round_trips_boundaries() {
        for v in [0, 1, 252, 253, 65535, 65536, -1, i32::MIN as i64, i32::MAX as i64, i64::MIN, i64::MAX] {
            let bytes = vint_bytes(v);
            assert_eq!(ReadCursor::new(&bytes, 0).get_vint().unwrap(), v);
        }
    }

    #[test]
    fn strings_are_cut_at_the_first_nul() {
        let mut b = WriteBuf::with_capacity(16);
        b.put_string(b"ab\0cd");
        assert_eq!(b.as_bytes(), b"ab\0");
        let mut r = ReadCursor::new(b.as_bytes(), 0);
        assert_eq!(r.get_string().unwrap(), b"ab");
        assert!(r.is_empty());
    }

    #[test]
    fn short_reads_are_errors_with_offsets() {
        let mut r = ReadCursor::new(&[1, 2, 3], 100);
        assert_eq!(r.get_u8().unwrap(), 1);
        let e = r.get_u32().unwrap_err();
        assert_eq!(e.offset(), Some(101));
        assert!(matches!(e.kind(), ErrorKind::UnexpectedEnd { needed: 2 }));
        assert!(ReadCursor::new(b"abc", 0).get_string().is_err());
        assert!(ReadCursor::new(&[0xFD, 1], 0).get_vint().is_err());
    }

    #[test]
    fn leb128() {
        let mut r = ReadCursor::new(&[0xe5, 0x8e, 0x26, 0x7f, 0x80, 0x7f, 0x02, 0x80], 0);
        assert_eq!(r.try_uleb128(), Some(624_485));
        assert_eq!(r.try_sleb128(), Some(-1));
        assert_eq!(r.try_sleb128(), Some(-128));
        assert_eq!(r.try_sleb128(), Some(2));
        assert_eq!(r.try_uleb128(), None, "truncated");
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(ReadCursor::new(&max, 0).try_uleb128(), Some(u64::MAX));
        let wider = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(ReadCursor::new(&wider, 0).try_uleb128(), None, "more than 64 bits");
        let mut r = ReadCursor::new(&[1, 2, 3], 0);
        assert_eq!(r.try_bytes(2).unwrap(), [1, 2]);
        assert_eq!(r.try_bytes(2), None);
        assert_eq!(r.try_u16(), None);
        assert_eq!(r.try_u8(), Some(3));
    }

    #[test]
    fn overflow_is_sticky_and_stores_nothing() {
        let mut b = WriteBuf::with_capacity(3);
        b.put_u16(7);
        b.put_u16(8);
        assert!(b.overflowed());
        assert_eq!(b.as_bytes(), [7, 0]);
        let at = b.reserve(1);
        b.patch_u8(at, 9);
        assert_eq!(b.as_bytes(), [7, 0, 9]);
    }
}
