//! A tiny seeded generator (xorshift64*) for workload choices: spread and
//! reproducibility matter here, not quality or secrecy.

/// xorshift64*.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; zero is mapped to a fixed odd constant).
    pub fn new(seed: u64) -> Self {
        let mut r = Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1);
        for _ in 0..4 {
            r.next_u64();
        }
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi` (`lo` when `hi <= lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `pct` percent.
    pub fn percent(&mut self, pct: u64) -> bool {
        self.next_u64() % 100 < pct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_percentages() {
        let mut r = Rng::new(7);
        let xs: Vec<u64> = (0..10_000).map(|_| r.range(3, 9)).collect();
        assert!(xs.iter().all(|x| (3..=9).contains(x)));
        assert!((3..=9).all(|v| xs.contains(&v)));
        let hits = (0..10_000).filter(|_| r.percent(10)).count();
        assert!((800..1200).contains(&hits), "{hits}");
        assert_eq!(r.range(5, 5), 5);
        assert_eq!(r.range(5, 1), 5);
    }
}
