//! Randomness for the generator: a small fast [`Rng`] per connection and the key
//! samplers (`--key-dist uniform|zipf`). Nothing here allocates per sample.

use crate::args::KeyDist;

/// wyrand: one multiply per number, good enough statistics for picking keys and
/// operations, and deterministic from a seed so runs can be repeated.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator from a seed; distinct seeds give unrelated streams.
    pub fn new(seed: u64) -> Rng {
        Rng {
            state: seed ^ 0x2d35_8dcc_aa6c_78a5,
        }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.state) * u128::from(self.state ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// The next 32 random bits.
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)` (Lemire's multiply-shift; the bias is below 2^-32).
    #[inline]
    pub fn below(&mut self, n: u32) -> u32 {
        ((u64::from(self.next_u32()) * u64::from(n)) >> 32) as u32
    }
}

/// Picks key indices in `[0, keys)`.
#[derive(Debug, Clone)]
pub enum KeySampler {
    /// Every key equally likely.
    Uniform { keys: u32 },
    /// Zipf-distributed, index 0 the hottest.
    Zipf(Zipf),
}

impl KeySampler {
    /// The sampler for `--key-dist` over `keys` keys (at least 1).
    pub fn new(dist: KeyDist, keys: u32, exponent: f64) -> KeySampler {
        let keys = keys.max(1);
        match dist {
            KeyDist::Uniform => KeySampler::Uniform { keys },
            KeyDist::Zipf => KeySampler::Zipf(Zipf::new(keys, exponent)),
        }
    }

    /// The next key index.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        match self {
            KeySampler::Uniform { keys } => rng.below(*keys),
            KeySampler::Zipf(zipf) => zipf.sample(rng),
        }
    }
}

/// Zipf over `n` elements by rejection-inversion (Hörmann & Derflinger, "Rejection-
/// inversion to generate variates from monotone discrete distributions", 1996; the
/// same method as Apache Commons RNG): O(1) per sample and no table, so a million keys
/// cost nothing to set up. P(index k) ∝ 1/(k+1)^s.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s_tmp: f64,
}

impl Zipf {
    /// Zipf over `n` ≥ 1 elements with exponent `s` > 0 (a non-positive or non-finite
    /// exponent is taken as 1).
    pub fn new(n: u32, s: f64) -> Zipf {
        let s = if s.is_finite() && s > 0.0 { s } else { 1.0 };
        let n = f64::from(n.max(1));
        let mut z = Zipf {
            n,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s_tmp: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(n + 0.5);
        z.s_tmp = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// An index in `[0, n)`.
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        loop {
            let u = self.h_integral_n + rng.next_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.s_tmp || u >= self.h_integral(k + 0.5) - self.h(k) {
                // k is 1-based and at most n ≤ u32::MAX.
                return (k as u32) - 1;
            }
        }
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.s) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, continuous at 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, continuous at 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frequencies(sampler: &KeySampler, keys: usize, draws: usize) -> Vec<f64> {
        let mut rng = Rng::new(42);
        let mut counts = vec![0u64; keys];
        for _ in 0..draws {
            counts[sampler.sample(&mut rng) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    #[test]
    fn zipf_matches_its_probabilities() {
        for s in [0.99, 1.0, 1.5] {
            let keys = 100;
            let draws = 400_000;
            let sampler = KeySampler::new(KeyDist::Zipf, keys as u32, s);
            let seen = frequencies(&sampler, keys, draws);
            let norm: f64 = (1..=keys).map(|k| 1.0 / (k as f64).powf(s)).sum();
            for k in [0usize, 1, 2, 9, 49] {
                let expected = 1.0 / ((k + 1) as f64).powf(s) / norm;
                // Four standard deviations of a binomial frequency.
                let tolerance = 4.0 * (expected * (1.0 - expected) / draws as f64).sqrt();
                assert!(
                    (seen[k] - expected).abs() < tolerance,
                    "s={s} key {k}: saw {} expected {expected}",
                    seen[k]
                );
            }
            // Monotone on average: the head is hotter than the tail.
            assert!(seen[0] > seen[1] && seen[1] > seen[9] && seen[9] > seen[99]);
        }
    }

    #[test]
    fn zipf_stays_in_range_for_one_and_many_keys() {
        let mut rng = Rng::new(7);
        let one = Zipf::new(1, 0.99);
        let many = Zipf::new(1_000_000, 0.99);
        for _ in 0..10_000 {
            assert_eq!(one.sample(&mut rng), 0);
            assert!(many.sample(&mut rng) < 1_000_000);
        }
    }

    #[test]
    fn uniform_is_flat() {
        let keys = 10;
        let draws = 200_000;
        let seen = frequencies(&KeySampler::new(KeyDist::Uniform, 10, 0.0), keys, draws);
        for (k, f) in seen.iter().enumerate() {
            assert!((f - 0.1).abs() < 0.005, "key {k}: {f}");
        }
    }

    #[test]
    fn rng_is_deterministic_per_seed() {
        let a: Vec<u64> = (0..4)
            .scan(Rng::new(1), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(Rng::new(1), |r, _| Some(r.next_u64()))
            .collect();
        let c: Vec<u64> = (0..4)
            .scan(Rng::new(2), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut r = Rng::new(3);
        assert!((0..1000).all(|_| r.below(7) < 7));
        assert!((0..1000)
            .map(|_| r.next_f64())
            .all(|f| (0.0..1.0).contains(&f)));
    }
}
