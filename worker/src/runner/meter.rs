//! What a task is charged: its container's cgroup as read at the end, or,
//! when that cannot be read, the most the task could have used.
//!
//! The end is read while the container still exists (every task's prelude
//! outlives its script). A task can take that away: `kill -9 -1` as the last
//! command kills its own prelude, `docker-init` exits with it, and the
//! container and its cgroup are gone before the worker learns the script has
//! ended. Read only at the end, such a task used its CPU for free (three
//! 8-second busy loops ending so were charged nothing). So the meter also
//! reads the cgroup on every tick while the task runs (a few small files, no
//! Docker call), and when the end cannot be read it charges the last reading
//! plus the container's CPU limit for all the time since: more than the task
//! can have used, never less, and marked as estimated on the task. "Since"
//! ends at the first read that found the cgroup gone, once one had found it:
//! the kernel removes a cgroup only when no process is left in it, so nothing
//! of the task ran after that, however long Docker then takes to say so. A
//! host whose cgroups the worker cannot read at all gets the same bound from
//! the handoff on: the CPU limit for the task's whole run.

use std::time::{Duration, Instant};

use shared::usage::Usage;

use crate::sandbox::{Reading, Sandbox};

/// The period of the CFS bandwidth control that enforces a container's CPU
/// limit (`nano_cpus`; Docker's period is 100 ms). The quota is granted per
/// period, so over a span a container may use up to two periods' worth more
/// than limit × span (one begun before the span, one running past it).
const CFS_PERIOD: Duration = Duration::from_millis(100);

/// One task's CPU and memory as last read while it ran, and its end.
pub(super) struct Meter {
    /// The container's CPU limit, in CPUs.
    cpus: f64,
    /// CPU time in the last reading (0 before any), in ns.
    cpu_ns: u64,
    /// When that reading was asked for (the handoff before any: nothing of
    /// the task ran before it). The figure is of a moment after this one, so
    /// the bound counts from here.
    read_at: Instant,
    /// Whether any read has found the container's cgroup.
    seen: bool,
    /// When a read first found it gone after that (answered by then).
    gone_at: Option<Instant>,
    /// The highest peak memory any reading saw.
    peak_memory_bytes: Option<u64>,
    /// The reading at the end, and when it was taken, once it was attempted.
    end: Option<(Option<Reading>, Instant)>,
}

impl Meter {
    /// A meter for a task handed to its container at `handed_at`, under a
    /// limit of `cpus`.
    pub(super) fn new(cpus: f64, handed_at: Instant) -> Meter {
        Meter {
            cpus,
            cpu_ns: 0,
            read_at: handed_at,
            seen: false,
            gone_at: None,
            peak_memory_bytes: None,
            end: None,
        }
    }

    /// Reads the container's cgroup while the task runs.
    pub(super) async fn sample(&mut self, sandbox: &Sandbox, container: &str) {
        let asked = Instant::now();
        let cgroup = sandbox.cgroup(container).await;
        self.observe(cgroup.as_ref(), asked, Instant::now());
    }

    /// Reads what the container used at its end (its cgroup and /workspace),
    /// before anything stops it; also what the OOM verdict is read from.
    pub(super) async fn read_end(&mut self, sandbox: &Sandbox, container: &str) -> Option<Reading> {
        let asked = Instant::now();
        // The cgroup's answer is timed on its own: the /workspace figure may
        // wait on Docker, and a gone cgroup was gone by its own answer.
        let cgroup = async { (sandbox.cgroup(container).await, Instant::now()) };
        let ((cgroup, answered), workspace_bytes) =
            tokio::join!(cgroup, sandbox.workspace_bytes(container));
        self.observe(cgroup.as_ref(), asked, answered);
        let reading = Reading {
            workspace_bytes,
            ..cgroup.unwrap_or_default()
        };
        let reading = (reading != Reading::default()).then_some(reading);
        self.end = Some((reading, Instant::now()));
        reading
    }

    /// Keeps what a read of the cgroup asked at `asked` and answered at
    /// `answered` found.
    fn observe(&mut self, cgroup: Option<&Reading>, asked: Instant, answered: Instant) {
        match cgroup {
            Some(r) => {
                // Only a figure proves the cgroup was found: an empty reading
                // may be a read that failed (`Sandbox::cgroup` answers one for
                // a blocking read that died), and a later "gone" must not end
                // the bound on the strength of it.
                self.seen |= r.cpu_ns.is_some() || r.peak_memory_bytes.is_some();
                self.record(r, asked);
            }
            None if self.seen => {
                self.gone_at.get_or_insert(answered);
            }
            // Never found (yet, or on this host at all): nothing is known.
            None => {}
        }
    }

    /// Keeps a reading asked for at `at`. The counter only grows: a reading
    /// lower than the last (none in practice) is not one of this container's.
    fn record(&mut self, r: &Reading, at: Instant) {
        if let Some(cpu) = r.cpu_ns
            && cpu >= self.cpu_ns
        {
            self.cpu_ns = cpu;
            self.read_at = at;
        }
        self.peak_memory_bytes = self.peak_memory_bytes.max(r.peak_memory_bytes);
    }

    /// What the task is charged, once it has ended: the end's reading if it
    /// has the CPU figure, else the bound (as of the end's attempt, or now if
    /// there was none: a container lost under the worker).
    pub(super) fn usage(&self) -> Usage {
        match self.end {
            Some((reading, at)) => self.charge(reading.as_ref(), at),
            None => self.charge(None, Instant::now()),
        }
    }

