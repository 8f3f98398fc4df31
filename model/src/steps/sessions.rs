//! Replicas' and sessions' steps: open, poll, answer, receive, finish, ack, close, report, and
//! the losses, expiries and cancellations between them.

use crate::{
    Closes, DELIVERIES, Key, Message, Protocol, ReplicaSession, Run, Seen, State, Takeover,
    Variant, bit, has, send_ack,
};

impl Protocol {
    /// [`Action::CrashReplica`].
    pub(crate) fn step_crash_replica(&self, s: &mut State, r: u8) -> Option<()> {
        s.left.replica_crashes = s.left.replica_crashes.checked_sub(1)?;
        let rep = &mut s.replicas[usize::from(r)];
        rep.up = false;
        rep.sessions.iter_mut().for_each(|x| *x = None);
        rep.running.iter_mut().for_each(|x| *x = None);
        s.messages
            .retain(|m| !matches!(m, Message::Answer { replica, .. } if *replica == r));
        Some(())
    }

    /// [`Action::RestartReplica`].
    pub(crate) fn step_restart_replica(&self, s: &mut State, r: u8) -> Option<()> {
        s.replicas[usize::from(r)].up = true;
        Some(())
    }

    /// [`Action::Open`].
    pub(crate) fn step_open(&self, s: &mut State, r: u8, d: u8) -> Option<()> {
        let t = self.config.timing;
        let (ri, di) = (usize::from(r), usize::from(d));
        // Session ids: nothing of an earlier session between them counts any more.
        s.messages
            .retain(|m| matches!(m, Message::Report { .. }) || m.between() != (r, d));
        // A new session: the other of the two ids the model alternates. What was reported
        // of the earlier session that had this id was of another session (real ids are
        // never reused).
        s.replicas[ri].generations ^= bit(di);
        let generation = u8::from(has(s.replicas[ri].generations, di));
        let sid = self.sid(ri, di, generation);
        // Not while a dispatcher still waits for a report of the earlier session with that id
        // (one a dispatcher that died listed, waited for by the others or by its own next
        // process): the model's two ids would make the new session stand for it. A real
        // replica opens its new session first and reports the old one on it; here only a
        // report made before the reopen ends that wait early (a report needs no session, and
        // a new session there would be handed nothing meanwhile).
        if s.dispatchers
            .iter()
            .any(|x| x.died[di] > 0 && x.awaiting[di].is_some_and(|a| a & sid != 0))
        {
            return None;
        }
        s.messages
            .retain(|m| !matches!(*m, Message::Report { session, .. } if 1u32 << session == sid));
        for disp in &mut s.dispatchers {
            disp.reported &= !sid;
        }
        for lease in &mut s.leases {
            lease.ended &= !sid;
        }
        let disp = &mut s.dispatchers[di];
        // The replica waits until its closed session has expired here.
        if !disp.up || disp.closed[ri] {
            return None;
        }
        // A replica reopening replaces its old session, whose keys in flight stay held
        // until it would have expired or their delivery runs out, whichever comes first
        // (`GroupQueue::remove_session_holding`): a client that reopens may not have
        // stopped them.
        if let Some(left) = disp.sessions[ri] {
            for key in &mut disp.keys {
                if let Key::InFlight {
                    replica, deadline, ..
                } = key
                    && *replica == r
                {
                    *deadline = (*deadline).min(left);
                }
            }
        }
        disp.sessions[ri] = Some(t.ttl);
        disp.held[ri] = None;
        // Not listed on its Lease yet: handed no key until a write that lists it is
        // answered.
        disp.listed &= !bit(ri);
        disp.generations = (disp.generations & !bit(ri)) | (generation << ri);
        let g = self.group_of(ri);
        if !has(disp.groups, g) {
            // The group's first session here makes it (`GroupTable::open`): its watch's
            // list shows it the objects that exist, and if this dispatcher serves, it
            // asks its peers for the deletions they remember at once.
            disp.groups |= bit(g);
            for e in 0..disp.keys.len() {
                if has(self.of_group(g), e)
                    && has(s.objects, self.object(e))
                    && self.records(disp, di, e)
                {
                    Self::queue(&mut disp.keys[e]);
                }
            }
            if disp.settled.is_some() {
                let peers = Self::remembered(s);
                let disp = &mut s.dispatchers[di];
                self.ask_peers(disp, di, g, &peers);
            }
        }
        s.replicas[ri].sessions[di] = Some(ReplicaSession {
            fence: t.fence,
            polling: false,
        });
        Some(())
    }

