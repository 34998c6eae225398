//! The worker's side: timely's log streams in, the dataflow's graph and raw sends out.
//!
//! Everything here runs on the worker's thread, inside timely's logging callbacks, so it does
//! as little as it can: it copies each sent progress message's updates into flat buffers and,
//! when timely flushes its logs (at the end of every `step`), hands them to the background
//! thread through the [`Outbox`]. Graph events are kept until the dataflow's own `Operates`
//! event says it is built; the summaries of its operators are flushed then (they are logged on
//! another stream) and the graph is assembled and handed over, before any progress of it.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use timely::logging::{TimelyEvent, TimelyEventBuilder, TimelyProgressEventBuilder, TimelySummaryEventBuilder};
use timely::logging_core::{Logger, Registry};

use crate::graph::{Connectivity, DataflowGraph, LoggedChannel, LoggedOperator};
use crate::mapping::RawSends;
use crate::outbox::{Message, Outbox};
use crate::stats::Counters;
use crate::time::{ServiceTimestamp, TimeShape};
use crate::Status;

/// The logger registered under a name before ours, if any.
type Previous<E> = Option<Logger<timely::container::CapacityContainerBuilder<Vec<(Duration, E)>>>>;

/// Flushes of the summary loggers, run when a dataflow is built.
pub(crate) type Flushers = Rc<RefCell<Vec<Box<dyn Fn()>>>>;

/// What one worker has logged and not yet handed over.
pub(crate) struct Capture {
    pub(crate) name: String,
    pub(crate) peers: usize,
    operators: Vec<LoggedOperator>,
    channels: Vec<LoggedChannel>,
    summaries: HashMap<usize, (TimeShape, Connectivity)>,
    built: Vec<LoggedOperator>,
    tracked: HashSet<usize>,
    first_dataflow: usize,
    buffer: RawSends,
    registered: HashSet<&'static str>,
    outbox: Arc<Outbox>,
    status: Arc<Status>,
    /// With statistics on: the worker's accumulators, and the log clock's last reading.
    stats: Option<(Counters, Duration)>,
}

impl Capture {
    pub(crate) fn new(
        name: String,
        peers: usize,
        first_dataflow: usize,
        outbox: Arc<Outbox>,
        status: Arc<Status>,
    ) -> Self {
        Capture {
            name,
            peers,
            operators: Vec::new(),
            channels: Vec::new(),
            summaries: HashMap::new(),
            built: Vec::new(),
            tracked: HashSet::new(),
            first_dataflow,
            buffer: RawSends::default(),
            registered: HashSet::new(),
            outbox,
            status,
            stats: None,
        }
    }

    /// Aggregates timely's `Schedule` and `Messages` events too, handed over every `every`.
    pub(crate) fn with_statistics(mut self, every: Duration) -> Self {
        self.stats = Some((Counters::new(every), Duration::ZERO));
        self
    }

    /// Hands the interval's statistics over if it is over (or `last`: the worker is gone).
    fn statistics_due(&mut self, now: Duration, last: bool) {
        if let Some((counters, seen)) = &mut self.stats {
            *seen = now.max(*seen);
            if let Some(activity) = counters.due(*seen, last) {
                if !activity.is_empty() {
                    self.outbox.push(Message::Activity(activity), 0);
                }
            }
        }
    }

    fn event(&mut self, event: &TimelyEvent) {
        match event {
            TimelyEvent::Operates(op) => {
                let logged = LoggedOperator { id: op.id, addr: op.addr.clone(), name: op.name.clone() };
                if op.addr.len() == 1 {
                    self.built.push(logged);
                } else {
                    self.operators.push(logged);
                }
            }
            TimelyEvent::Channels(ch) => self.channels.push((ch.scope_addr.clone(), ch.source, ch.target)),
            _ => {}
        }
    }

    /// Assembles the dataflows built since the last call and hands their graphs over.
    fn assemble(&mut self) {
        for root in std::mem::take(&mut self.built) {
            let d = root.addr[0];
            let mine = |addr: &[usize]| addr.first() == Some(&d);
            let operators: Vec<LoggedOperator> = self.operators.iter().filter(|op| mine(&op.addr)).cloned().collect();
            let channels: Vec<_> = self.channels.iter().filter(|c| mine(&c.0)).cloned().collect();
            let name = if d == self.first_dataflow { self.name.clone() } else { format!("{}/{d}", self.name) };
            if d >= self.first_dataflow {
                match DataflowGraph::assemble(name.clone(), self.peers, &root, &operators, &channels, &self.summaries) {
                    Ok(graph) => {
                        self.tracked.extend(graph.scopes.iter().map(|s| s.identifier));
                        self.outbox.push(Message::Register(Box::new(graph)), 0);
                    }
                    Err(reason) => self.status.refuse(&name, reason),
                }
            }
            // Keep only what later dataflows may still need.
            self.operators.retain(|op| !mine(&op.addr));
            self.channels.retain(|c| !mine(&c.0));
            let ids: HashSet<usize> = operators.iter().map(|op| op.id).collect();
            self.summaries.retain(|id, _| !ids.contains(id));
        }
    }