    fn charge(&self, end: Option<&Reading>, at: Instant) -> Usage {
        if let Some(r) = end
            && r.cpu_ns.is_some()
        {
            return usage_of(r);
        }
        // Nothing of the task can have run after `at`: its container was gone
        // (or stopped) by then; nor after its cgroup was found gone.
        let until = self.gone_at.map_or(at, |gone| gone.min(at));
        let unread = until.saturating_duration_since(self.read_at) + 2 * CFS_PERIOD;
        let bound_ns = self.cpu_ns + (unread.as_nanos() as f64 * self.cpus).ceil() as u64;
        Usage {
            cpu_ms: Some(bound_ns.div_ceil(1_000_000)),
            peak_memory_bytes: self
                .peak_memory_bytes
                .max(end.and_then(|r| r.peak_memory_bytes)),
            workspace_bytes: end.and_then(|r| r.workspace_bytes),
            estimated: true,
        }
    }
}

/// The figures a task's record keeps from a reading of its container.
fn usage_of(r: &Reading) -> Usage {
    Usage {
        cpu_ms: r.cpu_ns.map(|ns| ns / 1_000_000),
        peak_memory_bytes: r.peak_memory_bytes,
        workspace_bytes: r.workspace_bytes,
        estimated: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(cpu_ms: u64, peak: u64) -> Reading {
        Reading {
            cpu_ns: Some(cpu_ms * 1_000_000),
            peak_memory_bytes: Some(peak),
            ..Reading::default()
        }
    }

    #[test]
    fn a_reading_at_the_end_is_charged_as_read() {
        let t0 = Instant::now();
        let mut m = Meter::new(2.0, t0);
        m.record(&reading(900, 10 << 20), t0 + Duration::from_millis(500));
        let end = Reading {
            workspace_bytes: Some(4096),
            ..reading(1_250, 12 << 20)
        };
        let u = m.charge(Some(&end), t0 + Duration::from_secs(5));
        assert_eq!(
            u,
            Usage {
                cpu_ms: Some(1_250),
                peak_memory_bytes: Some(12 << 20),
                workspace_bytes: Some(4096),
                estimated: false,
            }
        );
    }

    #[test]
    fn a_container_gone_at_the_end_is_charged_its_last_reading_and_its_limit_since() {
        let t0 = Instant::now();
        let mut m = Meter::new(0.5, t0);
        m.record(&reading(7_800, 40 << 20), t0 + Duration::from_millis(8_000));
        // A later tick read nothing (the cgroup there, its files not): nothing
        // read, nothing lost.
        m.record(&Reading::default(), t0 + Duration::from_millis(8_250));
        let u = m.charge(None, t0 + Duration::from_millis(8_300));
        // 7.8 s + 0.5 CPUs × (0.3 s + two 100 ms periods).
        assert_eq!(u.cpu_ms, Some(7_800 + 250));
        assert_eq!(u.peak_memory_bytes, Some(40 << 20));
        assert_eq!(u.workspace_bytes, None);
        assert!(u.estimated);
        // An end reading without CPU (the cgroup gone, /workspace read by an
        // exec that raced it) is no reading of the CPU either.
        let ws_only = Reading {
            workspace_bytes: Some(1),
            ..Reading::default()
        };
        let u = m.charge(Some(&ws_only), t0 + Duration::from_millis(8_300));
        assert_eq!(
            (u.cpu_ms, u.workspace_bytes, u.estimated),
            (Some(8_050), Some(1), true)
        );
    }

    #[test]
    fn the_bound_ends_when_a_read_first_finds_the_cgroup_gone() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut m = Meter::new(1.0, t0);
        // Never found: nothing is known, so nothing ends the bound early.
        m.observe(None, ms(10), ms(20));
        m.observe(Some(&reading(2_000, 1 << 20)), ms(2_100), ms(2_150));
        // Found gone at 2.4 s and again later; Docker's word came at 9 s.
        m.observe(None, ms(2_350), ms(2_400));
        m.observe(None, ms(5_000), ms(5_100));
        let u = m.charge(None, ms(9_000));
        // 2 s + 1 CPU × (from the read's ask, 2.1 s, to 2.4 s, plus 0.2 s).
        assert_eq!(u.cpu_ms, Some(2_000 + 300 + 200));
        assert!(u.estimated);
        // Before it was ever found, a read that finds nothing ends nothing,
        // nor does one after a read that failed (an empty reading).
        let mut m = Meter::new(1.0, t0);
        m.observe(None, ms(10), ms(20));
        m.observe(Some(&Reading::default()), ms(100), ms(110));
        m.observe(None, ms(200), ms(210));
        assert_eq!(m.charge(None, ms(3_000)).cpu_ms, Some(3_200));
    }

    #[test]
    fn with_no_reading_at_all_the_whole_run_is_charged_at_the_limit() {
        let t0 = Instant::now();
        let m = Meter::new(2.0, t0);
        let u = m.charge(None, t0 + Duration::from_secs(3));
        assert_eq!(u.cpu_ms, Some(2 * 3_200));
        assert_eq!(u.peak_memory_bytes, None);
        assert!(u.estimated);
    }
}
