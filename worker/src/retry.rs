//! How the worker waits out a Redis outage: an operation is tried again on
//! backon's schedule for as long as the worker runs, so an outage delays a
//! task's record but never loses it.

use std::future::Future;
use std::time::Duration;

use backon::{ConstantBuilder, ExponentialBuilder, Retryable};
use tokio_util::sync::CancellationToken;

use crate::queue::QueueError;

/// Between two tries of a Redis operation: 100 ms, doubling, at most 5 s; no
/// cap on the number of tries.
fn redis_schedule() -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .without_max_times()
}

/// Between two reads of the jobs stream that failed: 1 s, for ever. Steady
/// rather than growing, so a worker takes jobs again within a second of Redis
/// coming back.
pub fn read_schedule() -> ConstantBuilder {
    ConstantBuilder::new()
        .with_delay(Duration::from_secs(1))
        .without_max_times()
}

/// Runs a Redis operation until it succeeds, retrying on `redis_schedule`. Gives
/// up (with the last error) on a malformed record or an unknown script reply
/// (`QueueError::is_permanent`), which no retry mends, and
/// once `stop` has fired (at shutdown): the pause then ends at once and the
/// try after it is the last. A job whose record could not be written stays
/// pending and is settled later (by the reaper's orphan pass or the next start).
pub async fn redis<T, F, Fut>(what: &str, stop: &CancellationToken, op: F) -> Result<T, QueueError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, QueueError>>,
{
    // backon's sleeper must own what it uses.
    let sleeper_stop = stop.clone();
    op.retry(redis_schedule())
        .sleep(move |delay| pause(sleeper_stop.clone(), delay))
        .when(|e| !e.is_permanent() && !stop.is_cancelled())
        .notify(|e, _| tracing::warn!(what, error = %e, "Redis operation failed; retrying"))
        .await
}

/// Sleeps `delay`, or until `stop` fires.
async fn pause(stop: CancellationToken, delay: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = stop.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Instant;

    use backon::BackoffBuilder;

    use super::*;

    fn down() -> QueueError {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "down");
        QueueError::Redis(redis::RedisError::from(refused))
    }

    /// Calls `redis` with an operation that fails `failures` times (with what
    /// `error` makes) and then succeeds; the times of its calls, and the result.
    async fn tries(
        failures: usize,
        error: fn() -> QueueError,
        stop: &CancellationToken,
    ) -> (Vec<Instant>, Result<(), QueueError>) {
        let calls = Mutex::new(Vec::new());
        let result = redis("test", stop, || {
            let mut calls = calls.lock().expect("calls");
            calls.push(Instant::now());
            let n = calls.len();
            async move { if n <= failures { Err(error()) } else { Ok(()) } }
        })
        .await;
        (calls.into_inner().expect("calls"), result)
    }

    #[test]
    fn delays_double_from_100_ms_up_to_5_s_and_never_run_out() {
        let ms: Vec<u128> = redis_schedule()
            .build()
            .take(10)
            .map(|d| d.as_millis())
            .collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000]);
        assert_eq!(
            redis_schedule().build().nth(10_000),
            Some(Duration::from_secs(5))
        );
    }

    #[tokio::test]
    async fn a_failure_is_retried_until_the_operation_succeeds() {
        let (calls, result) = tries(2, down, &CancellationToken::new()).await;
        assert!(result.is_ok());
        assert_eq!(calls.len(), 3);
        assert!(calls[2] - calls[0] >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_malformed_record_is_not_retried() {
        let corrupt = || {
            QueueError::Corrupt(
                "t".into(),
                shared::record::RecordError::Missing(shared::Field::State),
            )
        };
        let (calls, result) = tries(1, corrupt, &CancellationToken::new()).await;
        assert!(matches!(result, Err(QueueError::Corrupt(..))));
        assert_eq!(calls.len(), 1);
    }

    #[tokio::test]
    async fn shutdown_ends_the_pause_and_the_next_failure_is_returned() {
        let stop = CancellationToken::new();
        let cancelled_at = std::sync::Arc::new(Mutex::new(None));
        tokio::spawn({
            let (stop, cancelled_at) = (stop.clone(), cancelled_at.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                *cancelled_at.lock().expect("cancelled_at") = Some(Instant::now());
                stop.cancel();
            }
        });
        let (calls, result) = tries(usize::MAX, down, &stop).await;
        assert!(matches!(result, Err(QueueError::Redis(_))));
        // A pause under way ends at once (not after its 400 ms or more), and the
        // try after it is the last.
        let cancelled_at = cancelled_at
            .lock()
            .expect("cancelled_at")
            .expect("cancelled");
        assert_eq!(calls.iter().filter(|t| **t >= cancelled_at).count(), 1);
        let last = calls.last().expect("a try");
        assert!(*last - cancelled_at < Duration::from_millis(200));
    }
}
