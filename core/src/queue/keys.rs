//! Keys as the queue stores them: the `group/kind/namespace/` prefix once per queue, the name
//! inline when it is short.
//!
//! A request key repeats its prefix for every object of a namespace; an index of a million keys
//! would hold the same few hundred prefixes a million times. Each queue interns them instead:
//! a key is a prefix number and its name, 32 bytes with no allocation for names of up to 23
//! bytes (most object names; longer ones are shared, so clones stay cheap).

use std::sync::Arc;

use smol_str::SmolStr;

/// The queue's maps: keyed by object names, which users choose, so hashed with a random seed
/// (foldhash, as hashbrown's default; SipHash cost a third of the time of a change).
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// See [`HashMap`].
pub(crate) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// A key of one queue: only that queue's prefixes can spell it (outside the crate, an
/// opaque handle to hand back to the queue that gave it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    prefix: u32,
    name: SmolStr,
}

/// A prefix, and how many of the queue's entries use it.
#[derive(Debug)]
struct Prefix {
    text: Arc<str>,
    entries: usize,
}

/// The prefixes of a queue's keys. A prefix lives while an entry uses it; its number is never
/// given to another prefix, so a key held past its entry (in a ready FIFO, say) cannot come to
/// name another key. Bounded by the prefixes of the keys known (namespaces times kinds).
#[derive(Debug, Default)]
pub(crate) struct Prefixes {
    ids: HashMap<Arc<str>, u32>,
    texts: HashMap<u32, Prefix>,
    next: u32,
}

/// Splits a key after its last `/`: the prefix and the name (names hold no `/`).
fn split(key: &str) -> (&str, &str) {
    key.rfind('/')
        .map_or(("", key), |slash| key.split_at(slash + 1))
}

impl Prefixes {
    /// The stored form of `key`, if its prefix is known.
    pub(crate) fn find(&self, key: &str) -> Option<Key> {
        let (prefix, name) = split(key);
        self.ids.get(prefix).map(|&prefix| Key {
            prefix,
            name: SmolStr::new(name),
        })
    }

    /// The stored form of `key` for a new entry: counts the entry against its prefix, which is
    /// interned if new. Pair with [`Self::release`] when the entry goes.
    pub(crate) fn retain(&mut self, key: &str) -> Key {
        let (prefix, name) = split(key);
        let id = match self.ids.get(prefix) {
            Some(&id) => id,
            None => {
                let id = self.next;
                // Wrapping takes 4 billion distinct prefixes in one queue's life.
                self.next = self.next.wrapping_add(1);
                let text: Arc<str> = Arc::from(prefix);
                self.ids.insert(text.clone(), id);
                self.texts.insert(id, Prefix { text, entries: 0 });
                id
            }
        };
        if let Some(p) = self.texts.get_mut(&id) {
            p.entries += 1;
        }
        Key {
            prefix: id,
            name: SmolStr::new(name),
        }
    }

    /// An entry of `key` went: its prefix is dropped with its last entry.
    pub(crate) fn release(&mut self, key: &Key) {
        let Some(p) = self.texts.get_mut(&key.prefix) else {
            return;
        };
        p.entries -= 1;
        if p.entries == 0
            && let Some(p) = self.texts.remove(&key.prefix)
        {
            self.ids.remove(&p.text);
        }
    }

    fn prefix(&self, key: &Key) -> &str {
        self.texts.get(&key.prefix).map_or("", |p| &p.text)
    }

    /// Writes the text of `key` into `out`, replacing what it held, and returns it.
    pub(crate) fn spell<'a>(&self, key: &Key, out: &'a mut String) -> &'a str {
        out.clear();
        out.push_str(self.prefix(key));
        out.push_str(&key.name);
        out
    }

    /// The text of `key`.
    pub(crate) fn text(&self, key: &Key) -> String {
        let prefix = self.prefix(key);
        let mut out = String::with_capacity(prefix.len() + key.name.len());
        out.push_str(prefix);
        out.push_str(&key.name);
        out
    }

    /// The hash of the key's text, which places it on the ring.
    pub(crate) fn hash64(&self, key: &Key) -> u64 {
        kube_dispatch_proto::key::hash64_parts(&[self.prefix(key).as_bytes(), key.name.as_bytes()])
    }

    /// Number of prefixes held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.texts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_share_their_prefix() {
        let mut p = Prefixes::default();
        let a = p.retain("apps/Deployment/web/front");
        let b = p.retain("apps/Deployment/web/back");
        let c = p.retain("no-slash");
        assert_eq!(p.text(&a), "apps/Deployment/web/front");
        assert_eq!(p.text(&c), "no-slash");
        assert_eq!(a.prefix, b.prefix);
        assert_eq!(p.len(), 2);
        assert_eq!(p.find("apps/Deployment/web/front"), Some(a.clone()));
        assert_eq!(
            p.hash64(&a),
            kube_dispatch_proto::key::hash64(b"apps/Deployment/web/front")
        );
        assert_eq!(std::mem::size_of::<Key>(), 32);
        p.release(&a);
        assert_eq!(p.len(), 2, "the prefix stays while b uses it");
        p.release(&b);
        assert_eq!(p.find("apps/Deployment/web/back"), None);
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn a_dropped_prefix_number_is_not_reused() {
        let mut p = Prefixes::default();
        let old = p.retain("/ConfigMap/a/x");
        p.release(&old);
        let new = p.retain("/ConfigMap/b/x");
        assert_ne!(old, new);
        assert_eq!(
            p.text(&old),
            "x",
            "a key whose prefix went spells no other key"
        );
    }
}
