//! Object changes and deletions as each dispatcher's watch makes them events for its groups.

use kube_dispatch_core::{
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
    /// as `Group::apply` does (`GroupEvent::Deleted`).
    pub(super) fn delete_object(&mut self, k: usize, model: &State) {
        let now = self.now();
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
        let key = self.keys[k].clone();
        for (d, p) in self.processes.iter_mut().enumerate() {
            if let Some(p) = p
                && model.dispatchers[d].api
                && let Some(slice) = &p.slice
            {
                for group in &mut p.groups {
                    let key = KeyRef::new(&key);
                    let change = change.clone();
                    group.record(slice, GroupEvent::Deleted { key, change }, now);
                }
            }
        }
    }

    /// An object changes: every dispatcher that reaches the API server sees it on its watch, and
    /// records it in its group's queue by the rules of `FanOut::publish` and `Transit::record`
    /// (`GroupEvent::Exists`; a key owned elsewhere: `GroupEvent::ExistsElsewhere`).
    pub(super) fn change(&mut self, k: usize, model: &State) {
        let now = self.now();
        self.versions[k] += 1;
        if !self.exists[k] {
            // Created again, under a new uid.
            self.exists[k] = true;
            self.generations[k] += 1;
        }
        let object = self.observed(k);
        let key = self.keys[k].clone();
        for (d, p) in self.processes.iter_mut().enumerate() {
            let Some(p) = p else { continue };
            let Some(slice) = &p.slice else { continue };
            if !model.dispatchers[d].api {
                continue;
            }
            let key = KeyRef::new(&key);
            for group in &mut p.groups {
                let (object, epoch) = (object.clone(), 0);
                let elsewhere = slice.owned_elsewhere(key);
                let event = GroupEvent::exists(key, object, (epoch, Origin::Stream), elsewhere);
                group.record(slice, event, now);
            }
        }
    }

    /// An object owned by the object of key `k` changes: every dispatcher that reaches the API
    /// server tells the owner's key as `Transit::record` does (`GroupEvent::OwnedChanged`).
    pub(super) fn owned_change(&mut self, k: usize, model: &State) {
        let now = self.now();
        let key = self.keys[k].clone();
        for (d, p) in self.processes.iter_mut().enumerate() {
            let Some(p) = p else { continue };
            let Some(slice) = &p.slice else { continue };
            if !model.dispatchers[d].api {
                continue;
            }
            let key = KeyRef::new(&key);
            for group in &mut p.groups {
                let origin = Origin::Stream;
                group.record(slice, GroupEvent::OwnedChanged { key, origin }, now);
            }
        }
    }
}
