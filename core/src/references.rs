//! References by field path: which objects a group reconciles name which others (a Secret by
//! `spec.secretName`, ConfigMaps by `spec.volumes[*].configMap.name`), so that a change to a
//! named object reconciles each object that names it, with no cache and no user code in the
//! dispatcher.
//!
//! - [`FieldPath`]: where an object holds a name, parsed and checked once; read straight from
//!   the JSON text the API server sent ([`FieldPath::names_in`]), decoding nothing but the
//!   fields on the path.
//! - [`References`]: one group's index, both ways: each object it serves (the referrer) to the
//!   keys it names (the targets), and each target to its referrers, with the resourceVersion
//!   and list epoch the target was last seen at, so a re-list tells only the referrers of
//!   targets that changed or went away meanwhile.
//!
//! Bound: one entry per referrer the group serves here that names anything, each naming at
//! most [`MAX_NAMES_PER_OBJECT`] targets, and one entry per target named (about
//! [`References::bytes`] in all, roughly 150 bytes per reference). A referrer leaves the index
//! when it is deleted, moves to another dispatcher or is missing from a re-list; a target when
//! nothing names it.

use std::{
    borrow::Cow,
    collections::{BTreeSet, HashMap},
    fmt,
    sync::Arc,
};

use serde::{
    Deserializer,
    de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_json::value::RawValue;

/// Most field paths one subscription may give.
pub const MAX_FIELD_PATHS: usize = 8;
/// Longest field path accepted (bytes).
pub const MAX_PATH_LEN: usize = 256;
/// Most steps (fields) in one field path.
pub const MAX_PATH_STEPS: usize = 16;
/// Most names one object may contribute, over every path of every subscription; names past
/// it are not indexed (a change to those targets does not reconcile the object) and the
/// caller counts the object as truncated.
pub const MAX_NAMES_PER_OBJECT: usize = 64;
/// Most field paths over all the `referenced_by` subscriptions of one group.
pub const MAX_GROUP_FIELD_PATHS: usize = 32;
/// Most elements of one list a `[*]` step reads; those past it are skipped unread.
pub const MAX_LIST_ELEMENTS: usize = 1024;
/// Longest name followed (bytes): a Kubernetes object name (DNS subdomain) is at most 253.
pub const MAX_NAME_LEN: usize = 253;

/// One step of a field path: a member of an object, or every element of a list member.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Step {
    /// `name`: the member `name`.
    Field(Box<str>),
    /// `name[*]`: every element of the list in member `name`.
    Each(Box<str>),
}

/// Where an object holds the name of another: dot-separated member names, `[*]` after a
/// member for each element of its list: `spec.secretName`,
/// `spec.template.spec.volumes[*].secret.secretName`. Members on the way that are missing or
/// of another type name nothing; so do values that are not non-empty strings.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldPath {
    text: Box<str>,
    steps: Box<[Step]>,
}

/// Why a field path is refused; the message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPath {
    /// Empty, or longer than [`MAX_PATH_LEN`], or more than [`MAX_PATH_STEPS`] steps.
    #[error(
        "field path {0:?} must have between 1 and {MAX_PATH_STEPS} steps and at most {MAX_PATH_LEN} bytes"
    )]
    Size(String),
    /// A step that is not a member name (letters, digits, `_` and `-`), with `[*]` or not.
    #[error(
        "field path {path:?}: step {step:?} must be a member name (letters, digits, '_' or '-'), optionally followed by [*]"
    )]
    Step {
        /// The path.
        path: String,
        /// The step refused.
        step: String,
    },
}

impl FieldPath {
    /// Parses `text` (`spec.volumes[*].secret.secretName`).
    pub fn parse(text: &str) -> Result<Self, InvalidPath> {
        if text.is_empty() || text.len() > MAX_PATH_LEN {
            return Err(InvalidPath::Size(text.to_owned()));
        }
        let steps = text
            .split('.')
            .map(|part| {
                let (name, each) = match part.strip_suffix("[*]") {
                    Some(name) => (name, true),
                    None => (part, false),
                };
                let ok = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !ok {
                    return Err(InvalidPath::Step {
                        path: text.to_owned(),
                        step: part.to_owned(),
                    });
                }
                Ok(if each {
                    Step::Each(name.into())
                } else {
                    Step::Field(name.into())
                })
            })
            .collect::<Result<Box<[Step]>, _>>()?;
        if steps.len() > MAX_PATH_STEPS {
            return Err(InvalidPath::Size(text.to_owned()));
        }
        Ok(Self {
            text: text.into(),
            steps,
        })
    }

