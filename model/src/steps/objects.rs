//! The objects' steps: a change, a change of an owned object, a deletion.

use crate::{Key, Protocol, State, bit, has};

impl Protocol {
    /// [`Action::Change`].
    pub(crate) fn step_change(&self, s: &mut State, k: u8) -> Option<()> {
        s.left.changes = s.left.changes.checked_sub(1)?;
        // A deleted object is created again under its name (a new uid).
        let created = !has(s.objects, k);
        let entries = self.entries_of(usize::from(k));
        s.objects |= bit(k);
        s.pending |= entries;
        for (d, disp) in s.dispatchers.iter_mut().enumerate() {
            if !disp.up {
                continue;
            }
            let entries = entries & self.present(disp);
            if !disp.api {
                disp.stale |= entries;
                continue;
            }
            for e in (0..self.entries()).filter(|e| has(entries, *e)) {
                self.exists(disp, d, e, created);
            }
        }
        Some(())
    }

    /// [`Action::OwnedChange`].
    pub(crate) fn step_owned_change(&self, s: &mut State, k: u8) -> Option<()> {
        s.left.owned_changes = s.left.owned_changes.checked_sub(1)?;
        let entries = self.entries_of(usize::from(k));
        // Where the group lists the owners itself, the change of an owned object whose owner
        // does not exist asks for no reconcile: nothing shows the owner.
        if !self.config.owners_listed || has(s.objects, k) {
            s.pending |= entries;
        }
        for (d, disp) in s.dispatchers.iter_mut().enumerate() {
            if !disp.up {
                continue;
            }
            let entries = entries & self.present(disp);
            if !disp.api {
                disp.stale |= entries;
                continue;
            }
            for k in (0..self.entries()).filter(|e| has(entries, *e)) {
                // Left to the owners' list: a served key whose object it does not know yet.
                let unknown = disp.keys[k] == Key::Absent || has(disp.objectless, k);
                if self.config.owners_listed && self.serves(disp, d, k) && unknown {
                    continue;
                }
                if self.records(disp, d, k) {
                    // `GroupEvent::OwnedChanged`: the key's own object is not touched.
                    if disp.keys[k] == Key::Absent {
                        disp.nameless |= bit(k);
                        disp.objectless |= bit(k);
                    }
                    Self::queue(&mut disp.keys[k]);
                }
            }
        }
        Some(())
    }

    /// [`Action::Delete`].
    pub(crate) fn step_delete(&self, s: &mut State, k: u8) -> Option<()> {
        if !has(s.objects, k) {
            return None;
        }
        s.left.deletions = s.left.deletions.checked_sub(1)?;
        let entries = self.entries_of(usize::from(k));
        s.objects &= !bit(k);
        s.pending |= entries;
        for (d, disp) in s.dispatchers.iter_mut().enumerate() {
            if !disp.up {
                continue;
            }
            let entries = entries & self.present(disp);
            if !disp.api {
                disp.stale |= entries;
                continue;
            }
            for e in (0..self.entries()).filter(|e| has(entries, *e)) {
                self.deleted(disp, d, e, true);
            }
        }
        Some(())
    }
}
