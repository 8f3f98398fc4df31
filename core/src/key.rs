//! A request key as it travels through a dispatcher: its text and its hash, computed once where
//! the key is made (`proto/kubedispatch/v1/keys.md`), not again at every decision.

use kube_dispatch_proto::key::hash64;

/// A request key's text and its XXH64 hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRef<'a> {
    text: &'a str,
    hash: u64,
}

impl<'a> KeyRef<'a> {
    /// The key `text`, hashed.
    pub fn new(text: &'a str) -> Self {
        Self {
            text,
            hash: hash64(text.as_bytes()),
        }
    }

    /// The key as its wire string.
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The key's hash, which places it on the ring.
    pub fn hash(&self) -> u64 {
        self.hash
    }
}

impl<'a> From<&'a str> for KeyRef<'a> {
    fn from(text: &'a str) -> Self {
        Self::new(text)
    }
}

impl<'a> From<&'a String> for KeyRef<'a> {
    fn from(text: &'a String) -> Self {
        Self::new(text)
    }
}

#[cfg(test)]
mod tests {
    use kube_dispatch_proto::RequestKey;

    use super::*;

    #[test]
    fn the_hash_is_the_request_keys() {
        let key = RequestKey::new("apps", "Deployment", "web", "front");
        let text = key.to_string();
        let keyed = KeyRef::new(&text);
        assert_eq!(keyed.text(), "apps/Deployment/web/front");
        assert_eq!(keyed.hash(), key.hash64());
    }
}
