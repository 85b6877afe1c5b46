//! Bounds that the settings of every part of the service share.

/// Largest duration setting, in milliseconds (one day): most `*_MS` settings
/// are bounded by it, so that no sum of durations overflows an `Instant`.
pub const MAX_MS: u64 = 86_400_000;
