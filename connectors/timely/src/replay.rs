//! The service's frontiers, version by version, against timely's own reachability trackers.
//!
//! [`Replay`] holds one `timely::progress::reachability::Tracker` per scope, built from the
//! registered graph with timely's own `Builder` (so scope summaries are timely's), and wired as
//! timely's `Subgraph` wires them: a scope's inner capabilities reach its parent as the changes
//! of its output frontiers (`pushed_output`, filtered through a `MutableAntichain` per output),
//! and the parent's frontier at the scope's inputs reaches the scope as updates at its
//! boundary's outputs. Raw updates, as workers sent them, enter as timely's subgraph takes
//! them: node 0's outputs are records consumed at the scope node's input in the parent, node
//! 0's inputs records produced at its output. [`check`] applies each batch the service
//! acknowledged, in the service's version order, and compares every location's frontier with
//! what the service published for that version.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use timely::order::PartialOrder;
use timely::progress::frontier::MutableAntichain;
use timely::progress::operate::{Connectivity, PortConnectivityBuilder};
use timely::progress::reachability::{Builder, Tracker};
use timely::progress::{Location, PathSummary, Port, Source, Target, Timestamp};

use crate::graph::{DataflowGraph, Port as GraphPort};
use crate::time::ScopeKind;

/// A time of any arity, product-ordered: what the service holds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Coords(pub Vec<u64>);

impl PartialOrder for Coords {
    fn less_equal(&self, other: &Self) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a <= b)
    }
}

impl Timestamp for Coords {
    type Summary = Step;
    fn minimum() -> Self {
        Coords(Vec::new())
    }
}

/// A summary of any arity; missing coordinates are zero (the default is the identity).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Step(pub Vec<u64>);

impl Step {
    fn at(&self, i: usize) -> u64 {
        self.0.get(i).copied().unwrap_or(0)
    }
    fn width(&self, other: &Step) -> usize {
        self.0.len().max(other.0.len())
    }
}

impl PartialEq for Step {
    fn eq(&self, other: &Self) -> bool {
        (0..self.width(other)).all(|i| self.at(i) == other.at(i))
    }
}

impl Eq for Step {}

impl PartialOrder for Step {
    fn less_equal(&self, other: &Self) -> bool {
        (0..self.width(other)).all(|i| self.at(i) <= other.at(i))
    }
}

impl PathSummary<Coords> for Step {
    fn results_in(&self, time: &Coords) -> Option<Coords> {
        time.0.iter().enumerate().map(|(i, t)| t.checked_add(self.at(i))).collect::<Option<Vec<_>>>().map(Coords)
    }
    fn followed_by(&self, other: &Self) -> Option<Self> {
        (0..self.width(other)).map(|i| self.at(i).checked_add(other.at(i))).collect::<Option<Vec<_>>>().map(Step)
    }
}

/// A location in the service's terms: scope path, node, port, and whether it is an output.
pub type LocKey = (Vec<usize>, usize, usize, bool);

/// One raw update as a worker sent it: scope identifier, node, port, is-output, time, delta.
pub type RawUpdate = (usize, u32, u32, bool, Vec<u64>, i64);

/// Timely's trackers for one dataflow, fed raw updates.
pub struct Replay {
    graph: DataflowGraph,
    trackers: Vec<Tracker<Coords>>,
    output_caps: Vec<Vec<MutableAntichain<Coords>>>,
    edges_from: Vec<HashMap<GraphPort, Vec<GraphPort>>>,
    child_scope: Vec<HashMap<usize, usize>>,
    ports: Vec<HashMap<usize, (usize, usize)>>,
    by_identifier: HashMap<usize, usize>,
    /// What was counted where (initial capabilities and workers' updates, not what the trackers
    /// derive): all zero once a program ends, if every update was counted exactly once.
    ledger: HashMap<(usize, usize, usize, bool, Coords), i64>,
}