    /// [`Action::Poll`].
    pub(crate) fn step_poll(&self, s: &mut State, r: u8, d: u8) -> Option<()> {
        let t = self.config.timing;
        let session = s.replicas[usize::from(r)].sessions[usize::from(d)].as_mut()?;
        session.polling = true;
        s.messages.push(Message::Poll {
            replica: r,
            dispatcher: d,
            countdown: t.fence,
        });
        Some(())
    }

    /// [`Action::Arrive`].
    pub(crate) fn step_arrive(&self, s: &mut State, r: u8, d: u8) -> Option<()> {
        let t = self.config.timing;
        let i = s.messages.iter().position(
            |m| matches!(*m, Message::Poll { replica, dispatcher, .. } if (replica, dispatcher) == (r, d)),
        )?;
        let Message::Poll { countdown, .. } = s.messages.remove(i) else {
            return None;
        };
        let disp = &mut s.dispatchers[usize::from(d)];
        if disp.up && disp.sessions[usize::from(r)].is_some() && !disp.closed[usize::from(r)] {
            disp.sessions[usize::from(r)] = Some(t.ttl);
            disp.held[usize::from(r)] = Some(countdown);
        }
        Some(())
    }

    /// [`Action::Answer`].
    pub(crate) fn step_answer(&self, s: &mut State, r: u8, d: u8, take: u8) -> Option<()> {
        let t = self.config.timing;
        if take & !self.takeable(usize::from(r)) != 0 {
            return None;
        }
        let disp = &mut s.dispatchers[usize::from(d)];
        let countdown = disp.held[usize::from(r)].take()?;
        // A session gone meanwhile takes nothing.
        disp.sessions[usize::from(r)]?;
        disp.sessions[usize::from(r)] = Some(t.ttl);
        let mut deliveries = 0u8;
        for k in 0..disp.keys.len() {
            if !has(take, k) {
                continue;
            }
            let Key::Ready { leaving } = disp.keys[k] else {
                return None;
            };
            // Nothing is handed out while the dispatcher serves nothing, nor to a session
            // its Lease does not list yet.
            disp.settled?;
            if matches!(
                self.config.takeover,
                Takeover::Reports | Takeover::ReportFirst
            ) && !has(disp.listed, r)
            {
                return None;
            }
            let delivery = disp.next_delivery[k];
            disp.next_delivery[k] = (delivery + 1) % DELIVERIES;
            // The earlier object's deletion first, if the name was re-used before it was
            // delivered: the new object goes once it is acknowledged.
            let tomb = has(disp.tomb, k);
            disp.tomb &= !bit(k);
            disp.keys[k] = Key::InFlight {
                replica: r,
                deadline: t.max_reconcile,
                delivery,
                session: u8::from(has(disp.generations, usize::from(r))),
                dirty: tomb,
                leaving,
            };
            deliveries |= delivery << (2 * k);
        }
        s.messages.push(Message::Answer {
            replica: r,
            dispatcher: d,
            keys: take,
            deliveries,
            countdown,
        });
        Some(())
    }

