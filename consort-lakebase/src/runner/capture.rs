//! Capturing a run's output: a streaming SHA-256 of everything, plus a capped excerpt (the
//! start and the end).

use std::collections::VecDeque;

use consort_actors::ContentHash;
use sha2::{Digest, Sha256};

/// Output limits of a runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    /// Bytes kept from the start of the output for the excerpt.
    pub excerpt_head: usize,
    /// Bytes kept from the end of the output for the excerpt.
    pub excerpt_tail: usize,
    /// Bytes of standard output kept for parsing (TAP).
    pub max_parsed: usize,
    /// Total output after which the command is killed (its outcome then says so).
    pub max_total: u64,
}

impl Default for OutputLimits {
    fn default() -> Self {
        OutputLimits {
            excerpt_head: 8 * 1024,
            excerpt_tail: 8 * 1024,
            max_parsed: 16 * 1024 * 1024,
            max_total: 256 * 1024 * 1024,
        }
    }
}

/// Streams output into a digest and a head/tail excerpt.
#[derive(Debug, Clone)]
pub struct Capture {
    hasher: Sha256,
    total: u64,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
}

/// A finished capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// SHA-256 of every byte.
    pub digest: ContentHash,
    /// The start and the end, with the number of bytes left out between them.
    pub excerpt: String,
    /// How many bytes there were.
    pub total: u64,
}

impl Capture {
    /// An empty capture with these limits.
    pub fn new(limits: &OutputLimits) -> Self {
        Capture {
            hasher: Sha256::new(),
            total: 0,
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap: limits.excerpt_head,
            tail_cap: limits.excerpt_tail,
        }
    }

    /// Adds bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.total += bytes.len() as u64;
        let room = self.head_cap.saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        if self.tail_cap == 0 {
            return;
        }
        let rest = if rest.len() > self.tail_cap {
            &rest[rest.len() - self.tail_cap..]
        } else {
            rest
        };
        self.tail.extend(rest.iter().copied());
        while self.tail.len() > self.tail_cap {
            self.tail.pop_front();
        }
    }

    /// Adds text.
    pub fn push_str(&mut self, s: &str) {
        self.push(s.as_bytes());
    }

    /// Bytes so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The digest and the excerpt.
    pub fn finish(self) -> Captured {
        let mut digest = [0u8; 32];
        digest.copy_from_slice(self.hasher.finalize().as_slice());
        let kept = self.head.len() as u64 + self.tail.len() as u64;
        let mut excerpt = String::from_utf8_lossy(&self.head).into_owned();
        let tail: Vec<u8> = self.tail.into_iter().collect();
        if self.total > kept {
            excerpt.push_str(&format!(
                "\n[… {} bytes of output omitted …]\n",
                self.total - kept
            ));
        }
        excerpt.push_str(&String::from_utf8_lossy(&tail));
        Captured {
            digest: digest_of(digest),
            excerpt,
            total: self.total,
        }
    }
}

fn digest_of(bytes: [u8; 32]) -> ContentHash {
    // ContentHash has no constructor from raw digest bytes; its hex form round-trips.
    hex::encode(bytes)
        .parse()
        .unwrap_or_else(|_| ContentHash::of_bytes(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole_and_large_output_is_capped() {
        let limits = OutputLimits {
            excerpt_head: 10,
            excerpt_tail: 10,
            ..OutputLimits::default()
        };
        let mut c = Capture::new(&limits);
        c.push_str("hello");
        let done = c.finish();
        assert_eq!(done.excerpt, "hello");
        assert_eq!(done.digest, ContentHash::of_bytes(b"hello"));

        let text: String = (0..1000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let mut c = Capture::new(&limits);
        for chunk in text.as_bytes().chunks(7) {
            c.push(chunk);
        }
        let done = c.finish();
        assert_eq!(done.total, 1000);
        assert_eq!(done.digest, ContentHash::of_bytes(text.as_bytes()));
        assert!(done.excerpt.starts_with(&text[..10]));
        assert!(done.excerpt.ends_with(&text[990..]));
        assert!(done.excerpt.contains("980 bytes of output omitted"));
    }
}