    /// The path as it was given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// [`FieldPath::names_at`] in the object `json`; malformed JSON names nothing.
    pub fn names_in(&self, json: &str, names: &mut Vec<String>, max: usize) -> bool {
        match serde_json::from_str::<&RawValue>(json) {
            Ok(root) => self.names_at(root, names, max),
            Err(_) => false,
        }
    }

    /// Adds to `names` the names at this path in the object `root` (read once by the caller
    /// for every path), until `names` holds `max`; returns whether any were left out for that.
    /// Only the members on the path are decoded; the rest of the object is skipped, and so are
    /// the elements of a list past [`MAX_LIST_ELEMENTS`]. A name is a non-empty string of at
    /// most [`MAX_NAME_LEN`] bytes that could name an object (no `/`, `%` or control
    /// characters, not `.` or `..`); other values name nothing.
    pub fn names_at(&self, root: &RawValue, names: &mut Vec<String>, max: usize) -> bool {
        let mut at: Vec<&RawValue> = vec![root];
        for step in &*self.steps {
            let (name, each) = match step {
                Step::Field(n) => (n, false),
                Step::Each(n) => (n, true),
            };
            let mut next = Vec::new();
            for raw in at {
                let Some(member) = member(raw, name) else {
                    continue;
                };
                if each {
                    elements(member, &mut next);
                } else {
                    next.push(member);
                }
            }
            at = next;
        }
        for raw in at {
            let Ok(name) = serde_json::from_str::<Cow<'_, str>>(raw.get()) else {
                continue;
            };
            if !is_name(&name) || names.iter().any(|n| *n == *name) {
                continue;
            }
            if names.len() >= max {
                return true;
            }
            names.push(name.into_owned());
        }
        false
    }
}

/// Whether `s` could name an object: what a request key can carry.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s != "."
        && s != ".."
        && !s.chars().any(|c| c == '/' || c == '%' || c.is_control())
}

/// Adds the first [`MAX_LIST_ELEMENTS`] elements of the JSON list `raw`, if it is one, to `out`;
/// the rest are skipped undecoded.
fn elements<'a>(raw: &'a RawValue, out: &mut Vec<&'a RawValue>) {
    struct Each<'o, 'a>(&'o mut Vec<&'a RawValue>);
    impl<'de> Visitor<'de> for Each<'_, 'de> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut n = 0;
            while n < MAX_LIST_ELEMENTS {
                match seq.next_element::<&'de RawValue>()? {
                    Some(item) => self.0.push(item),
                    None => return Ok(()),
                }
                n += 1;
            }
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let _ = de.deserialize_seq(Each(out));
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The member `name` of the JSON object `raw`, if it is an object that has one; other members
/// are skipped undecoded.
fn member<'a>(raw: &'a RawValue, name: &str) -> Option<&'a RawValue> {
    struct Find<'n>(&'n str);
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = Option<&'de RawValue>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(hit) = map.next_key_seed(IsKey(self.0))? {
                if hit && found.is_none() {
                    found = Some(map.next_value::<&'de RawValue>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    /// Decodes a member's name only as far as comparing it with the one looked for.
    struct IsKey<'n>(&'n str);
    impl<'de> DeserializeSeed<'de> for IsKey<'_> {
        type Value = bool;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }
    impl Visitor<'_> for IsKey<'_> {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a member name")
        }
        fn visit_str<E>(self, v: &str) -> Result<bool, E> {
            Ok(v == self.0)
        }
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    de.deserialize_map(Find(name)).ok().flatten()
}

/// What the index holds of a target.
#[derive(Debug, Default)]
struct Target {
    /// The objects that name it, by request key.
    referrers: BTreeSet<Arc<str>>,
    /// What the watch last showed of it.
    shown: Shown,
    /// The list epoch the watch last showed it in.
    epoch: u32,
}