impl Replay {
    /// Trackers for `graph`, holding every worker's initial capabilities.
    pub fn new(graph: &DataflowGraph) -> Replay {
        let n = graph.scopes.len();
        let mut trackers: Vec<Option<Tracker<Coords>>> = (0..n).map(|_| None).collect();
        let mut summaries: Vec<Option<Connectivity<Step>>> = (0..n).map(|_| None).collect();
        let mut shape = vec![(0, 0); n];
        for scope in &graph.scopes {
            for node in &scope.nodes {
                if let Some(c) = node.scope {
                    shape[c] = (node.inputs, node.outputs);
                }
            }
        }
        // Children come after their parents in `scopes`: build from the last.
        for s in (0..n).rev() {
            let scope = &graph.scopes[s];
            let mut builder = Builder::<Coords>::new();
            let (inputs, outputs) = shape[s];
            builder.add_node(0, outputs, inputs, vec![Default::default(); outputs]);
            for node in &scope.nodes {
                let connectivity: Connectivity<Step> = match node.scope {
                    Some(c) => {
                        let inner = summaries[c].take().expect("children are built first");
                        let keep = if graph.scopes[c].kind == ScopeKind::Iterative { scope.arity } else { usize::MAX };
                        inner
                            .into_iter()
                            .map(|port| {
                                let mut b = PortConnectivityBuilder::default();
                                for (output, antichain) in port {
                                    for step in antichain.elements() {
                                        b.insert(output, Step(step.0.iter().take(keep).copied().collect()));
                                    }
                                }
                                b.freeze()
                            })
                            .collect()
                    }
                    None => {
                        let mut ports = vec![PortConnectivityBuilder::default(); node.inputs];
                        for c in node.connections.iter().flatten() {
                            for s in &c.summaries {
                                ports[c.input].insert(c.output, Step(s.clone()));
                            }
                        }
                        ports.into_iter().map(PortConnectivityBuilder::freeze).collect()
                    }
                };
                builder.add_node(node.index, node.inputs, node.outputs, connectivity);
            }
            for ((sn, sp), (tn, tp)) in &scope.edges {
                builder.add_edge(Source::new(*sn, *sp), Target::new(*tn, *tp));
            }
            let (tracker, summary) = builder.build(None);
            trackers[s] = Some(tracker);
            summaries[s] = Some(summary);
        }
        let mut replay = Replay {
            trackers: trackers.into_iter().map(|t| t.expect("built")).collect(),
            output_caps: shape.iter().map(|(_, outputs)| vec![MutableAntichain::new(); *outputs]).collect(),
            edges_from: graph
                .scopes
                .iter()
                .map(|scope| {
                    let mut from: HashMap<GraphPort, Vec<GraphPort>> = HashMap::new();
                    for (source, target) in &scope.edges {
                        from.entry(*source).or_default().push(*target);
                    }
                    from
                })
                .collect(),
            child_scope: graph
                .scopes
                .iter()
                .map(|scope| scope.nodes.iter().filter_map(|n| n.scope.map(|c| (n.index, c))).collect())
                .collect(),
            ports: graph
                .scopes
                .iter()
                .map(|scope| scope.nodes.iter().map(|n| (n.index, (n.inputs, n.outputs))).collect())
                .collect(),
            by_identifier: graph.scopes.iter().enumerate().map(|(i, s)| (s.identifier, i)).collect(),
            graph: graph.clone(),
            ledger: HashMap::new(),
        };
        for (scope, node, port, time, delta) in graph.initial() {
            replay.count(scope, node, port, true, Coords(time), delta);
        }
        replay.settle();
        replay
    }

    /// Applies raw updates (one batch, atomically) and settles every tracker.
    pub fn apply(&mut self, updates: &[RawUpdate]) {
        for (identifier, node, port, source, time, delta) in updates {
            let Some(&s) = self.by_identifier.get(identifier) else { continue };
            let (node, port) = (*node as usize, *port as usize);
            if node != 0 {
                let Some(&(inputs, outputs)) = self.ports[s].get(&node) else { continue };
                if (*source && port < outputs) || (!*source && port < inputs) {
                    self.count(s, node, port, *source, Coords(time.clone()), *delta);
                }
            } else if let Some(parent) = self.graph.scopes[s].parent {
                let outer = Coords(time[..self.graph.scopes[parent].arity].to_vec());
                let index = self.index_in_parent(s);
                if *source {
                    // Timely: the subgraph reports these as consumed at its input.
                    self.count(parent, index, port, false, outer, *delta);
                } else {
                    // Timely: the subgraph reports these as produced at its output.
                    self.produce(parent, index, port, outer, *delta);
                }
            }
        }
        self.settle();
    }

    /// Counts a pointstamp update in scope `s`'s tracker and in the ledger.
    fn count(&mut self, s: usize, node: usize, port: usize, source: bool, time: Coords, delta: i64) {
        if source {
            self.trackers[s].update_source(Source::new(node, port), time.clone(), delta);
        } else {
            self.trackers[s].update_target(Target::new(node, port), time.clone(), delta);
        }
        match self.ledger.entry((s, node, port, source, time)) {
            Entry::Occupied(mut entry) => {
                *entry.get_mut() += delta;
                if *entry.get() == 0 {
                    entry.remove();
                }
            }
            Entry::Vacant(entry) => {
                entry.insert(delta);
            }
        }
    }

