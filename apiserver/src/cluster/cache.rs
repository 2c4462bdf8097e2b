//! A small time-bounded cache for TokenReview and SubjectAccessReview decisions.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Entries live for a fixed time from insertion. The map is bounded: when full, expired entries
/// are dropped first, and if it is still full it is emptied (decisions are cheap to ask again).
#[derive(Debug)]
pub struct TtlCache<K, V> {
    ttl: Duration,
    max_entries: usize,
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    /// A cache keeping entries for `ttl`, at most `max_entries` of them.
    pub fn new(ttl: Duration, max_entries: usize) -> Self {
        Self {
            ttl,
            max_entries: max_entries.max(1),
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The value for `key` if it was inserted less than the TTL ago.
    pub fn get(&self, key: &K) -> Option<V> {
        self.get_at(key, Instant::now())
    }

    /// [`Self::get`] as of `now`.
    pub fn get_at(&self, key: &K, now: Instant) -> Option<V> {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match entries.get(key) {
            Some((at, value)) if now.saturating_duration_since(*at) < self.ttl => Some(value.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers `value` for `key` from now.
    pub fn insert(&self, key: K, value: V) {
        self.insert_at(key, value, Instant::now());
    }

    /// [`Self::insert`] as of `now`.
    pub fn insert_at(&self, key: K, value: V, now: Instant) {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= self.max_entries {
            let ttl = self.ttl;
            entries.retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            if entries.len() >= self.max_entries {
                entries.clear();
            }
        }
        entries.insert(key, (now, value));
    }

    /// How many entries are held (expired ones included until touched).
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_after_the_ttl() {
        let cache = TtlCache::new(Duration::from_secs(10), 10);
        let t0 = Instant::now();
        cache.insert_at("k", true, t0);
        assert_eq!(cache.get_at(&"k", t0), Some(true));
        assert_eq!(cache.get_at(&"k", t0 + Duration::from_millis(9_999)), Some(true));
        assert_eq!(cache.get_at(&"k", t0 + Duration::from_secs(10)), None);
        // Expired entries are dropped when read.
        assert!(cache.is_empty());
    }

    #[test]
    fn a_full_cache_drops_expired_entries_then_everything() {
        let cache = TtlCache::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        cache.insert_at(1, "a", t0);
        cache.insert_at(2, "b", t0 + Duration::from_secs(5));
        // 1 has expired at t0+11: it is dropped, 2 stays.
        cache.insert_at(3, "c", t0 + Duration::from_secs(11));
        assert_eq!(cache.get_at(&1, t0 + Duration::from_secs(11)), None);
        assert_eq!(cache.get_at(&2, t0 + Duration::from_secs(11)), Some("b"));
        // Full of live entries: emptied.
        cache.insert_at(4, "d", t0 + Duration::from_secs(12));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.get_at(&4, t0 + Duration::from_secs(12)), Some("d"));
    }
}
