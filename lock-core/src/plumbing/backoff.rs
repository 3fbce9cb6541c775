//! Exponential backoff between retries: each pause doubles, up to a ceiling.

use std::time::Duration;

/// Pauses that double from `first` up to `longest`.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    longest: Duration,
    next: Duration,
}

impl Backoff {
    /// Pauses starting at `first` and never longer than `longest`.
    pub fn new(first: Duration, longest: Duration) -> Self {
        Backoff {
            first,
            longest,
            next: first.min(longest),
        }
    }

    /// The pause before the next attempt; the one after it doubles.
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.longest);
        pause
    }

    /// The pause after `failures` consecutive failures (the first is `first`), without
    /// changing the state.
    pub fn after(&self, failures: u32) -> Duration {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_ceiling_and_resets() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(10), ms(50));
        let pauses: Vec<_> = (0..5).map(|_| backoff.next_pause()).collect();
        assert_eq!(pauses, [ms(10), ms(20), ms(40), ms(50), ms(50)]);
        backoff.reset();
        assert_eq!(backoff.next_pause(), ms(10));
        assert_eq!(
            [0, 1, 2, 3, 40].map(|n| backoff.after(n)),
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