    /// [`Action::Receive`].
    pub(crate) fn step_receive(&self, s: &mut State, r: u8, d: u8) -> Option<()> {
        let t = self.config.timing;
        let i = s.messages.iter().position(
            |m| matches!(*m, Message::Answer { replica, dispatcher, .. } if (replica, dispatcher) == (r, d)),
        )?;
        let Message::Answer {
            keys,
            deliveries,
            countdown,
            ..
        } = s.messages.remove(i)
        else {
            return None;
        };
        let rep = &mut s.replicas[usize::from(r)];
        let Some(session) = rep.sessions[usize::from(d)].as_mut() else {
            s.messages.sort_unstable();
            return Some(());
        };
        if !session.polling {
            s.messages.sort_unstable();
            return Some(());
        }
        session.polling = false;
        let (fence, limit) = match self.config.variant {
            Variant::SendTime => (
                session.fence.max(countdown),
                countdown + (t.limit - t.fence),
            ),
            Variant::ArrivalTime => (t.fence, t.limit),
        };
        session.fence = fence;
        for k in 0..rep.running.len() {
            if !has(keys, k) {
                continue;
            }
            let delivery = (deliveries >> (2 * k)) & 3;
            if rep.running[k].is_some() {
                // Already reconciling it (from another dispatcher): refused at once.
                send_ack(
                    &mut s.messages,
                    r,
                    d,
                    u8::try_from(k).unwrap_or_default(),
                    delivery,
                );
                continue;
            }
            rep.running[k] = Some(Run {
                dispatcher: d,
                delivery,
                deadline: limit,
            });
            s.pending &= !bit(k);
            s.seen |= Seen::Reconciled as u8;
        }
        Some(())
    }

    /// [`Action::Finish`].
    pub(crate) fn step_finish(&self, s: &mut State, r: u8, k: u8) -> Option<()> {
        let run = s.replicas[usize::from(r)].running[usize::from(k)].take()?;
        send_ack(&mut s.messages, r, run.dispatcher, k, run.delivery);
        Some(())
    }

    /// [`Action::AckArrives`].
    pub(crate) fn step_ack_arrives(&self, s: &mut State, r: u8, d: u8, k: u8) -> Option<()> {
        let t = self.config.timing;
        let i = s.messages.iter().position(|m| {
            matches!(*m, Message::Ack { replica, dispatcher, key, .. } if (replica, dispatcher, key) == (r, d, k))
        })?;
        let Message::Ack { delivery, .. } = s.messages.remove(i) else {
            return None;
        };
        let disp = &mut s.dispatchers[usize::from(d)];
        if disp.up && disp.sessions[usize::from(r)].is_some() && !disp.closed[usize::from(r)] {
            disp.sessions[usize::from(r)] = Some(t.ttl);
            let key = &mut disp.keys[usize::from(k)];
            if let Key::InFlight {
                replica,
                delivery: current,
                dirty,
                leaving,
                ..
            } = *key
                && replica == r
                && current == delivery
            {
                // A delivery of a deletion, acknowledged, forgets the key.
                let gone = has(disp.gone, k);
                *key = match (leaving, dirty) {
                    (true, _) => Key::Absent,
                    (false, true) => Key::Ready { leaving: false },
                    (false, false) if gone => Key::Absent,
                    (false, false) => Key::Idle,
                };
            }
        }
        Some(())
    }

    /// [`Action::Lose`].
    pub(crate) fn step_lose(&self, s: &mut State, i: u8) -> Option<()> {
        s.left.lost_messages = s.left.lost_messages.checked_sub(1)?;
        let i = usize::from(i);
        if i >= s.messages.len() {
            return None;
        }
        // A lost poll or answer leaves its replica waiting until its fence.
        s.messages.remove(i);
        Some(())
    }

    /// [`Action::Expire`].
    pub(crate) fn step_expire(&self, s: &mut State, d: u8, r: u8) -> Option<()> {
        let disp = &mut s.dispatchers[usize::from(d)];
        if disp.sessions[usize::from(r)] != Some(0) {
            return None;
        }
        disp.sessions[usize::from(r)] = None;
        disp.held[usize::from(r)] = None;
        disp.closed[usize::from(r)] = false;
        for key in &mut disp.keys {
            if matches!(key, Key::InFlight { replica, .. } if *replica == r) {
                Self::requeue(key);
            }
        }
        Some(())
    }

