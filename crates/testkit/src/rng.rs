//! The tests' one random generator: xorshift64*, seeded, so a test
//! repeats exactly.

/// xorshift64* from a non-zero seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform in [0, n) (`n` small: the modulo's bias is negligible).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A Poisson count of mean `lambda` (small means: Knuth's product of
    /// uniforms; large: a rounded normal, good enough for a test).
    pub fn poisson(&mut self, lambda: f64) -> u64 {
        if lambda <= 0.0 {
            return 0;
        }
        if lambda > 30.0 {
            let u1 = self.unit().max(1e-300);
            let u2 = self.unit();
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            return (lambda + z * lambda.sqrt()).round().max(0.0) as u64;
        }
        let l = (-lambda).exp();
        let (mut k, mut p) = (0u64, 1.0);
        loop {
            p *= self.unit();
            if p <= l {
                return k;
            }
            k += 1;
        }
    }
}
