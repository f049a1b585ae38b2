//! Retry delays: `min(baseSeconds * factor^(n-1), maxSeconds) + uniform(0, jitterMillis)`.

use std::time::Duration;

use crate::api::BackoffSpec;

/// Delay before retry `n` (1-based). `unit_random` is a uniform sample from `[0, 1)`, injected so
/// tests are deterministic; values outside that range are clamped.
pub fn retry_delay(spec: &BackoffSpec, n: u32, unit_random: f64) -> Duration {
    let exponent = n.saturating_sub(1).min(1024) as i32;
    let base = spec.base_seconds.max(0) as f64;
    let max = spec.max_seconds.max(0) as f64;
    let factor = if spec.factor.is_finite() {
        spec.factor.max(1.0)
    } else {
        1.0
    };
    // powi overflows to infinity for huge exponents, which min() then caps.
    let exponential = (base * factor.powi(exponent)).min(max);
    let jitter_ms = spec.jitter_millis.max(0) as f64 * unit_random.clamp(0.0, 1.0 - f64::EPSILON);
    Duration::from_secs_f64(exponential) + Duration::from_micros((jitter_ms * 1000.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(base: i64, factor: f64, max: i64, jitter: i64) -> BackoffSpec {
        BackoffSpec {
            base_seconds: base,
            factor,
            max_seconds: max,
            jitter_millis: jitter,
        }
    }

    #[test]
    fn doubles_from_base_until_capped() {
        let s = spec(1, 2.0, 300, 0);
        let secs: Vec<u64> = (1..=10)
            .map(|n| retry_delay(&s, n, 0.0).as_secs())
            .collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
    }

    #[test]
    fn jitter_adds_up_to_jitter_millis() {
        let s = spec(1, 2.0, 300, 500);
        assert_eq!(retry_delay(&s, 1, 0.0), Duration::from_secs(1));
        assert_eq!(retry_delay(&s, 1, 0.5), Duration::from_millis(1250));
        assert!(retry_delay(&s, 1, 1.0) < Duration::from_millis(1500));
    }

    #[test]
    fn huge_retry_numbers_stay_capped() {
        let s = spec(5, 10.0, 60, 0);
        assert_eq!(retry_delay(&s, u32::MAX, 0.0), Duration::from_secs(60));
    }

    proptest! {
        #[test]
        fn delay_is_within_bounds(base in 0i64..100, factor in 1.0f64..10.0, max in 0i64..1000,
                                   jitter in 0i64..10_000, n in 1u32..=10, r in 0.0f64..1.0) {
            let s = spec(base, factor, max, jitter);
            let d = retry_delay(&s, n, r);
            let exponential = (base as f64 * factor.powi(n as i32 - 1)).min(max as f64);
            let low = Duration::from_secs_f64(exponential);
            prop_assert!(d >= low);
            prop_assert!(d < low + Duration::from_millis(jitter as u64) + Duration::from_micros(1));
        }

        #[test]
        fn delay_never_shrinks_as_retries_grow(base in 0i64..100, factor in 1.0f64..10.0,
                                                max in 0i64..1000, n in 1u32..30) {
            let s = spec(base, factor, max, 0);
            prop_assert!(retry_delay(&s, n + 1, 0.0) >= retry_delay(&s, n, 0.0));
        }
    }
}
