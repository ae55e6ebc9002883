//! Bounded output tails.
//!
//! The worker keeps the last [`TAIL_CAP`] bytes of each stream in a [`TailBuffer`]
//! and publishes them raw. The api cuts the last `tail_bytes` of that for a client
//! with [`render_tail`], which never splits a UTF-8 character.

use std::collections::VecDeque;

/// The most a client may ask for, and so the most a worker keeps per stream.
pub const TAIL_CAP: usize = 65_536;
/// What `get_task_status` returns when `tail_bytes` is not given.
pub const DEFAULT_TAIL_BYTES: usize = 4_096;

/// The last `cap` bytes written to a stream, plus the total ever written.
/// Memory stays at `cap` however much the script prints.
#[derive(Debug, Clone)]
pub struct TailBuffer {
    buf: VecDeque<u8>,
    cap: usize,
    total: u64,
}

impl TailBuffer {
    pub fn new(cap: usize) -> TailBuffer {
        TailBuffer {
            buf: VecDeque::with_capacity(cap.min(8192)),
            cap,
            total: 0,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        // Only the last `cap` bytes of a large write can survive; skip the rest.
        let keep = &bytes[bytes.len().saturating_sub(self.cap)..];
        let overflow = (self.buf.len() + keep.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.buf.extend(keep);
    }

    /// Total bytes ever pushed.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The kept bytes, oldest first.
    pub fn to_vec(&self) -> Vec<u8> {
        let (a, b) = self.buf.as_slices();
        [a, b].concat()
    }
}

/// A tail as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedTail {
    pub text: String,
    /// True when the stream holds more than `text` shows.
    pub truncated: bool,
}

/// The last at most `tail_bytes` bytes of `kept` (the stored tail of a stream that
/// wrote `total` bytes in all), starting on a UTF-8 character boundary; invalid
/// bytes become U+FFFD.
pub fn render_tail(kept: &[u8], tail_bytes: usize, total: u64) -> RenderedTail {
    let mut start = kept.len().saturating_sub(tail_bytes);
    // Skip continuation bytes (10xxxxxx) so the cut falls before a character's
    // first byte. A UTF-8 character has at most 3 of them; stop there so that
    // garbage does not eat the whole tail.
    let mut skipped = 0;
    while start < kept.len() && skipped < 3 && (kept[start] & 0b1100_0000) == 0b1000_0000 {
        start += 1;
        skipped += 1;
    }
    let shown = &kept[start..];
    RenderedTail {
        text: String::from_utf8_lossy(shown).into_owned(),
        truncated: total > shown.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_keeps_only_the_last_cap_bytes_and_counts_all() {
        let mut t = TailBuffer::new(4);
        t.push(b"ab");
        t.push(b"cdef");
        assert_eq!(t.to_vec(), b"cdef");
        t.push(b"0123456789");
        assert_eq!(t.to_vec(), b"6789");
        t.push(b"x");
        assert_eq!(t.to_vec(), b"789x");
        assert_eq!(t.total(), 17);
    }

    #[test]
    fn tail_never_starts_inside_a_character() {
        // "é" is 2 bytes, "€" 3: a cut of 4 bytes from "a€é" lands inside "€".
        let s = "a€é".as_bytes();
        let r = render_tail(s, 4, s.len() as u64);
        assert_eq!(r.text, "é");
        assert!(r.truncated);
        let all = render_tail(s, 100, s.len() as u64);
        assert_eq!(all.text, "a€é");
        assert!(!all.truncated);
    }

    #[test]
    fn invalid_bytes_are_replaced_and_totals_beyond_the_kept_bytes_mark_truncation() {
        let r = render_tail(b"ok\xff", 10, 3);
        assert_eq!(r.text, "ok\u{fffd}");
        assert!(!r.truncated);
        // The worker kept 3 bytes of a 1000-byte stream.
        assert!(render_tail(b"abc", 10, 1000).truncated);
    }

    #[test]
    fn a_run_of_continuation_bytes_does_not_swallow_the_tail() {
        let r = render_tail(&[0x80; 10], 10, 10);
        assert_eq!(r.text.chars().count(), 7);
    }
}
