//! Why slow: per operator, the time timely spent in it; per channel, the messages and records
//! sent on it; aggregated on the worker, sent as one small body per interval and dataflow.
//!
//! Opt-in ([`crate::Attach::statistics`]). The connector registers the `timely` log stream
//! anyway (for `Operates` and `Channels`), so timely already builds the `Schedule` and
//! `Messages` events it reads here; with statistics on, each of them costs one add into a
//! vector indexed by the operator's or channel's worker-unique id, and every interval the
//! non-zero entries are handed to the sender as one [`Activity`] message. No event is sent on
//! its own.
//!
//! Busy time is from each `Schedule` start to its stop, as timely's log clock reads them: a
//! scope's time includes its operators', and the dataflow's (address `[d]`) is the whole time
//! the worker spent in it. Records are counted where they are sent (`is_send`), once per message
//! whatever the number of workers it goes to, so the counts of a channel summed over the
//! workers are the records its source sent.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use timely::logging::{StartStop, TimelyEvent};

use crate::client::{Answer, Client};
use crate::graph::Port;
use crate::sender::{Endpoint, Tracked};
use crate::{Settings, Status};

/// An operator's place in its dataflow: the service's scope path and node.
type OperatorKey = (Vec<usize>, usize);
/// A channel's place: the scope path, source port and target port.
type ChannelKey = (Vec<usize>, Port, Port);

/// One dataflow's statistics over some interval(s), summed.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct DataflowActivity {
    /// Seconds of the worker's time covered (summed over merged intervals).
    pub(crate) seconds: f64,
    /// Nanoseconds the worker spent in the dataflow as a whole.
    pub(crate) busy_ns: u64,
    /// Per operator: busy nanoseconds and schedules.
    pub(crate) operators: BTreeMap<OperatorKey, (u64, u64)>,
    /// Per channel: messages and records sent.
    pub(crate) channels: BTreeMap<ChannelKey, (u64, i64)>,
}

impl DataflowActivity {
    /// Adds `other` (a later interval) into this one.
    pub(crate) fn merge(&mut self, other: DataflowActivity) {
        self.seconds += other.seconds;
        self.busy_ns += other.busy_ns;
        for (key, (busy, schedules)) in other.operators {
            let entry = self.operators.entry(key).or_default();
            entry.0 += busy;
            entry.1 += schedules;
        }
        for (key, (messages, records)) in other.channels {
            let entry = self.channels.entry(key).or_default();
            entry.0 += messages;
            entry.1 += records;
        }
    }

    /// The body of `POST /v1/dataflows/{id}/stats` for worker `worker`.
    pub(crate) fn body(&self, worker: &str) -> Value {
        let operators: Vec<Value> = self
            .operators
            .iter()
            .map(|((scope, node), (busy, schedules))| {
                json!({"scope": scope, "node": node, "busy_ns": busy, "schedules": schedules})
            })
            .collect();
        let channels: Vec<Value> = self
            .channels
            .iter()
            .map(|((scope, source, target), (messages, records))| {
                json!({"scope": scope, "source": [source.0, source.1], "target": [target.0, target.1],
                       "messages": messages, "records": records})
            })
            .collect();
        json!({"worker": worker, "seconds": self.seconds, "busy_ns": self.busy_ns,
               "operators": operators, "channels": channels})
    }
}

/// One interval's statistics of every dataflow of a worker that did something, by timely's
/// dataflow index.
pub(crate) type Activity = BTreeMap<usize, DataflowActivity>;

/// The worker's accumulators, fed by the `timely` log stream.
pub(crate) struct Counters {
    every: Duration,
    since: Option<Duration>,
    /// By operator id: its address, when it started (if running), busy ns, schedules.
    operators: Vec<Option<Vec<usize>>>,
    started: Vec<Option<Duration>>,
    busy: Vec<u64>,
    schedules: Vec<u64>,
    /// By channel id: its scope's address and ports, messages, records.
    channels: Vec<Option<(Vec<usize>, Port, Port)>>,
    messages: Vec<u64>,
    records: Vec<i64>,
}