    /// [`Action::Void`].
    pub(crate) fn step_void(&self, s: &mut State, d: u8, k: u8) -> Option<()> {
        let key = &mut s.dispatchers[usize::from(d)].keys[usize::from(k)];
        if !matches!(key, Key::InFlight { deadline: 0, .. }) {
            return None;
        }
        Self::requeue(key);
        Some(())
    }

    /// [`Action::Close`].
    pub(crate) fn step_close(&self, s: &mut State, r: u8, d: u8) -> Option<()> {
        s.left.closes = s.left.closes.checked_sub(1)?;
        let (ri, di) = (usize::from(r), usize::from(d));
        // The replica forgets the session, though its reconciles from it run on.
        s.replicas[ri].sessions[di].take()?;
        s.messages.retain(|m| {
            !matches!(*m, Message::Poll { replica, dispatcher, .. } if (replica, dispatcher) == (r, d))
        });
        s.messages.push(Message::Close {
            replica: r,
            dispatcher: d,
        });
        Some(())
    }

    /// [`Action::CloseArrives`].
    pub(crate) fn step_close_arrives(&self, s: &mut State, r: u8, d: u8) -> Option<()> {
        let i = s.messages.iter().position(
            |m| matches!(*m, Message::Close { replica, dispatcher } if (replica, dispatcher) == (r, d)),
        )?;
        s.messages.remove(i);
        let (ri, di) = (usize::from(r), usize::from(d));
        let disp = &mut s.dispatchers[di];
        if disp.up && disp.sessions[ri].is_some() && !disp.closed[ri] {
            disp.held[ri] = None;
            match self.config.closes {
                Closes::Hold => disp.closed[ri] = true,
                Closes::Release => {
                    disp.sessions[ri] = None;
                    for key in &mut disp.keys {
                        if matches!(key, Key::InFlight { replica, .. } if *replica == r) {
                            Self::requeue(key);
                        }
                    }
                }
            }
        }
        Some(())
    }

    /// [`Action::Report`].
    pub(crate) fn step_report(&self, s: &mut State, r: u8, d: u8, x: u8) -> Option<()> {
        s.left.reports = s.left.reports.checked_sub(1)?;
        let (ri, di) = (usize::from(r), usize::from(d));
        let rep = &mut s.replicas[ri];
        let runs_there = rep.running.iter().flatten().any(|run| run.dispatcher == d);
        if rep.sessions[di].take().is_some() || runs_there {
            // Fenced on request: what the session handed out is cancelled, and its
            // answers on their way count no more.
            if self.config.takeover != Takeover::ReportFirst {
                for run in &mut rep.running {
                    if run.is_some_and(|x| x.dispatcher == d) {
                        *run = None;
                    }
                }
            }
            s.messages.retain(|m| {
                !matches!(*m, Message::Answer { replica, dispatcher, .. } if (replica, dispatcher) == (r, d))
            });
        }
        let generation = u8::from(has(s.replicas[ri].generations, di));
        let session =
            u8::try_from(self.sid(ri, di, generation).trailing_zeros()).unwrap_or_default();
        s.messages.push(Message::Report {
            replica: r,
            dispatcher: x,
            session,
        });
        Some(())
    }

    /// [`Action::ReportArrives`].
    pub(crate) fn step_report_arrives(&self, s: &mut State, r: u8, x: u8) -> Option<()> {
        let i = s.messages.iter().position(
            |m| matches!(*m, Message::Report { replica, dispatcher, .. } if (replica, dispatcher) == (r, x)),
        )?;
        let Message::Report { session, .. } = s.messages.remove(i) else {
            return None;
        };
        let disp = &mut s.dispatchers[usize::from(x)];
        if disp.up {
            disp.reported |= 1u32 << session;
        }
        Some(())
    }

    /// [`Action::Cancel`].
    pub(crate) fn step_cancel(&self, s: &mut State, r: u8, k: u8) -> Option<()> {
        let run = &mut s.replicas[usize::from(r)].running[usize::from(k)];
        if run.is_none_or(|x| x.deadline != 0) {
            return None;
        }
        *run = None;
        Some(())
    }
}
