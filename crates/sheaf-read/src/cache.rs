//! A bounded, content-addressed cache of decoded blocks and pages.
//!
//! Keys are the digests in the refs (of a page's decoded bytes, of a data
//! block's stored bytes: format.md §7), so the cache only ever holds verified
//! data and identical blocks of different images share one entry. A value
//! may be a block's first bytes only, decoded as far as reads needed.
//! Concurrent requests for one key wait for a single load ("single flight").
//! Eviction is least-recently-used by bytes.

use sheaf_format::Digest;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counters of one cache.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Requests served from memory.
    pub hits: AtomicU64,
    /// Requests that loaded (decompressed) the value.
    pub misses: AtomicU64,
    /// Requests that waited for another thread's load of the same key.
    pub waits: AtomicU64,
    /// Entries evicted.
    pub evictions: AtomicU64,
    /// Bytes the loads produced (decompressed), a re-decoded prefix again.
    pub loaded_bytes: AtomicU64,
    /// Loads that replaced a shorter value (a block's prefix decoded again,
    /// further).
    pub extensions: AtomicU64,
}

/// A cached value.
pub type Value = Arc<Vec<u8>>;

/// One key's value, and the lock a load holds: a value held stays readable
/// while another thread loads a longer one (a prefix decoded further), so a
/// reader of bytes already decoded never waits for that decode.
#[derive(Default)]
struct Slot {
    value: Mutex<Option<Value>>,
    load: Mutex<()>,
}

impl Slot {
    fn held(&self) -> Option<Value> {
        self.value.lock().expect("slot lock").clone()
    }
}

struct Entry {
    slot: Arc<Slot>,
    tick: u64,
    size: usize,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Digest, Entry>,
    lru: BTreeMap<u64, Digest>,
    tick: u64,
    size: usize,
}

/// Evicted buffers kept for the next load, as a fraction of the capacity.
const SPARE_FRACTION: usize = 16;

/// The cache.
pub struct Cache {
    inner: Mutex<Inner>,
    /// Buffers of evicted values that no reader held, reused by loads: a
    /// stream of multi-MiB blocks then recycles a few allocations instead of
    /// leaving the heap fragmented (measured: RSS 1.7× the cache without).
    spare: Mutex<Vec<Vec<u8>>>,
    capacity: usize,
    /// Counters.
    pub stats: CacheStats,
}

impl Cache {
    /// A cache holding up to `capacity` bytes of values.
    pub fn new(capacity: usize) -> Self {
        Cache {
            inner: Mutex::default(),
            spare: Mutex::default(),
            capacity,
            stats: CacheStats::default(),
        }
    }

    /// Most bytes held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes currently held.
    pub fn size(&self) -> usize {
        self.inner.lock().expect("cache lock").size
    }

    /// Whether `key` is held (or being loaded); does not touch the LRU order.
    pub fn contains(&self, key: &Digest) -> bool {
        self.inner.lock().expect("cache lock").map.contains_key(key)
    }

    /// The length of the value held for `key` (a block's prefix, perhaps),
    /// if any; does not touch the LRU order.
    pub fn held_len(&self, key: &Digest) -> Option<usize> {
        self.held(key).map(|d| d.len())
    }

    /// The value held for `key`, if any; does not touch the LRU order.
    fn held(&self, key: &Digest) -> Option<Value> {
        let inner = self.inner.lock().expect("cache lock");
        let slot = inner.map.get(key)?.slot.clone();
        drop(inner);
        slot.held()
    }

    /// The value held for `key` (a block's prefix, perhaps), if any, as a
    /// hit; does not touch the LRU order.
    pub fn peek(&self, key: &Digest) -> Option<Value> {
        let v = self.held(key)?;
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        Some(v)
    }

    /// Return the value for `key`, calling `load` at most once across threads.
    /// `load` gets an empty buffer to fill (possibly recycled, with capacity).
    /// A failed load is not cached; the next request tries again.
    pub fn get_or_load<E>(
        &self,
        key: &Digest,
        load: impl FnOnce(Vec<u8>) -> Result<Vec<u8>, E>,
    ) -> Result<Value, E> {
        self.get_or_load_min(key, 0, 0, |buf, _| load(buf))
    }

