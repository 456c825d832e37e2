//! A small least-recently-used map: bounded memory for the recorder's per-object state.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

/// Keeps at most `capacity` entries, evicting the one used longest ago.
///
/// Each key is held once, shared by the map and the use order: recorders keep one of these per
/// node agent, and a simulated cluster runs thousands of them in one process.
pub(crate) struct Lru<K, V> {
    capacity: usize,
    entries: HashMap<Arc<K>, (V, u64)>,
    // Use stamp → key; the first entry is the least recently used.
    order: BTreeMap<u64, Arc<K>>,
    clock: u64,
}

impl<K: Hash + Eq, V> Lru<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Lru {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            order: BTreeMap::new(),
            clock: 0,
        }
    }

    /// The value for `key`, marking it as just used.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let shared = self.entries.get_key_value(key)?.0.clone();
        let (v, stamp) = self.entries.get_mut(key)?;
        self.order.remove(stamp);
        self.clock += 1;
        *stamp = self.clock;
        self.order.insert(self.clock, shared);
        Some(v)
    }

    /// Inserts or replaces `key`, evicting the least recently used entry when full.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        self.remove(&key);
        if self.entries.len() >= self.capacity {
            if let Some((_, oldest)) = self.order.pop_first() {
                self.entries.remove(&oldest);
            }
        }
        self.clock += 1;
        let key = Arc::new(key);
        self.order.insert(self.clock, key.clone());
        self.entries.insert(key, (value, self.clock));
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let (v, stamp) = self.entries.remove(key)?;
        self.order.remove(&stamp);
        Some(v)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut l = Lru::new(2);
        l.insert("a", 1);
        l.insert("b", 2);
        // Using "a" makes "b" the oldest.
        assert_eq!(l.get_mut(&"a"), Some(&mut 1));
        l.insert("c", 3);
        assert_eq!(l.len(), 2);
        assert!(l.get_mut(&"b").is_none());
        assert_eq!(l.get_mut(&"a"), Some(&mut 1));
        assert_eq!(l.get_mut(&"c"), Some(&mut 3));
        // Replacing does not count twice.
        l.insert("c", 4);
        assert_eq!(l.len(), 2);
        assert_eq!(l.remove(&"c"), Some(4));
        assert_eq!(l.len(), 1);
    }
}
