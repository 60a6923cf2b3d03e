//! Retries for the briq calls that are safe to repeat.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable as _};

use super::error::{Error, ErrorClass};

/// Three attempts in all: enough to ride out a blip, short enough that the controller's own
/// requeue (which sees the error) takes over from a longer outage.
const RETRIES: usize = 2;
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// Retry-After is honoured up to this; a longer wait is the controller's to schedule, using
/// [`Error::retry_after`] on the error it gets back.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(10);

/// Runs `call` until it succeeds, fails with a non-retryable error, or runs out of attempts.
/// Only for idempotent calls: an `Uncertain` failure is returned, not repeated, because the
/// caller must decide whether the effect already happened.
pub(crate) async fn idempotent<T, F, Fut>(operation: &'static str, call: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let backoff = ExponentialBuilder::new()
        .with_min_delay(FIRST_PAUSE)
        .with_max_delay(LONGEST_PAUSE)
        .with_max_times(RETRIES)
        .with_jitter();
    call.retry(backoff)
        // A held-back call is the shared health's pause: the caller's requeue waits it out.
        .when(|error: &Error| {
            error.class() == ErrorClass::Retryable && !matches!(error, Error::HeldBack { .. })
        })
        .adjust(|error, planned| {
            planned.map(|pause| {
                error
                    .retry_after()
                    .map_or(pause, |asked| asked.min(LONGEST_RETRY_AFTER))
            })
        })
        .notify(|error, pause| {
            tracing::debug!(operation, %error, ?pause, "retrying briq call");
        })
        .await
}
