//! Per-cluster maps give their table back when most of their clusters are gone: a `HashMap`
//! never shrinks on its own, so one sized for a fleet would keep that memory after the fleet
//! is deleted. Pure.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

/// Below this capacity a map is left as it is.
const MIN_CAPACITY: usize = 64;

/// Shrinks `map` to its length once it uses less than a quarter of its capacity: after a shrink
/// the map is full again, so shrinks happen once per halving or so and removals stay amortized
/// O(1).
pub(crate) fn shrink_when_sparse<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    if map.capacity() > MIN_CAPACITY && map.len() < map.capacity() / 4 {
        map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_emptied_of_most_clusters_gives_its_table_back() {
        let mut map: HashMap<String, u64> = (0..10_000).map(|i| (format!("ns/c{i}"), i)).collect();
        let full = map.capacity();
        assert!(full >= 10_000);
        let mut shrinks = 0;
        for i in 0..9_990 {
            map.remove(&format!("ns/c{i}"));
            let before = map.capacity();
            shrink_when_sparse(&mut map);
            if map.capacity() < before {
                shrinks += 1;
            }
        }
        assert_eq!(map.len(), 10);
        assert!(map.capacity() <= MIN_CAPACITY, "capacity {}", map.capacity());
        // A few shrinks for the whole way down, not one per removal.
        assert!((1..=12).contains(&shrinks), "{shrinks} shrinks");
        assert_eq!(map.get("ns/c9995"), Some(&9_995));
    }

    #[test]
    fn a_map_in_use_or_small_keeps_its_capacity() {
        let mut map: HashMap<u32, u32> = (0..1_000).map(|i| (i, i)).collect();
        for i in 0..400 {
            map.remove(&i);
        }
        // (Removals leave tombstones: the capacity to compare with is the one after them.)
        let capacity = map.capacity();
        assert!(map.len() >= capacity / 4, "{} of {capacity}", map.len());
        shrink_when_sparse(&mut map);
        assert_eq!(map.capacity(), capacity, "600 of {capacity} in use");
        let mut small: HashMap<u32, u32> = HashMap::with_capacity(MIN_CAPACITY / 2);
        small.insert(1, 1);
        let capacity = small.capacity();
        shrink_when_sparse(&mut small);
        assert_eq!(small.capacity(), capacity);
    }
}
