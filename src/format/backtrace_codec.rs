//! Compression of allocation backtraces (FORMAT.md §7; upstream `Backtrace_codec`).
//!
//! Both sides keep a 16 384-bucket cache of location codes and, per bucket, a prediction of
//! which bucket follows it. A backtrace is written as 16-bit codewords: a *miss* carries a
//! new code, a *hit* names a cached bucket and how many of the following frames the
//! predictions got right. Runs of correctly predicted frames (deep recursion, a stack
//! shared with the previous allocation) therefore cost almost nothing.
//!
//! The [`Writer`] must make exactly upstream's choices (hashes, eviction by date, 255-frame
//! runs, the 4096-byte budget, the verifier sequence) because the bytes are compared with
//! upstream's.

use crate::format::buf::{ReadCursor, WriteBuf};
use crate::format::error::{ErrorKind, Result};

const CACHE_SIZE: usize = 1 << 14;
const BUCKET_MASK: u64 = CACHE_SIZE as u64 - 1;
/// [`BUCKET_MASK`] for indexing: masking proves indexes in range, so no bounds checks.
const MASK: usize = CACHE_SIZE - 1;
/// A zeroed cache table of the reader, allocated zeroed on the heap: `Box::new([0; CACHE_SIZE])`
/// builds the array on the stack first in unoptimised builds.
fn zeroed_cache<T: Copy + Default>() -> Box<[T; CACHE_SIZE]> {
    vec![T::default(); CACHE_SIZE].into_boxed_slice().try_into().unwrap_or_else(|_| unreachable!())
}

/// The largest bytes of one codeword: a u16 tag and a u64 code.
const MAX_CODEWORD: usize = 2 + 8;
/// Bucket index written in the header when a packet carries no verifier.
const NO_VERIFIER: u16 = 0xFFFF;
const FIRST_VERIFY_INDEX: u16 = 4242;
const VERIFY_STRIDE: u16 = 5413;
/// Longest backtrace the reader accepts, so that corrupt input cannot grow it without bound.
pub const MAX_DECODED_FRAMES: usize = 1 << 20;

const TAG_HIT0: u16 = 0;
const TAG_HIT1: u16 = 1;
const TAG_HITN: u16 = 2;
const TAG_MISS: u16 = 3;

#[inline]
fn hash1(code: u64) -> usize {
    ((code.wrapping_mul(0x4983723) >> 11) & BUCKET_MASK) as usize
}

#[inline]
fn hash2(code: u64) -> usize {
    ((code.wrapping_mul(0xFDEA731) >> 21) & BUCKET_MASK) as usize
}

/// Encoder state for writing backtraces: one per writer domain.
pub struct Writer {
    buckets: Buckets,
    verify_ix: u16,
}

/// Buckets per [`Page`] of the writer's cache.
const PAGE_BUCKETS: usize = 64;

/// The writer's cache, in pages of [`PAGE_BUCKETS`] buckets allocated at their first write:
/// a bucket never written reads as empty (code, date and prediction 0, as in upstream's zeroed
/// arrays). A short program's first backtraces touch a few dozen buckets spread by the hashes
/// over the whole cache: three zeroed arrays (288 KiB) took a page fault for most buckets read
/// and another for most written, where the pages here come from the heap a dozen at a time.
struct Buckets {
    pages: Box<[Option<Box<Page>>; CACHE_SIZE / PAGE_BUCKETS]>,
}

/// [`PAGE_BUCKETS`] buckets of the writer's cache.
struct Page {
    code: [u64; PAGE_BUCKETS],
    /// Id of the allocation that last inserted or hit each bucket; the older of a code's
    /// two buckets is evicted on a miss.
    date: [u64; PAGE_BUCKETS],
    /// The bucket predicted to follow each bucket.
    next: [u16; PAGE_BUCKETS],
}

impl Buckets {
    fn new() -> Buckets {
        Buckets { pages: Box::new([const { None }; CACHE_SIZE / PAGE_BUCKETS]) }
    }

    #[inline]
    fn page(&self, bucket: usize) -> Option<&Page> {
        self.pages[(bucket & MASK) / PAGE_BUCKETS].as_deref()
    }

