//! kubectl's plain table layout and its short durations (`45s`, `3m20s`, `5h`, `12d`).

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::Resource;

use super::output::printable;
use crate::crd::Execution;

/// Left-aligned columns, three spaces apart, headers first. Cells are made [`printable`].
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    // A cell without its header would be dropped without a word.
    debug_assert!(
        rows.iter().all(|row| row.len() == headers.len()),
        "every row has one cell per header"
    );
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| printable(cell).into_owned())
                .collect()
        })
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let headers = headers.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for row in std::iter::once(&headers).chain(rows) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(&format!("{cell:<width$}   "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A duration the way kubectl shows ages: two units while the larger is small, else one.
pub fn human(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86_400);
    let two = |big: u64, big_unit: &str, small: u64, small_unit: &str| match small {
        0 => format!("{big}{big_unit}"),
        _ => format!("{big}{big_unit}{small}{small_unit}"),
    };
    match () {
        _ if seconds < 120 => format!("{seconds}s"),
        _ if minutes < 10 => two(minutes, "m", seconds % 60, "s"),
        _ if hours < 3 => format!("{minutes}m"),
        _ if hours < 8 => two(hours, "h", minutes % 60, "m"),
        _ if hours < 48 => format!("{hours}h"),
        _ if days < 8 => two(days, "d", hours % 24, "h"),
        _ => format!("{days}d"),
    }
}

/// A short run, precise below a minute (`350ms`, `2.4s`), else as [`human`].
pub fn run_time(duration: Duration) -> String {
    match duration.as_millis() {
        millis @ 0..1_000 => format!("{millis}ms"),
        1_000..60_000 => format!("{:.1}s", duration.as_secs_f64()),
        _ => human(duration),
    }
}

pub fn or_dash(value: Option<String>) -> String {
    value
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "-".into())
}

pub fn elapsed(since: &Time, until: Timestamp) -> Duration {
    Duration::try_from(until.duration_since(since.0)).unwrap_or_default()
}

pub fn age(object: &impl Resource, now: Timestamp) -> String {
    object
        .meta()
        .creation_timestamp
        .as_ref()
        .map_or_else(|| "-".into(), |created| human(elapsed(created, now)))
}

/// The kernel's time when the code ran; else the time since it was sent (timestamps have
/// whole seconds only); `-` before that.
pub fn duration(execution: &Execution, now: Timestamp) -> String {
    let Some(status) = &execution.status else {
        return "-".into();
    };
    if let Some(millis) = status.duration_millis {
        return run_time(Duration::from_millis(millis));
    }
    let Some(start) = &status.start_time else {
        return "-".into();
    };
    let end = status.completion_time.as_ref().map_or(now, |end| end.0);
    human(elapsed(start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_lines_have_no_trailing_spaces() {
        let rows = vec![
            vec!["py".to_owned(), "True".to_owned()],
            vec!["longer-name".to_owned(), "-".to_owned()],
        ];
        assert_eq!(
            render(&["NAME", "READY"], &rows),
            "NAME          READY\npy            True\nlonger-name   -\n"
        );
    }

    #[test]
    fn durations_read_like_kubectl() {
        let cases = [
            (5, "5s"),
            (119, "119s"),
            (200, "3m20s"),
            (300, "5m"),
            (3_000, "50m"),
            (4 * 3600 + 60, "4h1m"),
            (30 * 3600, "30h"),
            (3 * 86_400 + 7200, "3d2h"),
            (40 * 86_400, "40d"),
        ];
        for (seconds, shown) in cases {
            assert_eq!(human(Duration::from_secs(seconds)), shown, "{seconds}s");
        }
        assert_eq!(run_time(Duration::from_millis(350)), "350ms");
        assert_eq!(run_time(Duration::from_millis(2_430)), "2.4s");
        assert_eq!(run_time(Duration::from_secs(200)), "3m20s");
    }
}