    fn hand_over(&mut self) {
        let updates = self.buffer.len();
        if updates > 0 {
            let sends = std::mem::replace(&mut self.buffer, RawSends::with_capacity(updates));
            self.outbox.push(Message::Sends(sends), updates);
        }
    }
}

impl Drop for Capture {
    /// The worker is gone (its loggers dropped): hand over the rest and let the sender finish.
    fn drop(&mut self) {
        self.hand_over();
        self.statistics_due(Duration::ZERO, true);
        self.outbox.close();
    }
}

/// Registers the `timely` logger (operators and channels), chaining to one already there.
pub(crate) fn register_structure(registry: &mut Registry, capture: &Rc<RefCell<Capture>>, flushers: &Flushers) {
    let previous = registry.get::<TimelyEventBuilder>("timely");
    let capture = Rc::clone(capture);
    let flushers = Rc::clone(flushers);
    registry.insert::<TimelyEventBuilder, _>("timely", move |time, data| {
        forward(&previous, data);
        let built = {
            let mut c = capture.borrow_mut();
            if let Some(events) = data {
                if let Some((counters, _)) = &mut c.stats {
                    for (at, event) in events.iter() {
                        counters.event(*at, event);
                    }
                }
                for (_, event) in events.iter() {
                    c.event(event);
                }
            }
            c.statistics_due(*time, false);
            !c.built.is_empty()
        };
        if built {
            // The dataflow's operators logged their summaries on other streams, not flushed yet.
            for flush in flushers.borrow().iter() {
                flush();
            }
            capture.borrow_mut().assemble();
        }
    });
}

/// Registers the progress and summary loggers of one timestamp type.
pub(crate) fn register_time<T: ServiceTimestamp>(
    registry: &mut Registry,
    capture: &Rc<RefCell<Capture>>,
    flushers: &Flushers,
) {
    let type_name = std::any::type_name::<T>();
    // Once per type: a second registration would chain to the first and count twice.
    if !capture.borrow_mut().registered.insert(type_name) {
        return;
    }
    let shape = T::shape();

    let name = format!("timely/summary/{type_name}");
    let previous = registry.get::<TimelySummaryEventBuilder<T::Summary>>(&name);
    let summary_capture = Rc::clone(capture);
    registry.insert::<TimelySummaryEventBuilder<T::Summary>, _>(&name, move |_time, data| {
        forward(&previous, data);
        let Some(events) = data else { return };
        let mut c = summary_capture.borrow_mut();
        for (_, event) in events.iter() {
            let connectivity: Connectivity = event
                .summary
                .iter()
                .map(|port| {
                    port.iter_ports()
                        .map(|(output, antichain)| {
                            let summaries = antichain
                                .elements()
                                .iter()
                                .map(|s| {
                                    let mut out = Vec::with_capacity(T::ARITY);
                                    T::summary_coordinates(s, &mut out);
                                    out
                                })
                                .collect();
                            (output, summaries)
                        })
                        .collect()
                })
                .collect();
            c.summaries.insert(event.id, (shape.clone(), connectivity));
        }
    });
    if let Some(logger) = registry.get::<TimelySummaryEventBuilder<T::Summary>>(&name) {
        flushers.borrow_mut().push(Box::new(move || logger.flush()));
    }

    let name = format!("timely/progress/{type_name}");
    let previous = registry.get::<TimelyProgressEventBuilder<T>>(&name);
    let progress_capture = Rc::clone(capture);
    registry.insert::<TimelyProgressEventBuilder<T>, _>(&name, move |_time, data| {
        forward(&previous, data);
        let mut c = progress_capture.borrow_mut();
        let Some(events) = data else {
            c.hand_over();
            return;
        };
        for (_, event) in events.iter() {
            if !event.is_send || !c.tracked.contains(&event.identifier) {
                continue;
            }
            for (list, source) in [(&event.messages, false), (&event.internal, true)] {
                for (node, port, time, delta) in list {
                    c.buffer.push(event.identifier, *node as u32, *port as u32, source, *delta, |out| {
                        time.coordinates(out)
                    });
                }
            }
        }
    });
}

