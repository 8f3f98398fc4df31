//! Request keys: `group/kind/namespace/name`, and their stable hash.
//!
//! The format and the hash are part of the wire contract (see `proto/kubedispatch/v1/keys.md`):
//! every component, in any language, must produce the same bytes and the same hash.

use std::fmt;

/// The key of the object a controller reconciles.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    /// API group; empty for the core group.
    pub group: String,
    /// Kind, for example `ConfigMap`.
    pub kind: String,
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// Why a string is not a request key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The string does not have exactly four `/`-separated parts.
    #[error("request key {0:?} must have the form group/kind/namespace/name (four parts)")]
    Parts(String),
    /// The kind or the name is empty.
    #[error("request key {0:?} has an empty kind or name")]
    Empty(String),
}

impl RequestKey {
    /// A key from its parts.
    pub fn new(
        group: impl Into<String>,
        kind: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            group: group.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `group/kind/namespace/name`.
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let mut parts = s.split('/');
        let (Some(group), Some(kind), Some(namespace), Some(name), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(KeyError::Parts(s.to_owned()));
        };
        if kind.is_empty() || name.is_empty() {
            return Err(KeyError::Empty(s.to_owned()));
        }
        Ok(Self::new(group, kind, namespace, name))
    }

    /// The stable 64-bit hash of this key that places it on the ring.
    pub fn hash64(&self) -> u64 {
        hash64(self.to_string().as_bytes())
    }
}

impl fmt::Display for RequestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.group, self.kind, self.namespace, self.name
        )
    }
}

/// The stable hash of the contract: XXH64 of the bytes with seed 0.
pub fn hash64(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(bytes, 0)
}

/// [`hash64`] of the concatenation of `parts`, without building it.
pub fn hash64_parts(parts: &[&[u8]]) -> u64 {
    let mut hasher = xxhash_rust::xxh64::Xxh64::new(0);
    for part in parts {
        hasher.update(part);
    }
    hasher.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_of_parts_is_the_hash_of_their_concatenation() {
        let whole = "apps/Deployment/web/front";
        for cut in 0..=whole.len() {
            let (a, b) = whole.split_at(cut);
            assert_eq!(
                hash64_parts(&[a.as_bytes(), b.as_bytes()]),
                hash64(whole.as_bytes())
            );
        }
    }

    #[test]
    fn formats_and_parses_every_shape() {
        for (key, text) in [
            (
                RequestKey::new("", "ConfigMap", "default", "settings"),
                "/ConfigMap/default/settings",
            ),
            (
                RequestKey::new("apps", "Deployment", "web", "frontend"),
                "apps/Deployment/web/frontend",
            ),
            (
                RequestKey::new("", "Namespace", "", "kube-system"),
                "/Namespace//kube-system",
            ),
        ] {
            assert_eq!(key.to_string(), text);
            assert_eq!(RequestKey::parse(text), Ok(key));
        }
    }

    #[test]
    fn rejects_malformed_keys() {
        assert!(matches!(
            RequestKey::parse("a/b/c"),
            Err(KeyError::Parts(_))
        ));
        assert!(matches!(
            RequestKey::parse("a/b/c/d/e"),
            Err(KeyError::Parts(_))
        ));
        assert!(matches!(
            RequestKey::parse("//ns/name"),
            Err(KeyError::Empty(_))
        ));
        assert!(matches!(
            RequestKey::parse("g/Kind/ns/"),
            Err(KeyError::Empty(_))
        ));
    }

    #[test]
    fn hash_is_xxh64_with_seed_zero() {
        // Published XXH64 reference values for seed 0.
        assert_eq!(hash64(b""), 0xef46_db37_51d8_e999);
        assert_eq!(hash64(b"a"), 0xd24e_c4f1_a98c_6e5b);
        assert_eq!(hash64(b"abc"), 0x44bc_2cf5_ad77_0999);
    }
}