/// What the watch last showed of a target.
#[derive(Debug, Default, PartialEq, Eq)]
enum Shown {
    /// Nothing since it was first named: the watch may have shown it before (a dispatcher lists
    /// the named kind before the kind that names it as often as after), so whatever comes
    /// next, its deletion included, is news to the referrers.
    #[default]
    Unknown,
    /// It, at this resourceVersion.
    At(Box<str>),
    /// Missing from a list. A target named while that list ran may have been shown by it
    /// before it was named (and is then not missing), so its deletion is still news.
    Missing,
    /// Its deletion.
    Gone,
}

/// What the index holds of a referrer.
#[derive(Debug)]
struct Referrer {
    targets: Box<[Arc<str>]>,
    /// The epoch of the list or stream that last showed it.
    epoch: u32,
}

/// Bytes one entry takes besides its strings (hash-map slots at their load factor, the set's
/// node share, the boxed slices' headers): an estimate, for the size gauge.
const ENTRY_OVERHEAD: usize = 96;

/// One group's references, both ways (module docs).
#[derive(Debug, Default)]
pub struct References {
    by_referrer: HashMap<Arc<str>, Referrer>,
    by_target: HashMap<Arc<str>, Target>,
    bytes: usize,
}

impl References {
    /// Referrers indexed.
    pub fn len(&self) -> usize {
        self.by_referrer.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_referrer.is_empty()
    }

    /// About the bytes the index holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The referrer `key`, shown at `epoch`, now names `targets` (request keys): replaces what
    /// it named before. No targets forgets it.
    pub fn name(&mut self, key: &str, targets: Vec<String>, epoch: u32) {
        if targets.is_empty() {
            self.forget(key);
            return;
        }
        if let Some(r) = self.by_referrer.get_mut(key)
            && r.targets.len() == targets.len()
            && r.targets.iter().zip(&targets).all(|(a, b)| **a == **b)
        {
            r.epoch = epoch;
            return;
        }
        self.forget(key);
        let referrer: Arc<str> = Arc::from(key);
        let mut kept = Vec::with_capacity(targets.len());
        for t in targets {
            let entry = match self.by_target.get_key_value(t.as_str()) {
                Some((k, _)) => k.clone(),
                None => {
                    self.bytes += t.len() + ENTRY_OVERHEAD;
                    let k: Arc<str> = Arc::from(t);
                    self.by_target.insert(k.clone(), Target::default());
                    k
                }
            };
            if let Some(target) = self.by_target.get_mut(&entry) {
                target.referrers.insert(referrer.clone());
            }
            self.bytes += ENTRY_OVERHEAD / 2;
            kept.push(entry);
        }
        self.bytes += key.len() + ENTRY_OVERHEAD;
        self.by_referrer.insert(
            referrer,
            Referrer {
                targets: kept.into(),
                epoch,
            },
        );
    }

    /// [`References::name`], unless `key` is indexed already: for a list beside the watch's
    /// stream, which may be older than what the stream showed.
    pub fn name_if_absent(&mut self, key: &str, targets: Vec<String>, epoch: u32) {
        if !self.by_referrer.contains_key(key) {
            self.name(key, targets, epoch);
        }
    }

    /// The referrer `key` names nothing any more: deleted, or served elsewhere now.
    pub fn forget(&mut self, key: &str) {
        let Some((referrer, r)) = self.by_referrer.remove_entry(key) else {
            return;
        };
        self.bytes = self
            .bytes
            .saturating_sub(referrer.len() + ENTRY_OVERHEAD + r.targets.len() * ENTRY_OVERHEAD / 2);
        for t in &*r.targets {
            let gone = self.by_target.get_mut(t).is_some_and(|target| {
                target.referrers.remove(&referrer);
                target.referrers.is_empty()
            });
            if gone {
                self.by_target.remove(t);
                self.bytes = self.bytes.saturating_sub(t.len() + ENTRY_OVERHEAD);
            }
        }
        debug_assert!(
            !self.by_referrer.is_empty() || (self.bytes == 0 && self.by_target.is_empty()),
            "the accounting drifted: {} bytes left in an empty index",
            self.bytes
        );
    }

