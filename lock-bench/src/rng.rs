//! Small, fast, seedable randomness: xorshift64* and a Zipf sampler.
//!
//! The bench needs spread, not secrecy, and the same sequence on every run.

/// xorshift64*.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so that small seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// 32 lowercase hex digits, the length of a distlock owner token.
    pub fn hex32(&mut self) -> String {
        format!("{:016x}{:016x}", self.next_u64(), self.next_u64())
    }
}

/// Zipf over `0..n`: rank `k` is drawn with probability proportional to
/// `1 / (k + 1)^s`. Inverse-CDF sampling over a precomputed table: O(log n).
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for k in 0..n {
            sum += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { cdf }
    }

    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.next_f64();
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }

    /// Probability of rank `k`.
    pub fn probability(&self, k: usize) -> f64 {
        match k {
            0 => self.cdf[0],
            _ => self.cdf[k] - self.cdf[k - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_follows_its_law() {
        let z = Zipf::new(1000, 0.99);
        let mut rng = Rng::new(7);
        let mut counts = vec![0u32; 1000];
        let n = 200_000;
        for _ in 0..n {
            counts[z.sample(&mut rng)] += 1;
        }
        for k in [0, 1, 9, 99] {
            let expected = z.probability(k) * n as f64;
            let got = f64::from(counts[k]);
            assert!(
                (got - expected).abs() < 5.0 * expected.sqrt() + 5.0,
                "rank {k}: {got} vs {expected}"
            );
        }
        // Rank 1 is drawn about 2^0.99 times less often than rank 0.
        let ratio = f64::from(counts[0]) / f64::from(counts[1]);
        assert!((1.8..2.2).contains(&ratio), "{ratio}");
    }

    #[test]
    fn hex_tokens_have_32_digits() {
        let mut rng = Rng::new(1);
        let t = rng.hex32();
        assert_eq!(t.len(), 32);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
