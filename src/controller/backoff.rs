//! Per-object retry delays after failed reconciles: exponential, jittered, and never shorter than
//! what briq asked for in `Retry-After`.

use std::{collections::HashMap, sync::Mutex, time::Duration};

/// The delay before retry number `failures` (1 for the first failure): `base` doubled per
/// earlier failure, capped at `max`, scaled by `jitter` (0.8 to 1.2, so that many failing
/// objects do not retry in lockstep), and at least `retry_after`.
pub fn delay(
    failures: u32,
    base: Duration,
    max: Duration,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    let backoff = base.saturating_mul(factor).min(max).mul_f64(jitter);
    backoff.max(retry_after.unwrap_or_default())
}

/// Consecutive failures per object of one controller; an entry lives from a failure to the
/// object's next success or its deletion.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max,
            failures: Mutex::default(),
        }
    }

    /// Counts a failure of `key` and returns how long to wait before retrying it.
    pub fn failed(&self, key: &str, retry_after: Option<Duration>) -> Duration {
        let mut failures = self.failures.lock().expect("failure counts poisoned");
        let count = failures.entry(key.to_owned()).or_default();
        *count = count.saturating_add(1);
        let jitter = 0.8 + rand::random::<f64>() * 0.4;
        delay(*count, self.base, self.max, retry_after, jitter)
    }

    /// `key` succeeded, or is gone: its count starts over.
    pub fn forget(&self, key: &str) {
        self.failures
            .lock()
            .expect("failure counts poisoned")
            .remove(key);
    }

    /// Whether `key` has a failure counted.
    #[cfg(test)]
    pub fn holds(&self, key: &str) -> bool {
        self.failures
            .lock()
            .expect("failure counts poisoned")
            .contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.failures.lock().expect("failure counts poisoned").len()
    }

    /// Keeps only the keys `live` says still exist: a reconcile that fails after its object's
    /// deletion was handled would otherwise leave a count behind.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.failures
            .lock()
            .expect("failure counts poisoned")
            .retain(|key, _| live(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn delay_table() {
        let (base, max) = (500 * MS, 300_000 * MS);
        // (failures, retry_after, jitter, expected)
        let cases = [
            (1, None, 1.0, 500 * MS),
            (2, None, 1.0, 1_000 * MS),
            (3, None, 1.0, 2_000 * MS),
            (1, None, 0.8, 400 * MS),
            (1, None, 1.2, 600 * MS),
            (10, None, 1.0, 256_000 * MS),
            (11, None, 1.0, 300_000 * MS),
            (u32::MAX, None, 1.0, 300_000 * MS),
            // briq's Retry-After is a floor, never a ceiling.
            (1, Some(5_000 * MS), 1.0, 5_000 * MS),
            (3, Some(1_000 * MS), 1.0, 2_000 * MS),
            (1, Some(Duration::ZERO), 1.0, 500 * MS),
            // Past the cap too: briq knows when it will take the call again.
            (20, Some(600_000 * MS), 1.2, 600_000 * MS),
        ];
        for (failures, retry_after, jitter, expected) in cases {
            assert_eq!(
                delay(failures, base, max, retry_after, jitter),
                expected,
                "failures {failures}, retry_after {retry_after:?}, jitter {jitter}"
            );
        }
    }

    #[test]
    fn counts_start_over_after_a_success_and_go_with_their_object() {
        let backoff = Backoff::new(100 * MS, 10_000 * MS);
        let first = backoff.failed("a", None);
        let second = backoff.failed("a", None);
        assert!(
            first <= 120 * MS && second >= 160 * MS,
            "{first:?} {second:?}"
        );
        backoff.failed("b", None);
        assert_eq!(backoff.len(), 2);
        backoff.forget("a");
        assert!(backoff.failed("a", None) <= 120 * MS);
        backoff.failed("gone", None);
        backoff.retain(|key| key != "gone");
        assert_eq!(backoff.len(), 2);
        backoff.forget("a");
        backoff.forget("b");
        assert_eq!(backoff.len(), 0);
    }
}
