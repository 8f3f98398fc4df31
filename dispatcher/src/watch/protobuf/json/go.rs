//! Text as Go's `encoding/json` and `time` write it, where Rust's differs.

/// Bytes as text: Go's `encoding/json` writes each byte that is not part of valid UTF-8 as
/// U+FFFD.
pub(crate) fn as_text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return text.into();
    }
    let mut text = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        text.push_str(chunk.valid());
        text.extend(std::iter::repeat_n('\u{fffd}', chunk.invalid().len()));
    }
    text.into()
}

/// Go's `time.Duration.String`: "1h2m3.5s", "1.5ms", "0s".
pub(super) fn go_duration(nanos: i64) -> String {
    let negative = nanos < 0;
    let u = nanos.unsigned_abs();
    /// `v / 10^prec` and its fraction's digits, without trailing zeros.
    fn split(v: u64, prec: u32) -> (u64, String) {
        let scale = 10u64.pow(prec);
        let fraction = v % scale;
        if fraction == 0 {
            return (v / scale, String::new());
        }
        let digits = format!("{fraction:0width$}", width = prec as usize);
        (v / scale, format!(".{}", digits.trim_end_matches('0')))
    }
    let text = if u == 0 {
        "0s".to_owned()
    } else if u < 1_000_000_000 {
        let (prec, unit) = if u < 1_000 {
            (0, "ns")
        } else if u < 1_000_000 {
            (3, "µs")
        } else {
            (6, "ms")
        };
        let (whole, fraction) = split(u, prec);
        format!("{whole}{fraction}{unit}")
    } else {
        let (seconds, fraction) = split(u, 9);
        let (minutes, hours) = (seconds / 60, seconds / 3600);
        match (hours, minutes) {
            (0, 0) => format!("{seconds}{fraction}s"),
            (0, _) => format!("{minutes}m{}{fraction}s", seconds % 60),
            _ => format!("{hours}h{}m{}{fraction}s", minutes % 60, seconds % 60),
        }
    };
    if negative { format!("-{text}") } else { text }
}