/// Passes events on to the logger that was registered under the same name before ours.
fn forward<E: Clone + 'static>(previous: &Previous<E>, data: &Option<Vec<(Duration, E)>>) {
    if let Some(previous) = previous {
        match data {
            Some(events) => previous.log_many(events.iter().map(|(_, e)| e.clone())),
            None => previous.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use timely::dataflow::operators::vec::{Filter, Map};
    use timely::dataflow::operators::{Concat, ConnectLoop, Enter, Feedback, Input, Leave, Probe};
    use timely::dataflow::InputHandle;
    use timely::order::Product;

    use super::*;
    use crate::mapping::{consolidate_into, Counts, Mapper, RawKey, ServiceKey};
    use crate::time::ScopeKind;

    /// Runs `build` in one worker with the capture installed; what the worker handed over.
    fn captured(
        build: impl FnOnce(&mut timely::worker::Worker) + Send + Sync + 'static,
    ) -> (Vec<Message>, Arc<Status>) {
        let outbox = Arc::new(Outbox::default());
        let status = Arc::new(Status::new(0));
        let (o, s) = (Arc::clone(&outbox), Arc::clone(&status));
        timely::execute_directly(move |worker| {
            let capture = Rc::new(RefCell::new(Capture::new("t".into(), worker.peers(), 0, o, s)));
            let flushers: Flushers = Rc::default();
            {
                let mut registry = worker.log_register().expect("a registry");
                register_time::<u64>(&mut registry, &capture, &flushers);
                register_time::<Product<u64, u32>>(&mut registry, &capture, &flushers);
                // A type declared twice is registered once (else every update would count twice).
                register_time::<u64>(&mut registry, &capture, &flushers);
                register_structure(&mut registry, &capture, &flushers);
            }
            build(worker);
        });
        let (messages, closed) = outbox.take(Some(Instant::now()), Duration::ZERO);
        assert!(closed, "the capture closes the outbox when the worker is gone");
        (messages, status)
    }

    #[test]
    fn a_finished_dataflow_counts_to_zero_with_its_initial_capabilities() {
        let (messages, status) = captured(|worker| {
            let mut input = InputHandle::new();
            worker.dataflow::<u64, _, _>(|scope| {
                let numbers = scope.input_from(&mut input);
                let looped = scope.iterative::<u32, _, _>(|inner| {
                    let (handle, cycle) = inner.feedback(Product::new(0, 1));
                    let step = numbers.enter(inner).concat(cycle).map(|x: u64| x / 2).filter(|x| *x > 0);
                    step.clone().connect_loop(handle);
                    step.leave(scope)
                });
                scope.region(|region| looped.enter(region).map(|x| x + 1).leave(scope)).probe();
            });
            for epoch in 0..3u64 {
                input.send(1 << (epoch + 3));
                input.advance_to(epoch + 1);
                worker.step();
            }
        });
        assert!(status.report().notes.is_empty(), "{:?}", status.report().notes);
        let Some(Message::Register(graph)) = messages.first() else { panic!("the graph comes first") };
        let kinds: Vec<ScopeKind> = graph.scopes.iter().map(|s| s.kind).collect();
        assert_eq!(kinds.len(), 3);
        assert!(kinds.contains(&ScopeKind::Iterative) && kinds.contains(&ScopeKind::Region));
        let iterative = graph.scopes.iter().find(|s| s.kind == ScopeKind::Iterative).expect("a loop");
        assert_eq!((iterative.arity, iterative.path().len()), (2, 1));
        assert!(iterative.nodes.iter().any(|n| n.name == "Feedback"));

        // Every update timely sent, mapped, plus the initial capabilities: nothing left.
        let mut raw: Counts<RawKey> = Counts::default();
        for message in &messages {
            if let Message::Sends(sends) = message {
                consolidate_into(sends, &mut raw);
            }
        }
        assert!(!raw.is_empty());
        let mut net: Counts<ServiceKey> = Counts::default();
        Mapper::new(graph).map(&raw, &mut net);
        for (scope, node, port, time, delta) in graph.initial() {
            let key = ServiceKey { scope, node, port, source: true, time };
            *net.entry(key.clone()).or_insert(0) += delta;
            if net[&key] == 0 {
                net.remove(&key);
            }
        }
        assert!(net.is_empty(), "left over: {net:?}");
    }

    #[test]
    fn a_scope_of_an_unmapped_time_refuses_its_dataflow_only() {
        let (messages, status) = captured(|worker| {
            worker.dataflow::<u64, _, _>(|scope| {
                let (_input, numbers) = scope.new_input::<Vec<u64>>();
                // Timely orders tuples lexicographically: no product order expresses that.
                scope
                    .scoped::<(u64, u32), _, _>("Lexicographic", |inner| {
                        numbers.enter(inner).map(|x| x + 1).leave(scope)
                    })
                    .probe();
            });
            worker.dataflow::<u64, _, _>(|scope| {
                let (_input, numbers) = scope.new_input::<Vec<u64>>();
                numbers.probe();
            });
        });
        let notes = status.report().notes;
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("dataflow t is not tracked") && notes[0].contains("logged no connectivity"),
            "{notes:?}"
        );
        let registered: Vec<&str> = messages
            .iter()
            .filter_map(|m| if let Message::Register(g) = m { Some(g.name.as_str()) } else { None })
            .collect();
        assert_eq!(registered, ["t/1"]);
    }
}
