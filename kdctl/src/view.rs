//! What kdctl answers, as data: printed as tables for people ([`Render::table`]) or as JSON
//! for scripts (`-o json`, the same fields).

use comfy_table::{Table, presets::NOTHING};
use serde::Serialize;

/// Prints an answer for people.
pub trait Render {
    /// The answer as text, ending with a newline.
    fn table(&self) -> String;
}

/// `kdctl status`: every dispatcher's view.
#[derive(Clone, Debug, Serialize)]
pub struct StatusView {
    /// Each dispatcher asked, by name.
    pub dispatchers: Vec<DispatcherView>,
    /// Each group on each dispatcher that answered.
    pub groups: Vec<GroupView>,
    /// Which replica of each group polls which dispatchers: where the load balancer placed
    /// it, as the sessions the dispatchers hold show it.
    pub placements: Vec<PlacementView>,
    /// Whether every dispatcher answered, serves, and sees the same settled ring.
    pub healthy: bool,
    /// What is not, in words.
    pub problems: Vec<String>,
}

/// One replica of a group in `kdctl status`, and the dispatchers it holds a session with.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlacementView {
    /// The controller group.
    pub group: String,
    /// The replica.
    pub replica: String,
    /// The dispatchers that answered and hold one of its sessions, by name.
    pub dispatchers: Vec<String>,
}

impl PlacementView {
    /// The placements `groups` show: for each group's replica, the dispatchers where it has a
    /// session, sorted.
    pub fn of(groups: &[GroupView]) -> Vec<PlacementView> {
        let mut by: std::collections::BTreeMap<(&str, &str), Vec<String>> = Default::default();
        for g in groups {
            for replica in &g.replicas {
                by.entry((&g.group, replica))
                    .or_default()
                    .push(g.dispatcher.clone());
            }
        }
        by.into_iter()
            .map(|((group, replica), mut dispatchers)| {
                dispatchers.sort();
                PlacementView {
                    group: group.to_owned(),
                    replica: replica.to_owned(),
                    dispatchers,
                }
            })
            .collect()
    }
}

/// One dispatcher in `kdctl status`.
#[derive(Clone, Debug, Serialize)]
pub struct DispatcherView {
    /// Its name.
    pub name: String,
    /// Its address.
    pub address: String,
    /// `serving`, `handover`, `draining`, `drained`, or `unreachable`.
    pub state: String,
    /// Its version (empty when unreachable, or older than 0.1.0).
    pub version: String,
    /// Why it could not be asked, when unreachable.
    pub error: Option<String>,
    /// The ring it sees.
    pub members: Vec<String>,
    /// The ring whose handover completed there.
    pub settled_members: Vec<String>,
    /// Its share of the key-hash space (0 to 1).
    pub slice_share: f64,
    /// Controller groups held.
    pub groups: usize,
    /// Live sessions over its groups.
    pub sessions: u64,
    /// Keys indexed.
    pub keys: u64,
    /// Keys ready for delivery.
    pub ready: u64,
    /// Deliveries in flight.
    pub in_flight: u64,
    /// Keys backing off or waiting for a requeue-after.
    pub delayed: u64,
}

/// A dispatcher's version as the tables show it.
fn version(v: &str) -> String {
    if v.is_empty() {
        "-".to_owned()
    } else {
        v.to_owned()
    }
}

/// `kdctl version`: kdctl's, and each dispatcher's.
#[derive(Clone, Debug, Serialize)]
pub struct VersionView {
    /// kdctl's version.
    pub kdctl: String,
    /// Each dispatcher asked, with its version.
    pub dispatchers: Vec<DispatcherView>,
    /// The versions the dispatchers that answered run, sorted.
    pub versions: Vec<String>,
    /// What is not as it should be (a dispatcher unreachable, more than one version), in words.
    pub problems: Vec<String>,
}

impl Render for VersionView {
    fn table(&self) -> String {
        let mut out = format!("kdctl {}\n\n", self.kdctl);
        out += &table(
            ["DISPATCHER", "ADDRESS", "STATE", "VERSION"],
            self.dispatchers.iter().map(|d| {
                vec![
                    d.name.clone(),
                    d.address.clone(),
                    d.state.clone(),
                    version(&d.version),
                ]
            }),
        );
        out += &problems(&self.problems);
        out
    }
}