    #[inline]
    fn page_mut(&mut self, bucket: usize) -> &mut Page {
        self.pages[(bucket & MASK) / PAGE_BUCKETS].get_or_insert_with(|| {
            Box::new(Page { code: [0; PAGE_BUCKETS], date: [0; PAGE_BUCKETS], next: [0; PAGE_BUCKETS] })
        })
    }

    #[inline]
    fn code(&self, bucket: usize) -> u64 {
        self.page(bucket).map_or(0, |p| p.code[bucket % PAGE_BUCKETS])
    }

    #[inline]
    fn date(&self, bucket: usize) -> u64 {
        self.page(bucket).map_or(0, |p| p.date[bucket % PAGE_BUCKETS])
    }

    #[inline]
    fn next(&self, bucket: usize) -> u16 {
        self.page(bucket).map_or(0, |p| p.next[bucket % PAGE_BUCKETS])
    }

    /// Note a use of `bucket` by allocation `date`, holding `code`.
    #[inline]
    fn put(&mut self, bucket: usize, code: u64, date: u64) {
        let page = self.page_mut(bucket);
        (page.code[bucket % PAGE_BUCKETS], page.date[bucket % PAGE_BUCKETS]) = (code, date);
    }

    #[inline]
    fn set_date(&mut self, bucket: usize, date: u64) {
        self.page_mut(bucket).date[bucket % PAGE_BUCKETS] = date;
    }

    #[inline]
    fn set_next(&mut self, bucket: usize, next: u16) {
        self.page_mut(bucket).next[bucket % PAGE_BUCKETS] = next;
    }
}

impl Default for Writer {
    fn default() -> Writer {
        Writer::new()
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("backtrace_codec::Writer").field("verify_ix", &self.verify_ix).finish_non_exhaustive()
    }
}

impl Writer {
    /// Maximum number of bytes one call of [`Writer::put_backtrace`] writes.
    pub const MAX_LENGTH: usize = 4096;

    /// A new encoder with an empty cache.
    pub fn new() -> Writer {
        Writer { buckets: Buckets::new(), verify_ix: FIRST_VERIFY_INDEX }
    }

    /// Encode the frames `callstack[callstack_pos .. callstack_pos + callstack_len]`, from
    /// the highest index (outermost caller) down to `callstack_pos`, for allocation
    /// `alloc_id`, and return the number of codewords written.
    ///
    /// `callstack` is in writer orientation: index 0 is the allocation site. Encoding stops
    /// early, dropping the innermost frames, once [`Writer::MAX_LENGTH`] bytes are used.
    /// `log_new_location` is called with the callstack index of every cache miss, in the
    /// order written, so the caller can emit the location of each newly seen code.
    pub fn put_backtrace(
        &mut self,
        buf: &mut WriteBuf,
        alloc_id: u64,
        callstack: &[u64],
        callstack_pos: usize,
        callstack_len: usize,
        mut log_new_location: impl FnMut(usize),
    ) -> usize {
        let limit = buf.position() + Self::MAX_LENGTH - MAX_CODEWORD;
        let end = (callstack_pos + callstack_len).min(callstack.len());
        // Frames still to encode are callstack[callstack_pos..remaining].
        let mut remaining = end;
        let mut prev = 0usize;
        let mut count = 0usize;
        'lookup: while remaining > callstack_pos && buf.position() <= limit {
            let x = callstack[remaining - 1];
            let (h1, h2) = (hash1(x), hash2(x));
            let buckets = &mut self.buckets;
            let mut hit = if buckets.code(h1) == x {
                h1
            } else if buckets.code(h2) == x {
                h2
            } else {
                log_new_location(remaining - 1);
                let b = if buckets.date(h1) < buckets.date(h2) { h1 } else { h2 };
                buckets.put(b, x, alloc_id);
                buckets.set_next(prev, b as u16);
                buf.put_u16((b as u16) << 2 | TAG_MISS);
                buf.put_u64(x);
                count += 1;
                prev = b;
                remaining -= 1;
                continue 'lookup;
            };
            // A hit on `hit`, then a run of correctly predicted frames.
            loop {
                buckets.set_date(hit, alloc_id);
                buckets.set_next(prev, hit as u16);
                prev = hit;
                count += 1;
                remaining -= 1;
                let mut predicted = 0u8;
                loop {
                    if remaining <= callstack_pos || buf.position() + 2 > limit {
                        put_hit(buf, hit, predicted);
                        return count;
                    }
                    let q = buckets.next(prev) as usize;
                    if buckets.code(q) != callstack[remaining - 1] {
                        put_hit(buf, hit, predicted);
                        continue 'lookup;
                    }
                    if predicted == u8::MAX {
                        put_hit(buf, hit, predicted);
                        hit = q;
                        break;
                    }
                    prev = q;
                    predicted += 1;
                    remaining -= 1;
                }
            }
        }
        count
    }

    /// Write the header's verifier fields for the next bucket in the verification sequence:
    /// bucket index (u16), its prediction (u16) and its code (u64).
    pub fn put_cache_verifier(&mut self, buf: &mut WriteBuf) {
        let ix = self.verify_ix as usize;
        self.verify_ix = (self.verify_ix + VERIFY_STRIDE) & BUCKET_MASK as u16;
        buf.put_u16(ix as u16);
        buf.put_u16(self.buckets.next(ix));
        buf.put_u64(self.buckets.code(ix));
    }

    /// Write verifier fields that ask the reader to check nothing.
    pub fn put_dummy_verifier(buf: &mut WriteBuf) {
        buf.put_u16(NO_VERIFIER);
        buf.put_u16(0);
        buf.put_u64(0);
    }
}