    /// [`Cache::get_or_load`] for a value of at least `min_len` bytes: a
    /// held value may be a prefix of the whole (a block decoded only as far
    /// as a read needed), and one shorter than `min_len` is loaded again and
    /// replaced. `load` also gets the length of that shorter value, if any,
    /// and a recycled buffer of about `capacity` bytes if there is one.
    pub fn get_or_load_min<E>(
        &self,
        key: &Digest,
        min_len: usize,
        capacity: usize,
        load: impl FnOnce(Vec<u8>, Option<usize>) -> Result<Vec<u8>, E>,
    ) -> Result<Value, E> {
        let slot = {
            let mut g = self.inner.lock().expect("cache lock");
            g.tick += 1;
            let tick = g.tick;
            let inner = &mut *g;
            match inner.map.get_mut(key) {
                Some(e) => {
                    // Moved to the recent end only when it has drifted a
                    // quarter of the way towards eviction: a hot page read
                    // on every lookup costs a map lookup, not two tree
                    // operations (7% of a 1M-entry lookup run). The order
                    // stays least-recently-used for all but the most
                    // recent quarter, which eviction reaches last anyway.
                    if tick - e.tick > (inner.lru.len() as u64 / 4).max(1) - 1 {
                        inner.lru.remove(&e.tick);
                        e.tick = tick;
                        inner.lru.insert(tick, *key);
                    }
                    e.slot.clone()
                }
                None => {
                    let slot = Arc::new(Slot::default());
                    inner.map.insert(
                        *key,
                        Entry {
                            slot: slot.clone(),
                            tick,
                            size: 0,
                        },
                    );
                    inner.lru.insert(tick, *key);
                    slot
                }
            }
        };
        let long_enough = |held: Option<Value>| held.filter(|d| d.len() >= min_len);
        if let Some(d) = long_enough(slot.held()) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(d);
        }
        let _loading = match slot.load.try_lock() {
            Ok(g) => g,
            Err(_) => {
                self.stats.waits.fetch_add(1, Ordering::Relaxed);
                slot.load.lock().expect("slot load lock")
            }
        };
        // Another thread's load may have made it long enough meanwhile.
        let held = slot.held();
        let prior = held.as_ref().map(|d| d.len());
        if let Some(d) = long_enough(held) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(d);
        }
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        if prior.is_some() {
            self.stats.extensions.fetch_add(1, Ordering::Relaxed);
        }
        let buf = {
            // A buffer that fits: decoders drop one far too large (it would
            // pin memory) and grow one too small, and a fresh allocation of
            // a block's size is page faults on every use.
            let mut spare = self.spare.lock().expect("spare lock");
            let fits =
                |b: &Vec<u8>| b.capacity() >= capacity && b.capacity() <= 2 * capacity + 4096;
            match spare.iter().rposition(fits) {
                Some(i) => spare.swap_remove(i),
                None if capacity == 0 => spare.pop().unwrap_or_default(),
                None => Vec::new(),
            }
        };
        match load(buf, prior) {
            Ok(data) => {
                let loaded = data.len() as u64;
                self.stats.loaded_bytes.fetch_add(loaded, Ordering::Relaxed);
                let d: Value = Arc::new(data);
                *slot.value.lock().expect("slot lock") = Some(d.clone());
                let mut g = self.inner.lock().expect("cache lock");
                let inner = &mut *g;
                if let Some(e) = inner
                    .map
                    .get_mut(key)
                    .filter(|e| Arc::ptr_eq(&e.slot, &slot))
                {
                    // Count what the value pins, not just its length (in
                    // place of the prefix it replaces, if any).
                    inner.size = inner.size - e.size + d.capacity();
                    e.size = d.capacity();
                }
                self.evict(inner, key);
                Ok(d)
            }
            Err(e) => {
                let mut g = self.inner.lock().expect("cache lock");
                let inner = &mut *g;
                // An entry that never got a value goes (this thread still
                // holds its load lock: no other load can be filling it).
                let stale = inner
                    .map
                    .get(key)
                    .is_some_and(|e| Arc::ptr_eq(&e.slot, &slot) && slot.held().is_none());
                if stale {
                    let t = inner.map.remove(key).expect("present").tick;
                    inner.lru.remove(&t);
                }
                Err(e)
            }
        }
    }

    /// Keep the buffer of an evicted value if nobody else holds it.
    fn recycle(&self, slot: &Slot) {
        let taken = slot.value.lock().expect("slot lock").take();
        if let Some(mut buf) = taken.and_then(|a| Arc::try_unwrap(a).ok()) {
            buf.clear();
            let mut spare = self.spare.lock().expect("spare lock");
            let held: usize = spare.iter().map(|b| b.capacity()).sum();
            // At least one, so a small cache of large blocks still recycles.
            if spare.is_empty() || held + buf.capacity() <= self.capacity / SPARE_FRACTION {
                spare.push(buf);
            }
        }
    }

    fn evict(&self, inner: &mut Inner, keep: &Digest) {
        while inner.size > self.capacity {
            let Some((&t, &k)) = inner.lru.iter().next() else {
                break;
            };
            if &k == keep && inner.lru.len() == 1 {
                break;
            }
            inner.lru.remove(&t);
            if let Some(e) = inner.map.remove(&k) {
                inner.size -= e.size;
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                self.recycle(&e.slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn evicts_least_recently_used_by_bytes() {
        let c = Cache::new(250);
        let k = |i: u8| [i; 32];
        for i in 0..3 {
            c.get_or_load::<()>(&k(i), |_| Ok(vec![i; 100])).unwrap();
        }
        // 0 was evicted to fit 2; touching 1 keeps it over 2 when 3 arrives.
        assert_eq!(c.size(), 200);
        c.get_or_load::<()>(&k(1), |_| panic!("cached")).unwrap();
        c.get_or_load::<()>(&k(3), |_| Ok(vec![3; 100])).unwrap();
        c.get_or_load::<()>(&k(1), |_| panic!("cached")).unwrap();
        let mut reloaded = false;
        c.get_or_load::<()>(&k(2), |_| {
            reloaded = true;
            Ok(vec![2; 100])
        })
        .unwrap();
        assert!(reloaded);
    }

    #[test]
    fn a_short_prefix_is_loaded_again_and_replaced() {
        let c = Cache::new(1 << 20);
        let k = [7; 32];
        let v = c
            .get_or_load_min::<()>(&k, 10, 100, |_, prior| {
                assert_eq!(prior, None);
                Ok(vec![1; 10])
            })
            .unwrap();
        assert_eq!(v.len(), 10);
        // Long enough: served as held, also to a whole-value request of it.
        c.get_or_load_min::<()>(&k, 5, 100, |_, _| panic!("held"))
            .unwrap();
        let v = c
            .get_or_load_min::<()>(&k, 50, 100, |_, prior| {
                assert_eq!(prior, Some(10));
                Ok(vec![1; 100])
            })
            .unwrap();
        assert_eq!(v.len(), 100);
        // The replaced prefix is no longer counted.
        assert_eq!(c.size(), v.capacity());
        assert_eq!(c.stats.misses.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn concurrent_requests_load_once() {
        let c = Arc::new(Cache::new(1 << 20));
        let loads = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (c, loads) = (c.clone(), loads.clone());
                std::thread::spawn(move || {
                    c.get_or_load::<()>(&[9; 32], |_| {
                        loads.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        Ok(vec![1; 1000])
                    })
                    .unwrap()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap().len(), 1000);
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_held_prefix_is_served_while_a_longer_load_runs() {
        let c = Arc::new(Cache::new(1 << 20));
        let k = [5; 32];
        c.get_or_load_min::<()>(&k, 10, 10, |_, _| Ok(vec![1; 10]))
            .unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (finish, finish_rx) = std::sync::mpsc::channel::<()>();
        let longer = {
            let c = c.clone();
            std::thread::spawn(move || {
                c.get_or_load_min::<()>(&k, 100, 100, |_, prior| {
                    assert_eq!(prior, Some(10));
                    started_tx.send(()).unwrap();
                    finish_rx.recv().unwrap();
                    Ok(vec![1; 100])
                })
                .unwrap()
                .len()
            })
        };
        started.recv().unwrap();
        // The longer load is parked: bytes already held must come at once,
        // not after it (a reader that waited would wait until the timeout).
        let (done_tx, done) = std::sync::mpsc::channel();
        let reader = {
            let c = c.clone();
            std::thread::spawn(move || {
                let v = c.get_or_load_min::<()>(&k, 5, 5, |_, _| panic!("held"));
                done_tx.send(v.unwrap().len()).unwrap();
            })
        };
        let got = done.recv_timeout(std::time::Duration::from_secs(10));
        finish.send(()).unwrap();
        assert_eq!(got, Ok(10), "a held prefix waited for a longer load");
        reader.join().unwrap();
        assert_eq!(c.stats.waits.load(Ordering::Relaxed), 0);
        assert_eq!(longer.join().unwrap(), 100);
        assert_eq!(c.held_len(&k), Some(100));
    }

    #[test]
    fn failed_load_is_retried() {
        let c = Cache::new(1000);
        assert!(c.get_or_load(&[1; 32], |_| Err("boom")).is_err());
        assert_eq!(
            &*c.get_or_load::<()>(&[1; 32], |_| Ok(vec![5])).unwrap(),
            &[5]
        );
    }

    #[test]
    fn evicted_buffers_are_reused_unless_still_held() {
        let c = Cache::new(100);
        let held = c.get_or_load::<()>(&[1; 32], |_| Ok(vec![1; 100])).unwrap();
        c.get_or_load::<()>(&[2; 32], |_| Ok(vec![2; 100])).unwrap();
        // 1 was evicted while `held` kept it alive: no buffer to reuse.
        c.get_or_load::<()>(&[3; 32], |b| {
            assert_eq!(b.capacity(), 0);
            Ok(vec![3; 100])
        })
        .unwrap();
        drop(held);
        // 2 was evicted with no reader: its allocation comes back.
        c.get_or_load::<()>(&[4; 32], |b| {
            assert!(b.is_empty() && b.capacity() >= 100);
            Ok(vec![4; 100])
        })
        .unwrap();
    }
}