/// One group on one dispatcher in `kdctl status`.
#[derive(Clone, Debug, Serialize)]
pub struct GroupView {
    /// The controller group.
    pub group: String,
    /// The dispatcher.
    pub dispatcher: String,
    /// Replicas with a live session there.
    pub replicas: Vec<String>,
    /// Keys indexed.
    pub keys: u64,
    /// Keys ready for delivery (`workqueue_depth`).
    pub ready: u64,
    /// Deliveries in flight.
    pub in_flight: u64,
    /// Keys backing off or waiting for a requeue-after.
    pub delayed: u64,
    /// Of those, the keys backing off after a failure.
    pub backing_off: u64,
    /// Deletions held for a handover.
    pub held_deletions: u64,
    /// The longest a delivery in flight has been out, in seconds.
    pub longest_in_flight_seconds: f64,
}

impl Render for StatusView {
    fn table(&self) -> String {
        let mut out = table(
            [
                "DISPATCHER",
                "ADDRESS",
                "STATE",
                "VERSION",
                "SHARE",
                "GROUPS",
                "SESSIONS",
                "KEYS",
                "READY",
                "IN FLIGHT",
                "DELAYED",
            ],
            self.dispatchers.iter().map(|d| {
                vec![
                    d.name.clone(),
                    d.address.clone(),
                    d.state.clone(),
                    version(&d.version),
                    format!("{:.1}%", d.slice_share * 100.0),
                    d.groups.to_string(),
                    d.sessions.to_string(),
                    d.keys.to_string(),
                    d.ready.to_string(),
                    d.in_flight.to_string(),
                    d.delayed.to_string(),
                ]
            }),
        );
        if !self.groups.is_empty() {
            out.push('\n');
            out += &table(
                [
                    "GROUP",
                    "DISPATCHER",
                    "REPLICAS",
                    "KEYS",
                    "READY",
                    "IN FLIGHT",
                    "DELAYED",
                    "BACKING OFF",
                    "HELD",
                    "LONGEST",
                ],
                self.groups.iter().map(|g| {
                    vec![
                        g.group.clone(),
                        g.dispatcher.clone(),
                        if g.replicas.is_empty() {
                            "-".to_owned()
                        } else {
                            g.replicas.join(",")
                        },
                        g.keys.to_string(),
                        g.ready.to_string(),
                        g.in_flight.to_string(),
                        g.delayed.to_string(),
                        g.backing_off.to_string(),
                        g.held_deletions.to_string(),
                        seconds(g.longest_in_flight_seconds),
                    ]
                }),
            );
        }
        if !self.placements.is_empty() {
            out.push('\n');
            out += &table(
                ["GROUP", "REPLICA", "POLLS"],
                self.placements
                    .iter()
                    .map(|p| vec![p.group.clone(), p.replica.clone(), p.dispatchers.join(",")]),
            );
        }
        out.push('\n');
        if self.healthy {
            let ring = self
                .dispatchers
                .first()
                .map(|d| d.members.join(", "))
                .unwrap_or_default();
            out += &format!("ring: {ring}: every member serves, no handover pending\n");
        }
        out += &problems(&self.problems);
        out
    }
}

/// `kdctl owner`: who owns a key and where it stands.
#[derive(Clone, Debug, Serialize)]
pub struct OwnerView {
    /// The request key.
    pub key: String,
    /// The member that owns it on the ring, as the dispatchers that answered agree; empty when
    /// they disagree (a ring change under way) or none answered.
    pub owner: String,
    /// Each dispatcher's answer.
    pub answers: Vec<KeyAnswer>,
    /// Where the key stands in each group, on each dispatcher that holds it.
    pub places: Vec<KeyPlace>,
}

