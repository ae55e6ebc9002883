//! Log lines about something a client can repeat at will (a refusal, a failed
//! health check) without letting it flood the log: the first at once, then at
//! most one per `EVERY`, counting the events since the last line.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often at most one kind of event is logged.
pub const EVERY: Duration = Duration::from_secs(10);

/// One kind of event's log budget.
#[derive(Debug)]
pub struct Throttle {
    /// When the last line was written, and the events not logged since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    pub const fn new() -> Throttle {
        Throttle {
            state: Mutex::new((None, 0)),
        }
    }

    /// Counts one event. `Some(n)` when a line is due now: `n` counts this event
    /// and those not logged since the last line.
    pub fn tick(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (last, unlogged) = &mut *state;
        *unlogged += 1;
        if last.is_some_and(|t| t.elapsed() < EVERY) {
            return None;
        }
        *last = Some(Instant::now());
        Some(std::mem::take(unlogged))
    }

    /// Events counted and not logged yet.
    #[cfg(test)]
    pub fn unlogged(&self) -> u64 {
        self.state.lock().map(|s| s.1).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_event_is_logged_and_the_next_ones_are_counted() {
        let t = Throttle::new();
        assert_eq!(t.tick(), Some(1), "the first is logged at once");
        assert_eq!((t.tick(), t.tick()), (None, None));
        assert_eq!(t.unlogged(), 2);
    }
}
