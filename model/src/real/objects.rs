//! Object changes and deletions as each dispatcher's watch makes them events for its groups.

use kube_dispatch_core::{
    handover::Slice,
    key::KeyRef,
    queue::{Change, Observed},
    transit::{GroupEvent, Origin},
};
use kube_dispatch_proto::v1::Reason;

use super::Real;
use crate::State;

impl Real {
    /// Every key with its object as a list shows it now (`None` once deleted).
    pub(super) fn objects(&self) -> Vec<(String, Option<Observed>)> {
        (0..self.keys.len())
            .map(|k| {
                (
                    self.keys[k].clone(),
                    self.exists[k].then(|| self.observed(k)),
                )
            })
            .collect()
    }

    /// An object is deleted: every dispatcher that reaches the API server records the deletion
    /// as `Group::record` does (`GroupEvent::Deleted`).
    pub(super) fn delete_object(&mut self, k: usize, model: &State) {
        self.versions[k] += 1;
        self.exists[k] = false;
        let change = Change {
            reason: Reason::Deleted,
            resource_version: self.versions[k].to_string(),
            uid: self.uid(k),
            body: None,
            deleted: true,
            trace: None,
        };
        self.record_on_watches(model, k, |key, _| {
            let change = change.clone();
            GroupEvent::Deleted { key, change }
        });
    }

    /// An object changes: every dispatcher that reaches the API server sees it on its watch, and
    /// records it in its group's queue by the rules of `FanOut::publish` and `Transit::record`
    /// (`GroupEvent::Exists`; a key owned elsewhere: `GroupEvent::ExistsElsewhere`).
    pub(super) fn change(&mut self, k: usize, model: &State) {
        self.versions[k] += 1;
        if !self.exists[k] {
            // Created again, under a new uid.
            self.exists[k] = true;
            self.generations[k] += 1;
        }
        let object = self.observed(k);
        self.record_on_watches(model, k, |key, slice| {
            let (object, epoch) = (object.clone(), 0);
            let elsewhere = slice.owned_elsewhere(key);
            GroupEvent::exists(key, object, (epoch, Origin::Stream), elsewhere)
        });
    }

    /// An object owned by the object of key `k` changes: every dispatcher that reaches the API
    /// server tells the owner's key as `Transit::record` does (`GroupEvent::OwnedChanged`).
    pub(super) fn owned_change(&mut self, k: usize, model: &State) {
        let owners_listed = self.model.config.owners_listed;
        self.record_on_watches(model, k, |key, _| GroupEvent::OwnedChanged {
            key,
            origin: Origin::Stream,
            owners_listed,
        });
    }

    /// Every dispatcher that reaches the API server sees an event of key `k` on its watch:
    /// each of its groups records the event `event` makes of the key on its slice.
    fn record_on_watches(
        &mut self,
        model: &State,
        k: usize,
        mut event: impl for<'a> FnMut(KeyRef<'a>, &Slice) -> GroupEvent<'a>,
    ) {
        let now = self.now();
        let key = self.keys[k].clone();
        let key = KeyRef::new(&key);
        for (d, p) in self.processes.iter_mut().enumerate() {
            if let Some(p) = p
                && model.dispatchers[d].api
                && let Some(slice) = &p.slice
            {
                for group in &mut p.groups {
                    group.record(slice, event(key, slice), now);
                }
            }
        }
    }
}
