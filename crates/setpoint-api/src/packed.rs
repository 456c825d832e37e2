//! Many short strings kept in one allocation.
//!
//! Caches hold a few strings per object for every object they keep (the watch cache's
//! selector attributes, the informers' index values). As separate `String`s or `Box<str>`s
//! each costs an allocation and a pointer pair, several times its length for the short
//! values these are (a namespace, a label, a node name). [`Strings`] keeps them one after
//! another in one string, found by where each ends.
//!
//! ```
//! use setpoint_api::packed::Strings;
//!
//! let s: Strings = ["prod", "web-1", "app", "web"].into_iter().collect();
//! assert_eq!(s.len(), 4);
//! assert_eq!(s.get(1), Some("web-1"));
//! assert_eq!(s.iter().last(), Some("web"));
//! ```

/// A list of strings packed into one string (see the module docs). Immutable once built.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Strings {
    text: Box<str>,
    /// Where each string ends in `text`.
    ends: Box<[u32]>,
}

impl Strings {
    /// How many strings there are.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The `i`th string.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        self.text.get(start..end)
    }

    /// The strings, in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &str> + Clone + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

impl std::fmt::Debug for Strings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for Strings {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut b = Builder::default();
        for s in iter {
            b.push(s.as_ref());
        }
        b.finish()
    }
}

/// Builds [`Strings`] one string at a time.
#[derive(Debug, Default)]
pub struct Builder {
    text: String,
    ends: Vec<u32>,
}

impl Builder {
    /// Appends a string.
    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        // The strings are parts of one object, bounded far below 4 GiB; past that the offsets
        // saturate and `get` answers `None` rather than a wrong slice.
        self.ends
            .push(u32::try_from(self.text.len()).unwrap_or(u32::MAX));
    }

    /// The strings pushed, in allocations of their exact size. Copied rather than shrunk in
    /// place: an allocator may keep a shrunk block whole (mimalloc does while at least half is
    /// used), and these live as long as the object they describe.
    pub fn finish(self) -> Strings {
        Strings {
            text: Box::from(self.text.as_str()),
            ends: Box::from(self.ends.as_slice()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_read_back_as_given() {
        let cases: [&[&str]; 4] = [&[], &[""], &["", "a", "", "bcd", ""], &["ns", "été", "x"]];
        for case in cases {
            let s: Strings = case.iter().collect();
            assert_eq!(s.len(), case.len());
            assert_eq!(s.is_empty(), case.is_empty());
            assert_eq!(s.iter().collect::<Vec<_>>(), case);
            assert_eq!(s.get(case.len()), None);
            assert_eq!(format!("{s:?}"), format!("{case:?}"));
        }
        assert_eq!(Strings::default().get(0), None);
    }
}