fn slot<T: Default + Clone>(v: &mut Vec<T>, index: usize) -> &mut T {
    if index >= v.len() {
        v.resize(index + 1, T::default());
    }
    &mut v[index]
}

impl Counters {
    /// Accumulators handing over an [`Activity`] at most every `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Counters {
            every,
            since: None,
            operators: Vec::new(),
            started: Vec::new(),
            busy: Vec::new(),
            schedules: Vec::new(),
            channels: Vec::new(),
            messages: Vec::new(),
            records: Vec::new(),
        }
    }

    /// Counts one event of the `timely` stream, logged at `at`.
    pub(crate) fn event(&mut self, at: Duration, event: &TimelyEvent) {
        match event {
            TimelyEvent::Schedule(schedule) => match schedule.start_stop {
                StartStop::Start => *slot(&mut self.started, schedule.id) = Some(at),
                StartStop::Stop => {
                    if let Some(begun) = slot(&mut self.started, schedule.id).take() {
                        *slot(&mut self.busy, schedule.id) += at.saturating_sub(begun).as_nanos() as u64;
                        *slot(&mut self.schedules, schedule.id) += 1;
                    }
                }
            },
            TimelyEvent::Messages(message) if message.is_send => {
                *slot(&mut self.messages, message.channel) += 1;
                *slot(&mut self.records, message.channel) += message.record_count;
            }
            TimelyEvent::Operates(op) => *slot(&mut self.operators, op.id) = Some(op.addr.clone()),
            TimelyEvent::Channels(ch) => {
                *slot(&mut self.channels, ch.id) = Some((ch.scope_addr.clone(), ch.source, ch.target))
            }
            _ => {}
        }
    }

    /// The interval's statistics if `now` ends it (at least `every` since the last), or if
    /// `last` (the worker is gone); the accumulators start again from zero.
    pub(crate) fn due(&mut self, now: Duration, last: bool) -> Option<Activity> {
        let since = *self.since.get_or_insert(Duration::ZERO);
        let seconds = now.saturating_sub(since);
        if seconds < self.every && !last {
            return None;
        }
        self.since = Some(now);
        let mut activity = Activity::new();
        for (id, addr) in self.operators.iter().enumerate() {
            let Some(addr) = addr else { continue };
            let (busy, schedules) = (self.busy.get(id).copied().unwrap_or(0), self.schedules.get(id).copied());
            let schedules = schedules.unwrap_or(0);
            if schedules == 0 {
                continue;
            }
            let entry = activity.entry(addr[0]).or_default();
            if addr.len() == 1 {
                entry.busy_ns += busy;
            } else {
                let key = (addr[1..addr.len() - 1].to_vec(), addr[addr.len() - 1]);
                let counted = entry.operators.entry(key).or_default();
                counted.0 += busy;
                counted.1 += schedules;
            }
        }
        for (id, channel) in self.channels.iter().enumerate() {
            let Some((scope, source, target)) = channel else { continue };
            let messages = self.messages.get(id).copied().unwrap_or(0);
            if messages == 0 || scope.is_empty() {
                continue;
            }
            let entry = activity.entry(scope[0]).or_default();
            let counted = entry.channels.entry((scope[1..].to_vec(), *source, *target)).or_default();
            counted.0 += messages;
            counted.1 += self.records[id];
        }
        for entry in activity.values_mut() {
            entry.seconds = seconds.as_secs_f64();
        }
        self.busy.iter_mut().for_each(|x| *x = 0);
        self.schedules.iter_mut().for_each(|x| *x = 0);
        self.messages.iter_mut().for_each(|x| *x = 0);
        self.records.iter_mut().for_each(|x| *x = 0);
        Some(activity)
    }
}

