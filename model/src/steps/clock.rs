//! The clock's steps: time passes, a replica's clock lags, a renewal goes unanswered.

use crate::{Protocol, State};

impl Protocol {
    /// [`Action::Tick`].
    pub(crate) fn step_tick(&self, s: &mut State) -> Option<()> {
        if Self::urgent(s) {
            return None;
        }
        self.tick(s, None, None);
        Some(())
    }

    /// [`Action::Lag`].
    pub(crate) fn step_lag(&self, s: &mut State, r: u8) -> Option<()> {
        if Self::urgent(s) {
            return None;
        }
        s.left.drift = s.left.drift.checked_sub(1)?;
        self.tick(s, Some(usize::from(r)), None);
        Some(())
    }

    /// [`Action::TickRenewalUnanswered`].
    pub(crate) fn step_tick_renewal_unanswered(&self, s: &mut State, d: u8) -> Option<()> {
        if Self::urgent(s) {
            return None;
        }
        s.left.lost_renewal_answers = s.left.lost_renewal_answers.checked_sub(1)?;
        self.tick(s, None, Some(usize::from(d)));
        Some(())
    }
}
