//! The bearer-token answer cache, as kube-apiserver puts in front of its token authenticators:
//! a token the chain accepted is taken for the same user, without asking the chain again,
//! for [`SUCCESS_TTL`] (10 s, upstream's `TokenSuccessCacheTTL`), never past the token's own
//! expiry. Refusals are not cached (upstream's `TokenFailureCacheTTL` is 0 in kube-apiserver),
//! so a token that starts working is accepted at once, while one that stops working (its
//! bound object deleted, its Secret removed) may still be accepted for up to 10 s.
//!
//! Why: verifying a service-account token is an ES256 signature check (tens of microseconds)
//! plus watch-cache lookups of the objects it is bound to, on every request a pod makes.
//!
//! Entries are keyed by an HMAC-SHA256 of the token under a key drawn at start, so the cache
//! never holds a token: a memory dump shows digests that cannot be replayed and cannot be
//! matched against guesses without the key. The cache holds at most a fixed number of entries
//! (a client sending many distinct valid tokens cannot grow it); when full, expired entries
//! go first, then the oldest.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ring::hmac;

use super::UserInfo;

/// How long an accepted token is taken as valid without asking the authenticators again.
pub const SUCCESS_TTL: Duration = Duration::from_secs(10);

/// How many tokens the cache holds at most.
pub const MAX_ENTRIES: usize = 4096;

/// A token's digest under the cache's key.
type Digest = [u8; 32];

/// Accepted tokens' users, by keyed digest of the token, each until it expires.
pub struct TokenCache {
    key: hmac::Key,
    ttl: Duration,
    capacity: usize,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache")
            .field("ttl", &self.ttl)
            .field("capacity", &self.capacity)
            .field("entries", &self.inner.lock().entries.len())
            .finish()
    }
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Digest, Entry>,
    /// Digests in insertion order, each with the sequence number of the insert that queued
    /// it: an element whose entry has since been replaced or removed is skipped.
    order: VecDeque<(Digest, u64)>,
    next: u64,
}

struct Entry {
    user: Arc<UserInfo>,
    expires: Instant,
    seq: u64,
}

impl Default for TokenCache {
    fn default() -> Self {
        TokenCache::new(SUCCESS_TTL, MAX_ENTRIES)
    }
}