    /// Forgets every referrer `keep` refuses (the keys the ring moved away).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<Arc<str>> = self
            .by_referrer
            .keys()
            .filter(|k| !keep(k))
            .cloned()
            .collect();
        for k in gone {
            self.forget(&k);
        }
    }

    /// The referrers' watch ended its list of `epoch`: forgets the referrers of `belongs` it
    /// did not show (deleted while the watch was away).
    pub fn swept_referrers(&mut self, epoch: u32, belongs: impl Fn(&str) -> bool) {
        let gone: Vec<Arc<str>> = self
            .by_referrer
            .iter()
            .filter(|(k, r)| r.epoch < epoch && belongs(k))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.forget(&k);
        }
    }

    /// The target `key` was shown at `resource_version` by the list or stream of `epoch`, or
    /// deleted: the referrers to reconcile, if it is named and changed since it was last seen
    /// (a target seen for the first time counts as changed, its deletion too: a referrer may
    /// have read it before, and the watch may have shown it before it was named here).
    pub fn target_seen(
        &mut self,
        key: &str,
        resource_version: &str,
        epoch: u32,
        deleted: bool,
    ) -> Vec<Arc<str>> {
        let Some(target) = self.by_target.get_mut(key) else {
            return Vec::new();
        };
        target.epoch = epoch;
        let now = if deleted {
            Shown::Gone
        } else {
            Shown::At(Box::from(resource_version))
        };
        if target.shown == now {
            return Vec::new();
        }
        target.shown = now;
        target.referrers.iter().cloned().collect()
    }

    /// The targets' watch ended its list of `epoch`: the referrers of the targets of `belongs`
    /// it did not show (deleted meanwhile, never there, or shown before they were named here),
    /// once per such target until it is shown or deleted.
    pub fn swept_targets(&mut self, epoch: u32, belongs: impl Fn(&str) -> bool) -> Vec<Arc<str>> {
        let mut tell = BTreeSet::new();
        for (key, target) in &mut self.by_target {
            if target.epoch < epoch && belongs(key) {
                target.epoch = epoch;
                if !matches!(
                    std::mem::replace(&mut target.shown, Shown::Missing),
                    Shown::Missing | Shown::Gone
                ) {
                    tell.extend(target.referrers.iter().cloned());
                }
            }
        }
        tell.into_iter().collect()
    }

    /// The targets `key` names, in the order it names them.
    pub fn targets_of(&self, key: &str) -> Vec<Arc<str>> {
        self.by_referrer
            .get(key)
            .map(|r| r.targets.to_vec())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(path: &str, json: &str) -> Vec<String> {
        let mut out = Vec::new();
        FieldPath::parse(path).expect("a valid path").names_in(
            json,
            &mut out,
            MAX_NAMES_PER_OBJECT,
        );
        out
    }

    #[test]
    fn a_path_reads_a_member_and_every_element_of_a_list() {
        let pod = r#"{"metadata":{"name":"p"},"spec":{"secretName":"tls","volumes":[
            {"name":"a","secret":{"secretName":"s1"}},
            {"name":"b","configMap":{"name":"c1"}},
            {"name":"c","secret":{"secretName":"s2"}},
            {"name":"d","secret":{"secretName":"s1"}}]}}"#;
        assert_eq!(names("spec.secretName", pod), ["tls"]);
        assert_eq!(
            names("spec.volumes[*].secret.secretName", pod),
            ["s1", "s2"],
            "each name once"
        );
        assert_eq!(names("spec.volumes[*].configMap.name", pod), ["c1"]);
        assert!(names("spec.missing.name", pod).is_empty());
        assert!(
            names("spec.volumes.secret", pod).is_empty(),
            "a list read as an object names nothing"
        );
        assert!(
            names("spec.secretName[*]", pod).is_empty(),
            "a string read as a list names nothing"
        );
        assert!(names("spec", pod).is_empty(), "an object is not a name");
        assert!(names("spec.secretName", "{not json").is_empty());
        assert!(names("spec.secretName", r#"{"spec":{"secretName":""}}"#).is_empty());
        assert_eq!(
            names("spec.secretName", r#"{"spec":{"secretName":"a\"b"}}"#),
            ["a\"b"],
            "escaped strings are decoded"
        );
        for not_a_name in [r#""a/b""#, r#""..""#, r#""%2F""#, "7", "null", r#"["a"]"#] {
            let json = format!(r#"{{"spec":{{"secretName":{not_a_name}}}}}"#);
            assert!(names("spec.secretName", &json).is_empty(), "{not_a_name}");
        }
        let long = format!(
            r#"{{"spec":{{"secretName":"{}"}}}}"#,
            "a".repeat(MAX_NAME_LEN + 1)
        );
        assert!(
            names("spec.secretName", &long).is_empty(),
            "longer than a name"
        );
        assert_eq!(
            names(
                "spec.secretName",
                r#"{"spec":{"secretName":"first","secretName":"second"}}"#
            ),
            ["first"],
            "a repeated member counts once, as the API server would have decoded it first"
        );
    }

    #[test]
    fn names_past_the_bound_are_left_out_and_said_so() {
        let list: Vec<String> = (0..10).map(|i| format!(r#"{{"n":"s{i}"}}"#)).collect();
        let json = format!(r#"{{"items":[{}]}}"#, list.join(","));
        let path = FieldPath::parse("items[*].n").unwrap();
        let mut out = Vec::new();
        assert!(path.names_in(&json, &mut out, 4));
        assert_eq!(out, ["s0", "s1", "s2", "s3"]);
        let mut out = Vec::new();
        assert!(!path.names_in(&json, &mut out, 10));
        assert_eq!(out.len(), 10);
        let mut out = vec!["s0".to_owned()];
        assert!(
            !FieldPath::parse("items[*].n").unwrap().names_in(
                r#"{"items":[{"n":"s0"}]}"#,
                &mut out,
                1
            ),
            "a name already there is not one left out"
        );
        // A list longer than the elements read: those past it are not read.
        let long: Vec<String> = (0..MAX_LIST_ELEMENTS + 5)
            .map(|i| format!(r#"{{"n":"s{i}"}}"#))
            .collect();
        let json = format!(r#"{{"items":[{}]}}"#, long.join(","));
        let mut out = Vec::new();
        path.names_in(&json, &mut out, usize::MAX);
        assert_eq!(out.len(), MAX_LIST_ELEMENTS);
    }

    #[test]
    fn malformed_paths_are_refused_with_the_step_at_fault() {
        for bad in [
            "",
            "spec..name",
            "spec.na me",
            "spec.[*]",
            "spec.name[0]",
            ".spec",
        ] {
            assert!(FieldPath::parse(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            FieldPath::parse("spec.na me"),
            Err(InvalidPath::Step { step, .. }) if step == "na me"
        ));
        let long = vec!["a"; MAX_PATH_STEPS + 1].join(".");
        assert!(matches!(FieldPath::parse(&long), Err(InvalidPath::Size(_))));
        assert_eq!(
            FieldPath::parse("spec.tls[*].secretName").unwrap().as_str(),
            "spec.tls[*].secretName"
        );
    }

    #[test]
    fn a_changed_target_tells_each_referrer_once_and_an_unchanged_one_nobody() {
        let mut refs = References::default();
        refs.name("/Pod/ns/a", vec!["/Secret/ns/s".into()], 1);
        refs.name(
            "/Pod/ns/b",
            vec!["/Secret/ns/s".into(), "/Secret/ns/t".into()],
            1,
        );
        let told = |v: Vec<Arc<str>>| v.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        assert_eq!(
            told(refs.target_seen("/Secret/ns/s", "5", 1, false)),
            ["/Pod/ns/a", "/Pod/ns/b"],
            "first seen: a referrer may have read an older one"
        );
        assert!(refs.target_seen("/Secret/ns/s", "5", 2, false).is_empty());
        assert_eq!(
            told(refs.target_seen("/Secret/ns/t", "7", 2, false)),
            ["/Pod/ns/b"]
        );
        assert!(
            refs.target_seen("/Secret/ns/other", "1", 2, false)
                .is_empty(),
            "nobody names it"
        );
        assert_eq!(
            told(refs.target_seen("/Secret/ns/s", "5", 2, true)),
            ["/Pod/ns/a", "/Pod/ns/b"],
            "deleted"
        );
        assert_eq!(
            told(refs.target_seen("/Secret/ns/s", "5", 2, false)),
            ["/Pod/ns/a", "/Pod/ns/b"],
            "created again, even with the same resourceVersion"
        );
    }

    #[test]
    fn a_referrer_that_names_other_targets_or_none_leaves_the_old_ones() {
        let mut refs = References::default();
        refs.name("/Pod/ns/a", vec!["/Secret/ns/s".into()], 1);
        let one = refs.bytes();
        refs.name("/Pod/ns/a", vec!["/Secret/ns/t".into()], 1);
        assert!(refs.target_seen("/Secret/ns/s", "1", 1, false).is_empty());
        assert_eq!(refs.target_seen("/Secret/ns/t", "1", 1, false).len(), 1);
        assert_eq!(refs.bytes(), one, "the same size for one reference");
        refs.name("/Pod/ns/a", Vec::new(), 1);
        assert!(refs.is_empty());
        assert_eq!(refs.bytes(), 0, "nothing held once nothing is named");
        assert!(refs.target_seen("/Secret/ns/t", "2", 1, false).is_empty());
    }

    #[test]
    fn a_relist_tells_the_referrers_of_targets_it_did_not_show_and_forgets_referrers_gone() {
        let mut refs = References::default();
        refs.name("/Pod/ns/a", vec!["/Secret/ns/s".into()], 1);
        refs.name("/Pod/ns/b", vec!["/Secret/ns/t".into()], 1);
        refs.target_seen("/Secret/ns/s", "5", 1, false);
        refs.target_seen("/Secret/ns/t", "6", 1, false);
        // The Secrets' watch lists again (epoch 2): t is shown unchanged, s is gone.
        assert!(refs.target_seen("/Secret/ns/t", "6", 2, false).is_empty());
        let told = refs.swept_targets(2, |k| k.starts_with("/Secret/"));
        assert_eq!(told.len(), 1);
        assert_eq!(&*told[0], "/Pod/ns/a");
        assert!(refs.target_seen("/Secret/ns/t", "6", 3, false).is_empty());
        assert!(
            refs.swept_targets(3, |k| k.starts_with("/Secret/"))
                .is_empty(),
            "a target already known gone is not told again"
        );
        // The Pods' watch lists again (epoch 5): only b is shown.
        refs.name("/Pod/ns/b", vec!["/Secret/ns/t".into()], 5);
        refs.swept_referrers(5, |k| k.starts_with("/Pod/"));
        assert!(refs.targets_of("/Pod/ns/a").is_empty());
        assert_eq!(refs.targets_of("/Pod/ns/b").len(), 1);
        refs.retain(|k| k != "/Pod/ns/b");
        assert!(refs.is_empty());
        assert_eq!(refs.bytes(), 0);
    }

    /// The watch showed the target before anything named it here (a dispatcher listed the
    /// ConfigMaps before the Mirrors that name them): its deletion, the next thing the watch
    /// shows of it, still reconciles the objects that name it. It was swallowed, as if already
    /// known deleted, and a Mirror never heard that its ConfigMap was gone.
    #[test]
    fn the_deletion_of_a_target_named_after_it_was_shown_tells_its_referrers() {
        let mut refs = References::default();
        assert!(
            refs.target_seen("/Secret/ns/s", "5", 1, false).is_empty(),
            "named by nothing yet"
        );
        refs.name("/Pod/ns/a", vec!["/Secret/ns/s".into()], 1);
        let told = refs.target_seen("/Secret/ns/s", "5", 1, true);
        assert_eq!(
            told.iter().map(|k| &**k).collect::<Vec<_>>(),
            ["/Pod/ns/a"],
            "deleted"
        );
        assert!(
            refs.target_seen("/Secret/ns/s", "5", 1, true).is_empty(),
            "a deletion already told is not told again"
        );
        // Shown by a list before it was named, swept as missing at that list's end: its
        // deletion is still told.
        assert!(refs.target_seen("/Secret/ns/u", "7", 4, false).is_empty());
        refs.name("/Pod/ns/c", vec!["/Secret/ns/u".into()], 4);
        let swept = refs.swept_targets(4, |k| k == "/Secret/ns/u");
        assert_eq!(
            swept.iter().map(|k| &**k).collect::<Vec<_>>(),
            ["/Pod/ns/c"]
        );
        let told = refs.target_seen("/Secret/ns/u", "7", 4, true);
        assert_eq!(
            told.iter().map(|k| &**k).collect::<Vec<_>>(),
            ["/Pod/ns/c"],
            "deleted after the sweep"
        );
        // Named, never shown, and missing from the next list: told once.
        refs.name("/Pod/ns/b", vec!["/Secret/ns/t".into()], 1);
        let gone = refs.swept_targets(2, |k| k.starts_with("/Secret/"));
        assert_eq!(gone.iter().map(|k| &**k).collect::<Vec<_>>(), ["/Pod/ns/b"]);
        assert!(
            refs.swept_targets(3, |k| k.starts_with("/Secret/"))
                .is_empty()
        );
    }
}
