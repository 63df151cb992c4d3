//! The random numbers llama.cpp's samplers draw: `std::mt19937` seeded with a 32-bit seed,
//! turned into floats the way libstdc++ does (`generate_canonical`, `uniform_real_distribution`,
//! `discrete_distribution`), so a seed gives the same draws here as in llama.cpp.

const N: usize = 624;
const M: usize = 397;

/// `std::mt19937`.
#[derive(Clone, Debug)]
pub struct StdRng {
    mt: Box<[u32; N]>,
    i: usize,
}

impl StdRng {
    pub fn new(seed: u32) -> Self {
        let mut r = StdRng { mt: Box::new([0; N]), i: N };
        r.seed(seed);
        r
    }

    /// `rng.seed(s)`: init_genrand.
    pub fn seed(&mut self, seed: u32) {
        self.mt[0] = seed;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1812433253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        self.i = N;
    }

    fn twist(&mut self) {
        let mt = &mut self.mt;
        for k in 0..N {
            let y = (mt[k] & 0x8000_0000) | (mt[(k + 1) % N] & 0x7fff_ffff);
            let mut v = mt[(k + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= 0x9908_b0df;
            }
            mt[k] = v;
        }
        self.i = 0;
    }

    /// The next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.i >= N {
            self.twist();
        }
        let mut y = self.mt[self.i];
        self.i += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `uniform_real_distribution<double>(0, 1)`: generate_canonical<double, 53> takes two
    /// 32-bit draws, (r1 + r2 * 2^32) / 2^64, below 1.
    pub fn uniform_double(&mut self) -> f64 {
        let r1 = self.next_u32() as f64;
        let r2 = self.next_u32() as f64;
        let x = (r1 + r2 * 4294967296.0) / 18446744073709551616.0;
        if x < 1.0 { x } else { 1.0f64 - f64::EPSILON / 2.0 }
    }

    /// `uniform_real_distribution<float>(0, 1)`: generate_canonical<float, 24>, one draw,
    /// float(r) / 2^32 in float, below 1.
    pub fn uniform_float(&mut self) -> f32 {
        let x = self.next_u32() as f32 / 4294967296.0f32;
        if x < 1.0 { x } else { 1.0f32 - f32::EPSILON / 2.0 }
    }

    /// `std::discrete_distribution<int>(p)(rng)` as libstdc++ computes it: fewer than two
    /// weights return 0 without drawing; otherwise the weights (as double) are summed left
    /// to right, divided by the sum, accumulated left to right, the last cumulative value
    /// is set to 1, and one uniform double picks by `lower_bound`.
    pub fn discrete(&mut self, p: &[f32]) -> usize {
        if p.len() < 2 {
            return 0;
        }
        let sum: f64 = p.iter().fold(0.0, |a, &w| a + w as f64);
        let mut cp = Vec::with_capacity(p.len());
        let mut acc = 0.0f64;
        for &w in p {
            acc += w as f64 / sum;
            cp.push(acc);
        }
        *cp.last_mut().unwrap() = 1.0;
        let x = self.uniform_double();
        // std::lower_bound's binary search (same probes, so NaN weights give the same index)
        let (mut first, mut len) = (0usize, cp.len());
        while len > 0 {
            let half = len >> 1;
            let mid = first + half;
            if cp[mid] < x {
                first = mid + 1;
                len = len - half - 1;
            } else {
                len = half;
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_reference_outputs() {
        // [rand.predef]: the 10000th output of a default-constructed mt19937 (seed 5489)
        let mut r = StdRng::new(5489);
        assert_eq!(r.next_u32(), 3499211612);
        for _ in 0..9998 {
            r.next_u32();
        }
        assert_eq!(r.next_u32(), 4123659995);
    }

    #[test]
    fn libstdcxx_draws() {
        // from libstdc++ (tests/sampling/test_sampling.py LIBSTDCXX, seed 42)
        let mut r = StdRng::new(42);
        assert_eq!(r.uniform_double(), 0.79654298428784598);
        let mut r = StdRng::new(42);
        for _ in 0..3 {
            r.uniform_double();
        }
        assert_eq!(r.uniform_float(), 0.598658502f32);
    }
}