/// Posts a dataflow's statistics not yet acknowledged, once its endpoint is known: one request,
/// whatever the intervals merged meanwhile. A failed request keeps them for the next interval
/// (counted at most once unless an acknowledgement is lost); a refusal (an older service
/// without the route, say) is said once and ends the dataflow's statistics, never its progress.
pub(crate) fn post_activity(t: &mut Tracked, client: &Client, settings: &Settings, status: &Status) {
    let Endpoint::Ready { id, token } = &t.endpoint else { return };
    let Some(activity) = &t.activity else { return };
    let body = activity.body(&format!("w{}", settings.worker)).to_string();
    let answer = if settings.offline {
        Answer::Ok(Value::Null)
    } else {
        client.post_text(&format!("/v1/dataflows/{id}/stats"), token, &body)
    };
    match answer {
        Answer::Ok(_) => {
            t.activity = None;
            status.statistics_delivered(&t.graph.name);
        }
        Answer::Retry(_) => {}
        Answer::Refused(code, body) => {
            t.activity = None;
            t.activity_refused = true;
            status.note(format!("{}: statistics refused with HTTP {code}: {body}; progress goes on", t.graph.name));
        }
    }
}

#[cfg(test)]
mod tests {
    use timely::logging::{ChannelsEvent, MessagesEvent, OperatesEvent, ScheduleEvent};

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn busy_time_and_records_are_summed_per_interval_and_reset() {
        let mut counters = Counters::new(ms(1000));
        let operates =
            |id: usize, addr: Vec<usize>| TimelyEvent::Operates(OperatesEvent { id, addr, name: format!("op{id}") });
        counters.event(ms(0), &operates(1, vec![0, 1]));
        counters.event(ms(0), &operates(2, vec![0, 2]));
        counters.event(ms(0), &operates(0, vec![0]));
        counters.event(
            ms(0),
            &TimelyEvent::Channels(ChannelsEvent {
                id: 5,
                scope_addr: vec![0],
                source: (1, 0),
                target: (2, 0),
                typ: String::new(),
            }),
        );
        let send = |records: i64, is_send: bool| {
            TimelyEvent::Messages(MessagesEvent {
                is_send,
                channel: 5,
                source: 0,
                target: 1,
                seq_no: 0,
                record_count: records,
            })
        };
        counters.event(ms(10), &TimelyEvent::Schedule(ScheduleEvent::start(0)));
        counters.event(ms(10), &TimelyEvent::Schedule(ScheduleEvent::start(2)));
        counters.event(ms(11), &send(7, true));
        counters.event(ms(11), &send(7, false)); // a receipt: not counted again
        counters.event(ms(40), &TimelyEvent::Schedule(ScheduleEvent::stop(2)));
        counters.event(ms(50), &TimelyEvent::Schedule(ScheduleEvent::stop(0)));
        assert_eq!(counters.due(ms(500), false), None, "not a whole interval yet");
        let activity = counters.due(ms(1000), false).expect("an interval passed");
        let d = &activity[&0];
        assert_eq!((d.seconds, d.busy_ns), (1.0, 40_000_000));
        assert_eq!(d.operators.len(), 1, "operator 1 never ran: {d:?}");
        assert_eq!(d.operators[&(vec![], 2)], (30_000_000, 1));
        assert_eq!(d.channels[&(vec![], (1, 0), (2, 0))], (1, 7));
        let body = d.body("w3");
        assert_eq!(body["worker"], "w3");
        assert_eq!(body["channels"][0]["records"], 7);
        // The next interval starts from zero; the worker's end hands over what is left.
        counters.event(ms(1100), &send(2, true));
        let last = counters.due(ms(1200), true).expect("the last interval");
        assert_eq!(last[&0].channels[&(vec![], (1, 0), (2, 0))], (1, 2));
        assert!(last[&0].operators.is_empty());
        let mut merged = d.clone();
        merged.merge(last[&0].clone());
        assert_eq!(merged.channels[&(vec![], (1, 0), (2, 0))], (2, 9));
        assert!((merged.seconds - 1.2).abs() < 1e-9);
    }
}
