//! Persistent worker threads with a cheap barrier.
//!
//! A decode step makes ~200 parallel regions per token, so a region must cost a few
//! microseconds: workers spin on an epoch counter for a while after each job (the next
//! region usually starts within microseconds) and only then park. The caller is thread 0
//! and runs its share itself; `run` returns when every thread has finished.
//!
//! Protocol: the caller stores the job, then publishes the region in `claim` (epoch in the
//! high bits, the next unclaimed `ith` in the low 16) and unparks only the workers whose
//! `sleeping` flag is set; a worker sets `sleeping` (SeqCst) and re-reads `claim` before
//! parking, so one of the two always sees the other (no lost wake-up).
//!
//! The `ith` slots are claimed, not assigned: every thread, the caller included, takes the
//! next unclaimed slot with a CAS on `claim` until none is left. On a busy machine where a
//! worker is not running, the caller simply runs that worker's share itself instead of
//! waiting (possibly milliseconds) for the OS to schedule it. A worker that wakes late finds
//! nothing to claim and never touches the job. f(ith, nth) is the same call whichever
//! thread makes it, so results do not depend on scheduling.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Spin iterations (each a `pause`, ~10-40 ns) before a waiting worker parks: ~0.1-0.5 ms.
const SPIN_LIMIT: u32 = 1 << 13;

type Job = dyn Fn(usize, usize) + Sync;

/// A value alone on a 128-byte pair of cache lines (Intel's adjacent-line prefetch moves
/// lines in pairs).
#[repr(align(128))]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    n_threads: usize,
    /// (epoch << 16) | next unclaimed ith of the current region.
    claim: AtomicU64,
    /// Slots finished by workers in the current region, on lines of its own: the caller
    /// spins on it while the workers claim slots in `claim`.
    done: Line<AtomicUsize>,
    shutdown: AtomicBool,
    panicked: AtomicBool,
    /// The current job, lifetime-erased; only valid while `run` is on the stack.
    job: std::cell::UnsafeCell<Option<*const Job>>,
    sleeping: Vec<AtomicBool>,
}

// SAFETY: `job` is written only by the caller of `run` (serialized by `ThreadPool::lock`)
// before the claim word that publishes the region, and read by a worker only after its CAS
// on that word succeeded.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    lock: Mutex<()>,
    /// Parallel regions run so far (`run` calls; benchmarks/bandwidth.py divides the pool's
    /// per-region cost by a token's time with it).
    regions: AtomicU64,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all (the caller counts as one; 0 is taken as 1).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads: n,
            claim: AtomicU64::new(0),
            done: Line(AtomicUsize::new(0)),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            job: std::cell::UnsafeCell::new(None),
            sleeping: (0..n).map(|_| AtomicBool::new(false)).collect(),
        });
        let workers = (1..n)
            .map(|ith| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("pyllama-worker-{ith}"))
                    .spawn(move || worker_loop(&s, ith))
                    .expect("failed to spawn a pyllama worker thread")
            })
            .collect();
        ThreadPool { shared, workers, lock: Mutex::new(()), regions: AtomicU64::new(0) }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// How many parallel regions (`run` calls) this pool has run.
    pub fn regions(&self) -> u64 {
        self.regions.load(Ordering::Relaxed)
    }

    /// Run `f(ith, nth)` on every thread (the caller is ith = 0) and wait for all of them.
    /// A panic in any thread is re-raised here after all threads have finished.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        self.regions.fetch_add(1, Ordering::Relaxed);
        let n = self.shared.n_threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: erase the lifetime; we return only when no worker can still use `f`.
        let ptr: *const Job = unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), &'static Job>(f) };
        unsafe { *s.job.get() = Some(ptr) };
        s.done.store(0, Ordering::Relaxed);
        s.panicked.store(false, Ordering::Relaxed);
        let epoch = (s.claim.load(Ordering::Relaxed) >> 16) + 1;
        // The caller holds slot 0 from the start: the next claimable slot is 1.
        s.claim.store((epoch << 16) | 1, Ordering::SeqCst);
        for (i, w) in self.workers.iter().enumerate() {
            if s.sleeping[i + 1].load(Ordering::SeqCst) {
                w.thread().unpark();
            }
        }
        let mut mine = 1usize; // slots run by this thread
        let mut result = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        while let Some(ith) = try_claim(s, epoch, n) {
            mine += 1;
            let r = catch_unwind(AssertUnwindSafe(|| f(ith, n)));
            if result.is_ok() {
                result = r;
            }
        }
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) != n - mine {
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        unsafe { *s.job.get() = None };
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
        if s.panicked.load(Ordering::Relaxed) {
            panic!("a pyllama worker thread panicked");
        }
    }
}

