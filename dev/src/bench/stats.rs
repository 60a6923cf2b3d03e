//! Summaries of timings: median, p90, p95 and p99 (nearest rank), min, max, mean.

use std::time::Duration;

use serde::Serialize;

/// A sample of timings, in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// `None` for an empty sample.
    pub fn of_millis(values: &[f64]) -> Option<Summary> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Summary {
            n,
            median,
            p90: percentile(&sorted, 0.90),
            p95: percentile(&sorted, 0.95),
            p99: percentile(&sorted, 0.99),
            min: sorted[0],
            max: sorted[n - 1],
            mean: sorted.iter().sum::<f64>() / n as f64,
        })
    }

    pub fn of(durations: &[Duration]) -> Option<Summary> {
        Summary::of_millis(&durations.iter().map(|d| millis(*d)).collect::<Vec<_>>())
    }
}

pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of an ascending, non-empty sample.
fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    let rank = (fraction * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `a / b`, `None` when either is missing or `b` is zero.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of_millis(&values).unwrap();
        assert_eq!(
            (s.n, s.median, s.p90, s.p95, s.p99, s.min, s.max),
            (100, 50.5, 90.0, 95.0, 99.0, 1.0, 100.0)
        );
        let s = Summary::of_millis(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.p95, s.p99, s.mean), (2.0, 3.0, 3.0, 2.0));
        assert_eq!(Summary::of_millis(&[]), None);
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
    }
}
