//! Exponential backoff between retries with full jitter: each pause is drawn uniformly
//! from zero to a ceiling that doubles up to a limit, so that clients that failed
//! together (a server restarted under a fleet) do not retry together.

use std::time::Duration;

use rand::Rng;

/// Pauses drawn uniformly from zero to a ceiling that doubles from `first` up to
/// `longest` (full jitter).
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    longest: Duration,
    next: Duration,
}

impl Backoff {
    /// Pauses under a ceiling starting at `first` and never above `longest`.
    pub fn new(first: Duration, longest: Duration) -> Self {
        Backoff {
            first,
            longest,
            next: first.min(longest),
        }
    }

    /// The pause before the next attempt, at most the current ceiling; the ceiling after
    /// it doubles.
    pub fn next_pause(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = self.next.saturating_mul(2).min(self.longest);
        jitter(ceiling)
    }

    /// A pause after `failures` consecutive failures (under `first` for the first),
    /// without changing the state.
    pub fn after(&self, failures: u32) -> Duration {
        jitter(self.ceiling_after(failures))
    }

    /// The ceiling of the pause after `failures` consecutive failures.
    fn ceiling_after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first
            .saturating_mul(1u32 << doublings)
            .min(self.longest)
    }

    /// Starts again from `first` (after a success).
    pub fn reset(&mut self) {
        self.next = self.first.min(self.longest);
    }
}

/// A pause drawn uniformly from zero to `ceiling`.
fn jitter(ceiling: Duration) -> Duration {
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::rng().random_range(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_up_to_the_limit_and_reset() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(10), ms(50));
        let ceilings: Vec<_> = (0..5)
            .map(|_| {
                let ceiling = backoff.next;
                assert!(backoff.next_pause() <= ceiling);
                ceiling
            })
            .collect();
        assert_eq!(ceilings, [ms(10), ms(20), ms(40), ms(50), ms(50)]);
        backoff.reset();
        assert_eq!(backoff.next, ms(10));
        assert_eq!(
            [0, 1, 2, 3, 40].map(|n| backoff.ceiling_after(n)),
            [ms(10), ms(10), ms(20), ms(40), ms(50)]
        );
    }

    /// Full jitter: the pauses under one ceiling spread uniformly over [0, ceiling], so
    /// that clients failing at the same instant retry at different ones.
    #[test]
    fn pauses_spread_uniformly_up_to_the_ceiling() {
        let ceiling = Duration::from_millis(1000);
        let backoff = Backoff::new(ceiling, ceiling);
        const DRAWS: u32 = 4000;
        let mut deciles = [0u32; 10];
        let mut total = Duration::ZERO;
        for _ in 0..DRAWS {
            let pause = backoff.after(1);
            assert!(pause <= ceiling, "{pause:?} above the ceiling");
            total += pause;
            let decile = (pause.as_millis() / 100).min(9) as usize;
            deciles[decile] += 1;
        }
        let mean = total / DRAWS;
        assert!(
            (Duration::from_millis(450)..=Duration::from_millis(550)).contains(&mean),
            "the mean pause is {mean:?}, not about half the ceiling"
        );
        // Each tenth of the range gets about a tenth of the draws (400; 5 sigma ~ 95).
        for (i, n) in deciles.iter().enumerate() {
            assert!(
                (300..=500).contains(n),
                "decile {i} got {n} of {DRAWS}: {deciles:?}"
            );
        }
    }
}
