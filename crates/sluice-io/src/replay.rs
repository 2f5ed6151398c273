//! Replay pacing: releasing packets either as fast as possible or at the pace they were
//! recorded at, optionally sped up or slowed down.
//!
//! The first packet given to a [`Pacer`] fixes the origin: it is released at once, and a packet
//! with timestamp `t` is released `(t - t_first) / speed` after it. Waits longer than
//! [`SPIN_THRESHOLD`] sleep (leaving [`SPIN_THRESHOLD`] of margin for the scheduler's wake-up
//! delay) and then spin for the remainder; shorter waits spin. A packet that is already late, or
//! whose timestamp is before the first packet's, is released immediately: the pacer never tries
//! to catch up by releasing later packets early, nor does it accumulate lateness.

use std::time::{Duration, Instant};

/// Waits at most this long by spinning; longer waits sleep first.
pub const SPIN_THRESHOLD: Duration = Duration::from_micros(100);

/// How fast to replay.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Pace {
    /// No waiting at all.
    #[default]
    FullSpeed,
    /// The recorded inter-packet times divided by `speed` (2.0 = twice as fast). A speed that is
    /// not a positive finite number means full speed.
    Recorded {
        /// Speed-up factor.
        speed: f64,
    },
}

/// Releases packets according to a [`Pace`]; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Pacer {
    speed: Option<f64>,
    origin: Option<(Instant, u64)>,
}

impl Pacer {
    /// A pacer for `pace`.
    pub fn new(pace: Pace) -> Pacer {
        let speed = match pace {
            Pace::Recorded { speed } if speed.is_finite() && speed > 0.0 => Some(speed),
            _ => None,
        };
        Pacer { speed, origin: None }
    }

    /// Whether the pacer never waits.
    pub fn is_full_speed(&self) -> bool {
        self.speed.is_none()
    }

    /// Forgets the origin: the next packet is released at once and becomes the new origin.
    pub fn reset(&mut self) {
        self.origin = None;
    }

    /// When the packet with timestamp `ts_ns` is due; `None` at full speed. The first call fixes
    /// the origin (and returns now).
    pub fn due(&mut self, ts_ns: u64) -> Option<Instant> {
        let speed = self.speed?;
        let (t0, ts0) = *self.origin.get_or_insert_with(|| (Instant::now(), ts_ns));
        let offset_ns = ts_ns.saturating_sub(ts0) as f64 / speed;
        // Durations beyond ~584 years are clamped; such a wait is never meant seriously.
        let offset = Duration::from_nanos(offset_ns.min(u64::MAX as f64) as u64);
        Some(t0.checked_add(offset).unwrap_or(t0))
    }

    /// Blocks until the packet with timestamp `ts_ns` is due. Returns how late the release is
    /// (zero when on time or at full speed).
    pub fn wait(&mut self, ts_ns: u64) -> Duration {
        let Some(due) = self.due(ts_ns) else {
            return Duration::ZERO;
        };
        let now = Instant::now();
        if now >= due {
            return now - due;
        }
        let remaining = due - now;
        if remaining > SPIN_THRESHOLD {
            std::thread::sleep(remaining - SPIN_THRESHOLD);
        }
        loop {
            let now = Instant::now();
            if now >= due {
                return now - due;
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_speed_never_waits() {
        let mut p = Pacer::new(Pace::FullSpeed);
        let start = Instant::now();
        for i in 0..1000u64 {
            assert_eq!(p.wait(i * 1_000_000_000), Duration::ZERO);
        }
        assert!(start.elapsed() < Duration::from_millis(100));
        assert!(Pacer::new(Pace::Recorded { speed: 0.0 }).is_full_speed());
        assert!(Pacer::new(Pace::Recorded { speed: f64::NAN }).is_full_speed());
    }

    #[test]
    fn recorded_pace_is_followed() {
        // 20 packets 2 ms apart at speed 2: 19 gaps of 1 ms = 19 ms.
        let mut p = Pacer::new(Pace::Recorded { speed: 2.0 });
        let start = Instant::now();
        let base = 1_600_000_000_000_000_000u64;
        for i in 0..20u64 {
            p.wait(base + i * 2_000_000);
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(19), "{took:?}");
        assert!(took < Duration::from_millis(200), "{took:?}");
    }

    #[test]
    fn short_waits_and_out_of_order() {
        let mut p = Pacer::new(Pace::Recorded { speed: 1.0 });
        let start = Instant::now();
        p.wait(1_000_000);
        p.wait(1_050_000); // 50 µs after the origin: spun
        assert!(start.elapsed() >= Duration::from_micros(50));
        // Earlier than the origin: released at once.
        let start = Instant::now();
        p.wait(0);
        assert!(start.elapsed() < Duration::from_millis(50));
    }

    /// CPU time of the calling thread, from the scheduler's statistics.
    #[cfg(target_os = "linux")]
    fn thread_cpu_ns() -> u64 {
        let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
        s.split_whitespace().next().unwrap().parse().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn long_waits_sleep_instead_of_spinning() {
        let mut p = Pacer::new(Pace::Recorded { speed: 1.0 });
        p.wait(0);
        let cpu0 = thread_cpu_ns();
        let start = Instant::now();
        let late = p.wait(60_000_000); // 60 ms
        let took = start.elapsed();
        let cpu = thread_cpu_ns() - cpu0;
        assert!(took >= Duration::from_millis(59), "{took:?}");
        assert!(late < Duration::from_millis(20), "{late:?}");
        assert!(cpu < 15_000_000, "spent {cpu} ns of CPU in a 60 ms wait");
    }
}
