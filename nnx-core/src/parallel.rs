//! Keeping the thread pool's workers awake through a decoded token.
//!
//! A decoded token runs a hundred or more short parallel products, each a few tens of
//! microseconds, with serial work between them (norms, rotary, attention of one row). rayon's
//! idle workers go to sleep after a few dozen yields, so each product began by waking them
//! (a futex call and a context switch on both sides): about a tenth of a small model's decode
//! time. [`Awake`] keeps the other workers of the current pool looking for work in a loop while
//! it lives, so that they steal a product's halves at once; they return to the pool as soon as
//! it is dropped, or after [`IDLE_LIMIT`] without finding work, whichever comes first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long an awake worker looks for work that does not come before it goes back to the
/// pool: a bound on the processor time an [`Awake`] that lives on without products can spend.
pub const IDLE_LIMIT: Duration = Duration::from_millis(2);

/// Spin-loop hints between two looks for work (a fraction of a microsecond).
const PAUSE: usize = 32;

/// While it lives, the current rayon pool's other workers look for work instead of sleeping
/// (see the [module documentation](self)). Outside a pool, or in a pool of one thread, it does
/// nothing.
#[must_use = "the workers stay awake only while the guard lives"]
pub struct Awake {
    stop: Option<Arc<AtomicBool>>,
}

impl Awake {
    /// Wakes the current pool's other workers and keeps them looking for work.
    pub fn new() -> Awake {
        let (Some(caller), threads) = (rayon::current_thread_index(), rayon::current_num_threads()) else {
            return Awake { stop: None };
        };
        if threads < 2 {
            return Awake { stop: None };
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        rayon::spawn_broadcast(move |context| {
            // The caller finds its own copy only while it waits for work, where looking on
            // would delay it.
            if context.index() != caller {
                look_for_work(&flag);
            }
        });
        Awake { stop: Some(stop) }
    }
}

impl Default for Awake {
    fn default() -> Awake {
        Awake::new()
    }
}

impl Drop for Awake {
    fn drop(&mut self) {
        if let Some(stop) = &self.stop {
            stop.store(true, Ordering::Release);
        }
    }
}

/// Runs the pool's pending jobs as they come until `stop` is set or none has come for
/// [`IDLE_LIMIT`].
fn look_for_work(stop: &AtomicBool) {
    let mut idle_since = Instant::now();
    while !stop.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle_since = Instant::now(),
            // A pause between looks, so that looking does not contend with the thread that
            // pushes the work for its queue's cache lines.
            Some(rayon::Yield::Idle) if idle_since.elapsed() < IDLE_LIMIT => {
                (0..PAUSE).for_each(|_| std::hint::spin_loop())
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn awake_workers_run_the_pools_jobs_and_leave_when_dropped() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        pool.install(|| {
            let awake = Awake::new();
            let sum: u64 = (0..100_000u64).into_par_iter().map(|value| value * 2).sum();
            assert_eq!(sum, 99_999 * 100_000);
            drop(awake);
        });
        // The other worker left the loop: a job broadcast to both threads completes.
        let seen = pool.broadcast(|context| context.index());
        assert_eq!(seen, vec![0, 1]);
        // Outside a pool, nothing to keep awake.
        assert!(Awake::new().stop.is_none());
    }
}
