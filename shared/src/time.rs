//! Timestamps as clients see them. Redis stores Unix milliseconds; the api shows
//! RFC 3339 UTC strings. The calendar arithmetic is the `time` crate's.

use time::UtcDateTime;

/// The first and last instants RFC 3339 can write (its years have four digits):
/// `0000-01-01T00:00:00.000Z` and `9999-12-31T23:59:59.999Z`, in Unix milliseconds.
const FIRST_MS: i64 = -62_167_219_200_000;
const LAST_MS: i64 = 253_402_300_799_999;

/// `1970-01-01T00:00:00.000Z` form of Unix milliseconds. An instant before year
/// 0000 or after 9999 (no real record's: they hold Redis's clock) is shown as
/// the nearest one RFC 3339 can write, so a client's parser never meets a
/// five-digit or negative year.
pub fn rfc3339_ms(unix_ms: i64) -> String {
    let ms = unix_ms.clamp(FIRST_MS, LAST_MS);
    // Within `time`'s range (years -9999 to 9999) once clamped, so the epoch
    // fallback is never taken; it keeps a bad figure from ever being a panic.
    let t = UtcDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(UtcDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339_ms(1_796_083_199_999), "2026-11-30T23:59:59.999Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn out_of_range_instants_show_the_nearest_writable_one() {
        assert_eq!(rfc3339_ms(FIRST_MS), "0000-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(LAST_MS), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_ms(FIRST_MS - 1), "0000-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(i64::MIN), "0000-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(LAST_MS + 1), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_ms(i64::MAX), "9999-12-31T23:59:59.999Z");
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