/// One dispatcher's answer in `kdctl owner`.
#[derive(Clone, Debug, Serialize)]
pub struct KeyAnswer {
    /// The dispatcher.
    pub dispatcher: String,
    /// The owner on its ring.
    pub ring_owner: String,
    /// Whether it hands the key out now.
    pub served: bool,
    /// Where the dispatcher stands: `serving`, `handover`, `draining`, `drained`.
    pub state: String,
    /// Why it could not be asked.
    pub error: Option<String>,
}

/// A key in one group on one dispatcher.
#[derive(Clone, Debug, Serialize)]
pub struct KeyPlace {
    /// The dispatcher.
    pub dispatcher: String,
    /// The controller group.
    pub group: String,
    /// `idle`, `queued`, `in-flight`, `backing-off` or `requeue-after`.
    pub state: String,
    /// Queued: the replica it waits for; in flight: the replica reconciling it.
    pub replica: String,
    /// In flight: seconds out; queued: seconds waiting; backing off or requeued: seconds until
    /// it is delivered again.
    pub wait_seconds: Option<f64>,
    /// Consecutive failures.
    pub failures: u32,
    /// In flight with a change since: delivered once more after the ack.
    pub changed_in_flight: bool,
    /// In flight on a dispatcher the ring moved it away from.
    pub leaving: bool,
    /// Last seen deleted.
    pub deleted: bool,
    /// The last resourceVersion seen.
    pub resource_version: String,
}

impl Render for OwnerView {
    fn table(&self) -> String {
        let mut out = format!("key:   {}\n", self.key);
        let served_by: Vec<&str> = self
            .answers
            .iter()
            .filter(|a| a.served)
            .map(|a| a.dispatcher.as_str())
            .collect();
        out += &match (self.owner.as_str(), served_by.as_slice()) {
            ("", _) => "owner: unknown: the dispatchers disagree (a ring change under way) or none answered\n".to_owned(),
            (owner, [served]) if *served == owner => format!("owner: {owner} (serving it)\n"),
            (owner, _) => match self.answers.iter().find(|a| a.dispatcher == owner) {
                Some(a) if a.state == "draining" || a.state == "drained" => format!(
                    "owner: {owner} ({}: it hands nothing out; the key moves once its Lease is gone)\n",
                    a.state
                ),
                _ => format!(
                    "owner: {owner} (held there: the handover of the key is not complete)\n"
                ),
            },
        };
        for answer in &self.answers {
            if let Some(error) = &answer.error {
                out += &format!("problem: {} did not answer: {error}\n", answer.dispatcher);
            }
        }
        if self.places.is_empty() {
            out += "no group holds the key: no subscription matches it, nothing has happened to it since its owner started, or you may not get the objects its groups watch\n";
            return out;
        }
        out.push('\n');
        out += &table(
            [
                "DISPATCHER",
                "GROUP",
                "STATE",
                "REPLICA",
                "WAIT",
                "FAILURES",
                "RESOURCE VERSION",
                "NOTE",
            ],
            self.places.iter().map(|p| {
                let mut notes = Vec::new();
                if p.changed_in_flight {
                    notes.push("changed since delivered");
                }
                if p.leaving {
                    notes.push("moved away, forgotten here once acked");
                }
                if p.deleted {
                    notes.push("deleted");
                }
                vec![
                    p.dispatcher.clone(),
                    p.group.clone(),
                    p.state.clone(),
                    if p.replica.is_empty() {
                        "-".to_owned()
                    } else {
                        p.replica.clone()
                    },
                    p.wait_seconds.map_or_else(|| "-".to_owned(), seconds),
                    p.failures.to_string(),
                    p.resource_version.clone(),
                    notes.join("; "),
                ]
            }),
        );
        out
    }
}

/// `kdctl drain`: how the drain went.
#[derive(Clone, Debug, Serialize)]
pub struct DrainView {
    /// The dispatcher drained.
    pub dispatcher: String,
    /// Whether everything in flight was acknowledged, so its Lease was released.
    pub clean: bool,
    /// Deliveries in flight when the drain timeout ran out.
    pub in_flight_left: u64,
    /// Seconds the dispatcher took to drain.
    pub drain_seconds: f64,
    /// Seconds until every other member served the ring without it (from the start).
    pub settled_seconds: Option<f64>,
    /// The ring the others settled on.
    pub ring: Vec<String>,
    /// What did not go as it should.
    pub problems: Vec<String>,
}