    /// Pointstamps whose count is not zero, described (at most `limit`).
    pub fn nonzero(&self, limit: usize) -> Vec<String> {
        let mut out: Vec<String> = self
            .ledger
            .iter()
            .take(limit)
            .map(|((s, node, port, source, time), count)| {
                let kind = if *source { "source" } else { "target" };
                format!("{:?} ({node},{port},{kind}) @ {:?}: {count}", self.graph.scopes[*s].path(), time.0)
            })
            .collect();
        out.sort();
        out
    }

    fn index_in_parent(&self, s: usize) -> usize {
        let addr = &self.graph.scopes[s].addr;
        addr[addr.len() - 1]
    }

    fn produce(&mut self, s: usize, node: usize, port: usize, time: Coords, delta: i64) {
        let targets = self.edges_from[s].get(&(node, port)).cloned().unwrap_or_default();
        for (target, target_port) in targets {
            if target != 0 {
                self.count(s, target, target_port, false, time.clone(), delta);
            } else if let Some(parent) = self.graph.scopes[s].parent {
                let outer = Coords(time.0[..self.graph.scopes[parent].arity].to_vec());
                let index = self.index_in_parent(s);
                self.produce(parent, index, target_port, outer, delta);
            }
        }
    }

    /// Propagates until no scope tells another anything new, as repeated `Subgraph` steps do.
    fn settle(&mut self) {
        loop {
            let mut moved = false;
            for s in (0..self.trackers.len()).rev() {
                self.trackers[s].propagate_all();
                if let Some(parent) = self.graph.scopes[s].parent {
                    let (arity, index) = (self.graph.scopes[parent].arity, self.index_in_parent(s));
                    for q in 0..self.output_caps[s].len() {
                        let changes: Vec<(Coords, i64)> = self.trackers[s].pushed_output()[q]
                            .drain()
                            .map(|(t, d)| (Coords(t.0[..arity].to_vec()), d))
                            .collect();
                        let frontier: Vec<(Coords, i64)> = self.output_caps[s][q].update_iter(changes).collect();
                        for (t, d) in frontier {
                            self.trackers[parent].update_source(Source::new(index, q), t, d);
                            moved = true;
                        }
                    }
                }
                let pushed: Vec<((Location, Coords), i64)> = self.trackers[s].pushed().0.drain().collect();
                for ((location, time), diff) in pushed {
                    if let (Port::Target(port), Some(&child)) = (location.port, self.child_scope[s].get(&location.node))
                    {
                        let mut inner = time.0;
                        inner.resize(self.graph.scopes[child].arity, 0);
                        self.trackers[child].update_source(Source::new(0, port), Coords(inner), diff);
                        moved = true;
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Every operator port's frontier (node 0, the boundaries, left out), in the service's terms.
    pub fn frontiers(&self) -> BTreeMap<LocKey, BTreeSet<Vec<u64>>> {
        let mut out = BTreeMap::new();
        for (s, scope) in self.graph.scopes.iter().enumerate() {
            for node in &scope.nodes {
                let state = self.trackers[s].node_state(node.index);
                for (port, info) in state.targets.iter().enumerate() {
                    let f = info.implications.frontier().iter().map(|t| t.0.clone()).collect();
                    out.insert((scope.path().to_vec(), node.index, port, false), f);
                }
                for (port, info) in state.sources.iter().enumerate() {
                    let f = info.implications.frontier().iter().map(|t| t.0.clone()).collect();
                    out.insert((scope.path().to_vec(), node.index, port, true), f);
                }
            }
        }
        out
    }
}

/// Whether frontier `f` is behind or equal to `g`: everything `g` holds back, `f` does too.
pub fn behind_or_equal(f: &BTreeSet<Vec<u64>>, g: &BTreeSet<Vec<u64>>) -> bool {
    g.iter().all(|b| f.iter().any(|a| a.iter().zip(b).all(|(x, y)| x <= y)))
}

/// A service location's key, from its JSON.
pub fn loc_key(location: &Value) -> Option<LocKey> {
    let scope = match location.get("scope") {
        Some(Value::Array(path)) => path.iter().map(|p| p.as_u64().map(|p| p as usize)).collect::<Option<Vec<_>>>()?,
        _ => Vec::new(),
    };
    Some((
        scope,
        location["node"].as_u64()? as usize,
        location["port"].as_u64()? as usize,
        location["kind"].as_str()? == "source",
    ))
}

pub use crate::replay_check::{check, service_batches, CheckReport, Replayed};