impl TokenCache {
    /// A cache keeping accepted tokens for `ttl`, at most `capacity` of them, with a fresh
    /// random key.
    pub fn new(ttl: Duration, capacity: usize) -> TokenCache {
        let secret: [u8; 32] = rand::random();
        TokenCache {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
            ttl,
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn digest(&self, token: &str) -> Digest {
        let tag = hmac::sign(&self.key, token.as_bytes());
        let mut d = [0u8; 32];
        d.copy_from_slice(tag.as_ref());
        d
    }

    /// The user `token` was accepted as, if that answer is still fresh at `now`.
    pub fn get(&self, token: &str, now: Instant) -> Option<Arc<UserInfo>> {
        let digest = self.digest(token);
        let mut inner = self.inner.lock();
        match inner.entries.get(&digest) {
            Some(e) if now < e.expires => Some(e.user.clone()),
            Some(_) => {
                inner.entries.remove(&digest);
                None
            }
            None => None,
        }
    }

    /// Records that `token` was accepted as `user` at `now`; `valid_for` is how long the
    /// token itself remains valid, when it says (its expiry less `now`): the entry lasts the
    /// shorter of that and the cache's TTL, and nothing is kept for a token about to expire.
    pub fn insert(
        &self,
        token: &str,
        user: Arc<UserInfo>,
        valid_for: Option<Duration>,
        now: Instant,
    ) {
        let ttl = valid_for.map_or(self.ttl, |v| v.min(self.ttl));
        if ttl.is_zero() {
            return;
        }
        let digest = self.digest(token);
        let mut inner = self.inner.lock();
        // A token answered again replaces its entry rather than pushing another one out.
        inner.entries.remove(&digest);
        inner.make_room(self.capacity, now);
        let seq = inner.next;
        inner.next += 1;
        inner.entries.insert(
            digest,
            Entry {
                user,
                expires: now + ttl,
                seq,
            },
        );
        inner.order.push_back((digest, seq));
    }

    /// How many entries the cache holds (expired ones included until they are dropped).
    pub fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    /// Whether the cache holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// Makes room for one entry: drops expired and superseded entries from the old end; when
    /// the cache is still full, every expired entry; and then, while it is full, the oldest.
    fn make_room(&mut self, capacity: usize, now: Instant) {
        while let Some(&(digest, seq)) = self.order.front() {
            match self.entries.get(&digest) {
                Some(e) if e.seq == seq && e.expires > now => break,
                Some(e) if e.seq == seq => {
                    self.entries.remove(&digest);
                }
                _ => {}
            }
            self.order.pop_front();
        }
        if self.entries.len() >= capacity {
            self.entries.retain(|_, e| e.expires > now);
        }
        while self.entries.len() >= capacity {
            let Some((digest, seq)) = self.order.pop_front() else {
                break;
            };
            if self.entries.get(&digest).is_some_and(|e| e.seq == seq) {
                self.entries.remove(&digest);
            }
        }
        // Elements of replaced entries behind a live front would pile up with a few tokens
        // re-inserted forever; rebuild the order from the entries when it grows that way.
        if self.order.len() > 2 * capacity {
            let mut live: Vec<(Digest, u64)> =
                self.entries.iter().map(|(d, e)| (*d, e.seq)).collect();
            live.sort_by_key(|&(_, seq)| seq);
            self.order = live.into();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> Arc<UserInfo> {
        Arc::new(UserInfo::authenticated(name, vec![]))
    }

    #[test]
    fn an_accepted_token_is_answered_until_the_ttl_ends() {
        let cache = TokenCache::new(SUCCESS_TTL, 16);
        let t0 = Instant::now();
        assert_eq!(cache.get("tok", t0), None);
        cache.insert("tok", user("alice"), None, t0);
        assert_eq!(cache.get("tok", t0).unwrap().username, "alice");
        let almost = t0 + SUCCESS_TTL - Duration::from_millis(1);
        assert_eq!(cache.get("tok", almost).unwrap().username, "alice");
        assert_eq!(cache.get("tok", t0 + SUCCESS_TTL), None);
        // The expired entry is gone, not just hidden.
        assert!(cache.is_empty());
    }

    #[test]
    fn another_token_misses() {
        let cache = TokenCache::new(SUCCESS_TTL, 16);
        let t0 = Instant::now();
        cache.insert("tok", user("alice"), None, t0);
        assert_eq!(cache.get("tok2", t0), None);
        assert_eq!(cache.get("to", t0), None);
        assert_eq!(cache.get("", t0), None);
    }

    #[test]
    fn an_entry_never_outlives_its_token() {
        let cache = TokenCache::new(SUCCESS_TTL, 16);
        let t0 = Instant::now();
        cache.insert("short", user("a"), Some(Duration::from_secs(3)), t0);
        assert!(cache.get("short", t0 + Duration::from_secs(2)).is_some());
        assert!(cache.get("short", t0 + Duration::from_secs(3)).is_none());
        // A token valid longer than the TTL is cached for the TTL only.
        cache.insert("long", user("b"), Some(Duration::from_secs(3600)), t0);
        assert!(cache.get("long", t0 + SUCCESS_TTL).is_none());
        // A token at (or past) its expiry is not cached at all.
        cache.insert("done", user("c"), Some(Duration::ZERO), t0);
        assert!(cache.get("done", t0).is_none());
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_the_oldest_first() {
        let cache = TokenCache::new(SUCCESS_TTL, 4);
        let t0 = Instant::now();
        for i in 0..10u64 {
            let at = t0 + Duration::from_millis(i);
            cache.insert(&format!("t{i}"), user(&format!("u{i}")), None, at);
            assert!(cache.len() <= 4);
        }
        let now = t0 + Duration::from_millis(10);
        for i in 0..6 {
            assert!(cache.get(&format!("t{i}"), now).is_none(), "t{i}");
        }
        for i in 6..10 {
            assert_eq!(
                cache.get(&format!("t{i}"), now).unwrap().username,
                format!("u{i}")
            );
        }
    }

    #[test]
    fn expired_entries_make_room_before_live_ones() {
        let cache = TokenCache::new(SUCCESS_TTL, 3);
        let t0 = Instant::now();
        cache.insert("soon", user("a"), Some(Duration::from_secs(1)), t0);
        cache.insert("b", user("b"), None, t0 + Duration::from_millis(1));
        cache.insert("c", user("c"), None, t0 + Duration::from_millis(2));
        // Full; "soon" expired by now, so it is the one that goes (it is also the oldest;
        // "b" is the oldest live one and stays).
        let later = t0 + Duration::from_secs(2);
        cache.insert("d", user("d"), None, later);
        assert_eq!(cache.len(), 3);
        for t in ["b", "c", "d"] {
            assert!(cache.get(t, later).is_some(), "{t}");
        }
    }

    #[test]
    fn an_expired_entry_anywhere_goes_before_a_live_one() {
        let cache = TokenCache::new(SUCCESS_TTL, 3);
        let t0 = Instant::now();
        cache.insert("a", user("a"), None, t0);
        cache.insert("short", user("s"), Some(Duration::from_secs(1)), t0);
        cache.insert("c", user("c"), None, t0);
        let later = t0 + Duration::from_secs(2);
        cache.insert("d", user("d"), None, later);
        for t in ["a", "c", "d"] {
            assert!(cache.get(t, later).is_some(), "{t}");
        }
    }

    #[test]
    fn re_inserting_a_token_keeps_the_order_bounded() {
        let cache = TokenCache::new(SUCCESS_TTL, 2);
        let t0 = Instant::now();
        cache.insert("keep", user("k"), Some(Duration::from_secs(1000)), t0);
        for i in 0..100u64 {
            // The same token accepted again and again (concurrent misses do this).
            cache.insert("again", user("a"), None, t0 + Duration::from_millis(i));
        }
        let inner = cache.inner.lock();
        assert!(inner.order.len() <= 4 + 1, "{}", inner.order.len());
        assert_eq!(inner.entries.len(), 2);
        drop(inner);
        assert!(cache.get("keep", t0 + Duration::from_secs(1)).is_some());
    }

    #[test]
    fn the_cache_holds_digests_not_tokens() {
        let cache = TokenCache::new(SUCCESS_TTL, 4);
        let token = "secret-token-value";
        cache.insert(token, user("a"), None, Instant::now());
        let inner = cache.inner.lock();
        let digest = *inner.entries.keys().next().unwrap();
        assert!(!digest.windows(token.len()).any(|w| w == token.as_bytes()));
        // Another cache (another key) digests the same token differently.
        let other = TokenCache::new(SUCCESS_TTL, 4);
        assert_ne!(other.digest(token), digest);
    }
}