impl Render for DrainView {
    fn table(&self) -> String {
        let mut out = if self.clean {
            format!(
                "{} drained in {}: nothing left in flight, its Lease released\n",
                self.dispatcher,
                seconds(self.drain_seconds)
            )
        } else {
            format!(
                "{} drained in {} with {} deliveries in flight: its Lease is left to expire, so its keys move once the bound T has passed\n",
                self.dispatcher,
                seconds(self.drain_seconds),
                self.in_flight_left
            )
        };
        if let Some(settled) = self.settled_seconds {
            out += &format!(
                "the others serve every key after {}: ring {}\n",
                seconds(settled),
                self.ring.join(", ")
            );
        }
        out += &problems(&self.problems);
        if self.problems.is_empty() {
            out += &format!(
                "done: {} may be stopped; it rejoins the ring when it starts again, or with kdctl undrain\n",
                self.dispatcher
            );
        }
        out
    }
}

/// `kdctl undrain`: how the rejoin went.
#[derive(Clone, Debug, Serialize)]
pub struct UndrainView {
    /// The dispatcher brought back.
    pub dispatcher: String,
    /// Whether it was drained; false: it was serving, and nothing was done.
    pub rejoining: bool,
    /// Its drain had left deliveries in flight: it hands nothing out until the bound T has
    /// passed.
    pub holds_for_previous: bool,
    /// Seconds until every member, it included, served one ring with it (from the start).
    pub settled_seconds: Option<f64>,
    /// The ring they settled on.
    pub ring: Vec<String>,
    /// What did not go as it should.
    pub problems: Vec<String>,
}

impl Render for UndrainView {
    fn table(&self) -> String {
        if !self.rejoining && self.problems.is_empty() {
            return format!("{} was not drained: nothing to do\n", self.dispatcher);
        }
        let mut out = format!("{} rejoins the ring", self.dispatcher);
        out += if self.holds_for_previous {
            " (its drain left deliveries in flight: it hands nothing out until their replicas report them ended, or the bound T has passed)\n"
        } else {
            "\n"
        };
        if let Some(settled) = self.settled_seconds {
            out += &format!(
                "every dispatcher serves the ring with it after {}: ring {}\n",
                seconds(settled),
                self.ring.join(", ")
            );
        }
        out += &problems(&self.problems);
        if self.problems.is_empty() {
            out += &format!("done: {} serves its keys again\n", self.dispatcher);
        }
        out
    }
}

/// One line per problem, as every view ends.
fn problems(problems: &[String]) -> String {
    problems.iter().map(|p| format!("problem: {p}\n")).collect()
}

/// A table without borders, as kubectl prints.
fn table<const N: usize>(header: [&str; N], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(header);
    for row in rows {
        table.add_row(row);
    }
    let mut text: String = table
        .lines()
        .map(|line| line.trim_end().trim_start_matches(' ').to_owned() + "\n")
        .collect();
    if text.is_empty() {
        text.push('\n');
    }
    text
}

/// Seconds, for people: `850ms`, `12.3s`, `4m10s`.
fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0}ms", s * 1000.0)
    } else if s < 60.0 {
        format!("{s:.1}s")
    } else {
        format!("{}m{:02}s", (s / 60.0).floor(), (s % 60.0).floor())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_read_as_people_write_them() {
        assert_eq!(seconds(0.0123), "12ms");
        assert_eq!(seconds(12.34), "12.3s");
        assert_eq!(seconds(250.0), "4m10s");
    }

    #[test]
    fn a_table_has_a_header_and_aligned_columns() {
        let text = table(
            ["NAME", "KEYS"],
            [
                vec!["dispatcher-0".to_owned(), "5".to_owned()],
                vec!["d1".to_owned(), "12345".to_owned()],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("NAME"), "{text}");
        let column = lines[0].find("KEYS").unwrap();
        assert_eq!(lines[1].find('5'), Some(column), "{text}");
        assert_eq!(lines[2].find("12345"), Some(column), "{text}");
    }
}