fn put_hit(buf: &mut WriteBuf, bucket: usize, predicted: u8) {
    let word = (bucket as u16) << 2;
    match predicted {
        0 => buf.put_u16(word | TAG_HIT0),
        1 => buf.put_u16(word | TAG_HIT1),
        n => {
            buf.put_u16(word | TAG_HITN);
            buf.put_u8(n);
        }
    }
}

/// The verifier fields of a packet header: a bucket and what the writer's cache held there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheVerifier {
    /// Bucket index, or `0xFFFF` for "nothing to check".
    pub index: u16,
    /// The writer's prediction for that bucket.
    pub pred: u16,
    /// The writer's code in that bucket.
    pub code: u64,
}

/// Read the three verifier fields of a packet header.
pub fn get_cache_verifier(r: &mut ReadCursor<'_>) -> Result<CacheVerifier> {
    Ok(CacheVerifier { index: r.get_u16()?, pred: r.get_u16()?, code: r.get_u64()? })
}

/// Decoder state for reading backtraces: one per reader domain.
pub struct Reader {
    code: Box<[u64; CACHE_SIZE]>,
    pred: Box<[u16; CACHE_SIZE]>,
    /// The previous backtrace (file orientation), which the next one extends.
    last: Vec<u64>,
    /// Where codewords are decoded when their result is discarded (§7.7).
    scratch: Vec<u64>,
}

impl Default for Reader {
    fn default() -> Reader {
        Reader::new()
    }
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("backtrace_codec::Reader").field("last_len", &self.last.len()).finish_non_exhaustive()
    }
}

impl Reader {
    /// A new decoder with an empty cache.
    pub fn new() -> Reader {
        Reader { code: zeroed_cache(), pred: zeroed_cache(), last: Vec::new(), scratch: Vec::new() }
    }

    /// Decode `nencoded` codewords and return the allocation's backtrace in file
    /// orientation (outermost caller first): the first `common_pfx_len` frames of the
    /// previous backtrace followed by the decoded ones. If the previous backtrace is
    /// shorter than `common_pfx_len` (it was truncated by the writer's byte budget), the
    /// codewords still update the cache but the previous backtrace is returned unchanged.
    pub fn get_backtrace(&mut self, r: &mut ReadCursor<'_>, nencoded: usize, common_pfx_len: usize) -> Result<&[u64]> {
        if common_pfx_len <= self.last.len() {
            self.last.truncate(common_pfx_len);
            decode(&mut self.code, &mut self.pred, r, nencoded, &mut self.last)?;
        } else {
            self.scratch.clear();
            decode(&mut self.code, &mut self.pred, r, nencoded, &mut self.scratch)?;
        }
        Ok(&self.last)
    }

    /// The most recently decoded backtrace (file orientation).
    pub fn last_backtrace(&self) -> &[u64] {
        &self.last
    }

