//! Seeds for tests with random inputs, so that a failure can be replayed: the seed comes from `FERRY_TEST_SEED`
//! when it is set, else from the OS's generator, and is printed either way. Re-running a failed test with the
//! printed `FERRY_TEST_SEED=...` draws the same inputs.

use rand::SeedableRng as _;
use rand::rngs::StdRng;

use crate::error::{Error, Result};

/// The variable a seed is replayed from.
pub const SEED_VAR: &str = "FERRY_TEST_SEED";

/// The seed of a test's random inputs (`what` names them in the printed line): `FERRY_TEST_SEED` when set, else
/// random. Prints `FERRY_TEST_SEED=N` to stderr (shown with a failing test's output) and logs it.
pub fn test_seed(what: &str) -> Result<u64> {
    let seed = match std::env::var(SEED_VAR) {
        Ok(value) => parse_seed(&value).ok_or(Error::BadSeed { var: SEED_VAR, value })?,
        Err(_) => rand::random(),
    };
    eprintln!("{SEED_VAR}={seed} ({what}; set it to replay these inputs)");
    tracing::info!(seed, what, "random test inputs are drawn from this seed ({SEED_VAR})");
    Ok(seed)
}

/// A generator seeded by [`test_seed`], and the seed (to name it in assertion messages).
pub fn seeded_rng(what: &str) -> Result<(u64, StdRng)> {
    let seed = test_seed(what)?;
    Ok((seed, StdRng::seed_from_u64(seed)))
}

/// A decimal u64, or hex with a `0x` prefix; surrounding whitespace ignored.
fn parse_seed(value: &str) -> Option<u64> {
    let v = value.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng as _;

    use super::*;

    #[test]
    fn seeds_parse_as_printed_decimal_or_hex() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 18446744073709551615\n"), Some(u64::MAX));
        assert_eq!(parse_seed("0x2a"), Some(42));
        assert_eq!(parse_seed("0X2A"), Some(42));
        for bad in ["", "-1", "0x", "seed", "18446744073709551616"] {
            assert_eq!(parse_seed(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_inputs() {
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..8).map(|_| rng.random_range(0..3_000u64)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }
}
