//! Compact forms of the per-key strings the index keeps, so a key costs bytes, not allocations.
//!
//! resourceVersions are opaque strings by contract but decimal integers in practice (etcd
//! revisions), and uids are canonical UUIDs: both are stored as numbers when they round-trip
//! exactly, and as boxed text otherwise.

/// A resourceVersion: 16 bytes, no allocation when canonical decimal.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) enum Rv {
    /// No resourceVersion known.
    #[default]
    Empty,
    /// A decimal that round-trips exactly.
    Num(u64),
    /// Anything else, kept as given. Boxed twice on purpose: a thin pointer keeps the common
    /// forms small, and the rare text form pays the extra allocation.
    #[allow(clippy::box_collection)]
    Text(Box<String>),
}

impl Rv {
    pub(crate) fn new(s: &str) -> Self {
        if s.is_empty() {
            return Self::Empty;
        }
        match s.parse::<u64>() {
            Ok(n) if n.to_string() == s => Self::Num(n),
            _ => Self::Text(Box::new(s.to_owned())),
        }
    }

    pub(crate) fn matches(&self, s: &str) -> bool {
        *self == Self::new(s)
    }
}

impl std::fmt::Display for Rv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => Ok(()),
            Self::Num(n) => write!(f, "{n}"),
            Self::Text(t) => f.write_str(t),
        }
    }
}

/// An object uid: 24 bytes, no allocation when it is a canonical (lowercase, hyphenated) UUID.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) enum Uid {
    /// No uid known.
    #[default]
    Empty,
    /// A canonical UUID.
    Uuid([u8; 16]),
    /// Anything else, kept as given. Boxed twice on purpose: a thin pointer keeps the common
    /// forms small, and the rare text form pays the extra allocation.
    #[allow(clippy::box_collection)]
    Text(Box<String>),
}

impl Uid {
    pub(crate) fn new(s: &str) -> Self {
        if s.is_empty() {
            return Self::Empty;
        }
        match uuid::Uuid::try_parse(s) {
            Ok(u) if u.hyphenated().to_string() == s => Self::Uuid(u.into_bytes()),
            _ => Self::Text(Box::new(s.to_owned())),
        }
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => Ok(()),
            Self::Uuid(b) => write!(f, "{}", uuid::Uuid::from_bytes(*b).hyphenated()),
            Self::Text(t) => f.write_str(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_form() {
        for s in ["", "1", "18446744073709551615", "007", "abc", "12a"] {
            assert_eq!(Rv::new(s).to_string(), s);
            assert!(Rv::new(s).matches(s));
        }
        assert!(matches!(Rv::new("123456"), Rv::Num(123_456)));
        assert!(
            matches!(Rv::new("007"), Rv::Text(_)),
            "leading zeros do not round-trip"
        );
        for s in [
            "",
            "2d69c964-2f0b-4c0d-9b2b-4028a5c0cc81",
            "2D69C964-2F0B-4C0D-9B2B-4028A5C0CC81",
            "not-a-uuid",
        ] {
            assert_eq!(Uid::new(s).to_string(), s);
        }
        assert!(matches!(
            Uid::new("2d69c964-2f0b-4c0d-9b2b-4028a5c0cc81"),
            Uid::Uuid(_)
        ));
        assert!(matches!(
            Uid::new("2D69C964-2F0B-4C0D-9B2B-4028A5C0CC81"),
            Uid::Text(_)
        ));
    }

    #[test]
    fn stays_small() {
        assert_eq!(std::mem::size_of::<Rv>(), 16);
        assert_eq!(std::mem::size_of::<Uid>(), 24);
    }
}