    /// Move past a backtrace's codewords without decoding them. The cache is not updated,
    /// so decoding cannot resume on this state afterwards.
    pub fn skip_backtrace(&mut self, r: &mut ReadCursor<'_>, nencoded: usize, _common_pfx_len: usize) -> Result<()> {
        skip_backtrace(r, nencoded)
    }

    /// Whether this decoder's cache agrees with the writer's at the verifier's bucket.
    /// The dummy verifier (index `0xFFFF`) always passes; any other index out of range fails.
    pub fn check_cache_verifier(&self, v: &CacheVerifier) -> bool {
        if v.index == NO_VERIFIER {
            return true;
        }
        let ix = v.index as usize;
        ix < CACHE_SIZE && self.pred[ix] == v.pred && self.code[ix] == v.code
    }
}

/// Extra bytes after a codeword's u16, by tag: hit0, hit1, hitN (u8 count), miss (u64 code).
const EXTRA_BYTES: [usize; 4] = [0, 0, 1, 8];

/// Move past `nencoded` codewords without touching any decoder state.
pub fn skip_backtrace(r: &mut ReadCursor<'_>, nencoded: usize) -> Result<()> {
    let data = r.rest();
    let mut pos = 0;
    for _ in 0..nencoded {
        if pos + 2 > data.len() {
            // `pos` may already be past the end (after a miss's 8 bytes): report the end.
            return Err(r.error_at(data.len(), ErrorKind::UnexpectedEnd { needed: pos + 2 - data.len() }));
        }
        // The tag is in the low bits of the little-endian u16, i.e. of its first byte.
        pos += 2 + EXTRA_BYTES[(data[pos] & 3) as usize];
    }
    if pos > data.len() {
        return Err(r.error_at(data.len(), ErrorKind::UnexpectedEnd { needed: pos - data.len() }));
    }
    r.skip(pos)
}