/// Claim the next slot of region `epoch`, if that region is still current and has one left.
#[inline]
fn try_claim(s: &Shared, epoch: u64, n: usize) -> Option<usize> {
    let mut cur = s.claim.load(Ordering::Acquire);
    loop {
        if cur >> 16 != epoch || (cur & 0xffff) as usize >= n {
            return None;
        }
        match s.claim.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some((cur & 0xffff) as usize),
            Err(v) => cur = v,
        }
    }
}

fn worker_loop(s: &Shared, ith0: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let epoch = loop {
            let e = s.claim.load(Ordering::Acquire) >> 16;
            if e != seen {
                break e;
            }
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
                spins += 1;
            } else {
                s.sleeping[ith0].store(true, Ordering::SeqCst);
                if s.claim.load(Ordering::SeqCst) >> 16 == seen && !s.shutdown.load(Ordering::SeqCst) {
                    std::thread::park();
                }
                s.sleeping[ith0].store(false, Ordering::SeqCst);
            }
        };
        seen = epoch;
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        while let Some(ith) = try_claim(s, epoch, s.n_threads) {
            // SAFETY: the job was published before the region's claim word, which our
            // successful CAS read; `run` waits for our `done` before the job goes away.
            let job = unsafe { (*s.job.get()).expect("job published") };
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(ith, s.n_threads))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
            s.done.fetch_add(1, Ordering::Release);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for w in &self.workers {
            w.thread().unpark();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer that may cross threads: for disjoint writes into one output buffer from
/// several threads of one `run` (each thread owns a distinct range).
#[derive(Clone, Copy)]
pub struct SyncPtr<T>(pub *mut T);
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}
impl<T> SyncPtr<T> {
    /// The pointer (a method, so closures capture the whole Sync wrapper, not the field).
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// The half-open range of `0..n` that thread `ith` of `nth` owns (even split, the first
/// `n % nth` threads one item more).
pub fn split_range(n: usize, ith: usize, nth: usize) -> std::ops::Range<usize> {
    let base = n / nth;
    let rem = n % nth;
    let start = ith * base + ith.min(rem);
    let len = base + usize::from(ith < rem);
    start..start + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_thread_runs_once_per_region() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..2000 {
                pool.run(&|ith, nth| {
                    assert_eq!(nth, n);
                    hits[ith].fetch_add(1, Ordering::Relaxed);
                });
            }
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 2000);
            }
        }
    }

    #[test]
    fn results_are_visible_after_run_and_pool_survives_parking() {
        let pool = ThreadPool::new(3);
        let sum = AtomicU64::new(0);
        for round in 0..50u64 {
            if round % 10 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(5)); // let workers park
            }
            pool.run(&|ith, _| {
                sum.fetch_add(ith as u64 + 1, Ordering::Relaxed);
            });
        }
        assert_eq!(sum.load(Ordering::Relaxed), 50 * 6);
    }

    #[test]
    fn a_panicking_job_is_reraised_and_the_pool_still_works() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(&|ith, _| assert!(ith != 1, "boom"))));
        assert!(r.is_err());
        let c = AtomicUsize::new(0);
        pool.run(&|_, _| {
            c.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn split_range_covers_everything_once() {
        for n in 0..40 {
            for nth in 1..7 {
                let mut next = 0;
                for ith in 0..nth {
                    let r = split_range(n, ith, nth);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
