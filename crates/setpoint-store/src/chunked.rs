//! A queue kept in fixed-size chunks, for the store's event log.
//!
//! The log grows by one entry per write and is cut from the front only at compaction, every few
//! minutes, so it reaches a million entries under load. A `VecDeque` grows by doubling: each
//! doubling allocates twice the log's size and copies it, so for a moment both copies are
//! resident, and the old one's pages may stay with the allocator. At 150,000 pods that was a
//! jump of a few hundred MiB in the server's peak RSS at whichever write crossed a power of
//! two. Chunks grow the log a fixed step at a time and never move what it holds.

use std::collections::VecDeque;

/// Entries per chunk.
const CHUNK: usize = 4096;

/// A queue with indexed access, stored in chunks of [`CHUNK`] entries. Every chunk is full
/// except the first (front entries removed) and the last (being filled).
#[derive(Debug)]
pub(crate) struct ChunkedDeque<T> {
    chunks: VecDeque<Vec<T>>,
    len: usize,
}

impl<T> Default for ChunkedDeque<T> {
    fn default() -> Self {
        ChunkedDeque {
            chunks: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> ChunkedDeque<T> {
    /// Appends an entry.
    pub(crate) fn push_back(&mut self, value: T) {
        match self.chunks.back_mut() {
            Some(last) if last.len() < CHUNK => last.push(value),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(value);
                self.chunks.push_back(chunk);
            }
        }
        self.len += 1;
    }

    /// Where entry `index` is: (chunk, position in it).
    fn locate(&self, index: usize) -> Option<(usize, usize)> {
        if index >= self.len {
            return None;
        }
        let first = self.chunks.front()?.len();
        if index < first {
            Some((0, index))
        } else {
            let rest = index - first;
            Some((1 + rest / CHUNK, rest % CHUNK))
        }
    }

    /// The entry at `index` (0 is the front).
    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        let (c, i) = self.locate(index)?;
        Some(&self.chunks[c][i])
    }

    /// The entry at `index`, mutably.
    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        let (c, i) = self.locate(index)?;
        Some(&mut self.chunks[c][i])
    }

    /// All entries, front to back.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// Entries `from..to`, front to back. Starts at `from`'s chunk rather than walking there.
    pub(crate) fn range(&self, from: usize, to: usize) -> impl Iterator<Item = &T> {
        let (chunk, skip) = self.locate(from).unwrap_or((self.chunks.len(), 0));
        self.chunks
            .range(chunk..)
            .flatten()
            .skip(skip)
            .take(to.min(self.len).saturating_sub(from))
    }

    /// Removes the first `n` entries (all of them if there are fewer).
    pub(crate) fn drop_front(&mut self, n: usize) {
        let mut left = n.min(self.len);
        self.len -= left;
        while left > 0 {
            let Some(first) = self.chunks.front_mut() else {
                break;
            };
            if first.len() <= left {
                left -= first.len();
                self.chunks.pop_front();
            } else {
                first.drain(..left);
                left = 0;
            }
        }
    }
}

impl<T> Extend<T> for ChunkedDeque<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        for value in iter {
            self.push_back(value);
        }
    }
}

impl<T> std::ops::Index<usize> for ChunkedDeque<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        self.get(index).expect("index within the deque")
    }
}

impl<T> std::ops::IndexMut<usize> for ChunkedDeque<T> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        self.get_mut(index).expect("index within the deque")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Push(usize),
        DropFront(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1usize..3 * CHUNK).prop_map(Op::Push),
            (0usize..3 * CHUNK).prop_map(Op::DropFront),
        ]
    }

    proptest! {
        /// Pushing runs of entries and cutting the front behaves as a `VecDeque` does.
        #[test]
        fn behaves_as_a_vecdeque(ops in proptest::collection::vec(op(), 1..12)) {
            let mut chunked = ChunkedDeque::default();
            let mut model = VecDeque::new();
            let mut next = 0u64;
            for op in ops {
                match op {
                    Op::Push(n) => {
                        chunked.extend(next..next + n as u64);
                        model.extend(next..next + n as u64);
                        next += n as u64;
                    }
                    Op::DropFront(n) => {
                        chunked.drop_front(n);
                        model.drain(..n.min(model.len()));
                    }
                }
                prop_assert_eq!(chunked.len, model.len());
                prop_assert!(chunked.iter().eq(model.iter()));
                for i in [0, 1, CHUNK - 1, CHUNK, model.len() / 2, model.len().saturating_sub(1), model.len()] {
                    prop_assert_eq!(chunked.get(i), model.get(i));
                }
                let (a, b) = (model.len() / 3, model.len() / 2);
                prop_assert!(chunked.range(a, b).eq(model.range(a..b)));
                // Every chunk but the first and the last is full.
                let n = chunked.chunks.len();
                for (i, c) in chunked.chunks.iter().enumerate() {
                    prop_assert!(!c.is_empty());
                    if i > 0 && i + 1 < n {
                        prop_assert_eq!(c.len(), CHUNK);
                    }
                }
            }
        }
    }

    #[test]
    fn entries_change_in_place() {
        let mut d = ChunkedDeque::default();
        d.extend(0..CHUNK as u64 * 2 + 5);
        d.drop_front(7);
        d[CHUNK] += 1000;
        assert_eq!(d[CHUNK], CHUNK as u64 + 7 + 1000);
        assert_eq!(d.get(d.len), None);
    }
}