/// Decode `nencoded` codewords, appending the frames to `out` (§7.6).
///
/// This is the reader's inner loop, so it works on the raw bytes with one bounds check per
/// field, and the cache indexes are masked to 14 bits so the table accesses need none.
#[inline]
fn decode(
    code: &mut [u64; CACHE_SIZE],
    pred: &mut [u16; CACHE_SIZE],
    r: &mut ReadCursor<'_>,
    nencoded: usize,
    out: &mut Vec<u64>,
) -> Result<()> {
    let data = r.rest();
    let mut pos = 0;
    let mut prev = 0usize;
    for _ in 0..nencoded {
        let Some(word) = data.get(pos..pos + 2) else {
            return Err(r.error_at(pos, ErrorKind::UnexpectedEnd { needed: 2 }));
        };
        let word = u16::from_le_bytes([word[0], word[1]]);
        pos += 2;
        let bucket = (word >> 2) as usize & MASK;
        pred[prev] = bucket as u16;
        let predicted = match word & 3 {
            TAG_MISS => {
                let Some(bytes) = data.get(pos..pos + 8) else {
                    return Err(r.error_at(pos, ErrorKind::UnexpectedEnd { needed: 8 }));
                };
                let mut x = [0; 8];
                x.copy_from_slice(bytes);
                code[bucket] = u64::from_le_bytes(x);
                pos += 8;
                0
            }
            TAG_HIT0 => 0,
            TAG_HIT1 => 1,
            _ => {
                let Some(&n) = data.get(pos) else {
                    return Err(r.error_at(pos, ErrorKind::UnexpectedEnd { needed: 1 }));
                };
                pos += 1;
                n as usize
            }
        };
        if out.len() + 1 + predicted > MAX_DECODED_FRAMES {
            return Err(r.error_at(pos, ErrorKind::BacktraceTooLong));
        }
        out.push(code[bucket]);
        prev = bucket;
        out.extend((0..predicted).map(|_| {
            prev = pred[prev] as usize & MASK;
            code[prev]
        }));
    }
    r.skip(pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encode each stack whole (no common prefix) and decode it back.
    fn round_trip(stacks: &[Vec<u64>]) -> Vec<Vec<u64>> {
        let mut w = Writer::new();
        let mut r = Reader::new();
        stacks
            .iter()
            .enumerate()
            .map(|(id, s)| {
                let mut buf = WriteBuf::with_capacity(8192);
                let n = w.put_backtrace(&mut buf, id as u64, s, 0, s.len(), |_| {});
                let mut cur = ReadCursor::new(buf.as_bytes(), 0);
                let bt = r.get_backtrace(&mut cur, n, 0).unwrap().to_vec();
                assert!(cur.is_empty());
                let mut v = VerifierCheck::new(&mut w);
                v.check(&r);
                bt
            })
            .collect()
    }

    struct VerifierCheck {
        buf: WriteBuf,
    }

    impl VerifierCheck {
        fn new(w: &mut Writer) -> Self {
            let mut buf = WriteBuf::with_capacity(12);
            w.put_cache_verifier(&mut buf);
            VerifierCheck { buf }
        }
        fn check(&mut self, r: &Reader) {
            let v = get_cache_verifier(&mut ReadCursor::new(self.buf.as_bytes(), 0)).unwrap();
            assert!(r.check_cache_verifier(&v));
        }
    }

    fn file_order(s: &[u64]) -> Vec<u64> {
        s.iter().rev().copied().collect()
    }

    #[test]
    fn recursion_and_repeats_round_trip() {
        let deep: Vec<u64> = (0..2000).map(|i| 0x1000 + (i % 3) as u64 * 16).collect();
        let mixed: Vec<u64> = (0..300).map(|i| 0x40_0000 + i as u64 * 8).collect();
        let stacks = vec![deep.clone(), mixed.clone(), deep.clone(), vec![], vec![7; 600]];
        let out = round_trip(&stacks);
        for (s, o) in stacks.iter().zip(&out) {
            assert_eq!(o, &file_order(s));
        }
    }

    /// The runtime's pseudo-frames (spans and threads: codes with a tag in the top 16 bits and
    /// a small number below) at the outer end of stacks, shared and varied.
    #[test]
    fn pseudo_frames_round_trip() {
        let thread = |n: u64| 0xFFFD_0000_0000_0000 | n;
        let span = |n: u64| 0xFFFF_0000_0000_0000 | n;
        let code: Vec<u64> = (0..40).map(|i| 0x5555_0000_1000 + i * 0x40).collect();
        let mut stacks = Vec::new();
        for i in 0..300u64 {
            // Innermost first: code frames, then spans innermost first, then the thread.
            let mut s = code[..(i % 40) as usize].to_vec();
            s.extend((0..i % 4).rev().map(|d| span(d * 1000 + i % 7)));
            s.push(thread(i % 3));
            stacks.push(s);
        }
        stacks.push(vec![thread(0)]);
        stacks.push((0..16).rev().map(span).chain([thread(u32::MAX as u64)]).collect());
        for (s, o) in stacks.iter().zip(round_trip(&stacks)) {
            assert_eq!(o, file_order(s));
        }
    }

    #[test]
    fn budget_truncates_the_innermost_frames() {
        let misses: Vec<u64> = (0..1000).map(|i| 0x7000_0000 + i as u64 * 0x1357).collect();
        let mut buf = WriteBuf::with_capacity(8192);
        let n = Writer::new().put_backtrace(&mut buf, 0, &misses, 0, misses.len(), |_| {});
        assert!(buf.position() <= Writer::MAX_LENGTH);
        let bt = Reader::new().get_backtrace(&mut ReadCursor::new(buf.as_bytes(), 0), n, 0).unwrap().to_vec();
        assert_eq!(bt, file_order(&misses)[..bt.len()]);
        assert!(bt.len() < misses.len());
    }

    #[test]
    fn dummy_verifier_always_passes_and_bad_index_fails() {
        let r = Reader::new();
        assert!(r.check_cache_verifier(&CacheVerifier { index: 0xFFFF, pred: 9, code: 9 }));
        assert!(!r.check_cache_verifier(&CacheVerifier { index: 20000, pred: 0, code: 0 }));
        let mut w = Writer::new();
        let mut buf = WriteBuf::with_capacity(64);
        for _ in 0..3 {
            w.put_cache_verifier(&mut buf);
        }
        let ixs: Vec<u16> = buf.as_bytes().chunks(12).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(ixs, [4242, 9655, 15068]);
    }
}
