//! Timestamps as clients see them. Redis stores Unix milliseconds; the api shows
//! RFC 3339 UTC strings. Hand-rolled so `shared` needs no date crate.

/// `1970-01-01T00:00:00.000Z` form of Unix milliseconds.
pub fn rfc3339_ms(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let ms = unix_ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Unix milliseconds from a `TIME` reply (seconds and microseconds), so
/// every reader turns Redis's clock into the record's unit the same way.
pub fn redis_time_ms((secs, micros): (i64, i64)) -> i64 {
    secs * 1000 + micros / 1000
}

/// A task's clock from its record's timestamps (Unix milliseconds, Redis's clock)
/// at `now_ms`: seconds since its container started, and seconds since its last
/// output byte (since the start if none). Both stop at `finished_ms`, so a
/// finished task's figures stay put; both are `None` before the start.
pub fn task_clock(
    started_ms: Option<i64>,
    last_output_ms: Option<i64>,
    finished_ms: Option<i64>,
    now_ms: i64,
) -> (Option<f64>, Option<f64>) {
    let seconds = |ms: i64| (ms.max(0) as f64) / 1000.0;
    let end = finished_ms.unwrap_or(now_ms);
    (
        started_ms.map(|s| seconds(end - s)),
        started_ms.map(|s| seconds(end - last_output_ms.unwrap_or(s))),
    )
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339_ms(1_796_083_199_999), "2026-11-30T23:59:59.999Z");
    }

    #[test]
    fn redis_time_reads_as_milliseconds() {
        assert_eq!(redis_time_ms((1_700_000_000, 123_999)), 1_700_000_000_123);
    }

    #[test]
    fn a_task_clock_runs_from_the_start_and_stops_at_the_finish() {
        assert_eq!(task_clock(None, None, None, 5_000), (None, None));
        // Running: 4 s since start, silent since the output at 3 s.
        assert_eq!(
            task_clock(Some(1_000), Some(3_000), None, 5_000),
            (Some(4.0), Some(2.0))
        );
        // No output yet: silent since the start.
        assert_eq!(
            task_clock(Some(1_000), None, None, 5_000),
            (Some(4.0), Some(4.0))
        );
        // Finished at 2.5 s: later reads do not move.
        assert_eq!(
            task_clock(Some(1_000), Some(2_000), Some(2_500), 9_000),
            (Some(1.5), Some(0.5))
        );
    }
}
