//! Timely's sent progress updates as the service's updates: the boundary rule.
//!
//! A worker sends, per scope, the updates of that scope's own progress channel, in the scope's
//! numbering and time. Timely's own trackers treat node 0 (the scope's boundary) specially
//! (`progress/subgraph.rs`), and so does [`Mapper::map`]:
//!
//! * `(0, source p)`, delta `d`: records counted into the scope at its input `p` (timely sends
//!   `-n` when `n` records enter, beside `+n` at the inner targets). Timely turns this into
//!   `consumed` at the scope's node in the parent; here it is `d` at the scope node's input `p`
//!   in the parent's scope and time, which cancels the `+n` the sender of those records sent
//!   in the parent. The parent never sends that `-n` itself.
//! * `(0, target q)`, delta `d`: records leaving through output `q`. Timely turns this into
//!   `produced` at the scope node's output `q`: `d` at each target of the channels leaving that
//!   output in the parent (again through the parent's boundary if the output leads straight
//!   out of the parent too). Their consumers send the matching `-d` in the parent.
//! * everything else is where timely says it is.
//!
//! What timely derives and never sends is not sent here either: a scope's capabilities as seen
//! from its parent (the scope node's outputs) and the parent's frontier carried into the
//! scope (node 0's outputs inside) are computed by the service from the inner pointstamps, as
//! timely's trackers compute them. So every pointstamp is counted once.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use serde_json::Value;

use crate::graph::{DataflowGraph, Port};
use crate::time::MAX_TIME;

/// Progress updates a worker sent, as timely logged them (`is_send`), many messages flat.
///
/// One update is a scope identifier, node, port, kind and delta, and its time's coordinates
/// in `coords`: capturing costs no allocation per update (the vectors only grow), since this
/// runs on the worker's thread inside timely's logging callback.
#[derive(Clone, Debug, Default)]
pub struct RawSends {
    /// `(identifier, node, port, is_source, delta, arity)` per update, in the order sent.
    pub updates: Vec<(usize, u32, u32, bool, i64, u8)>,
    /// The updates' times, each update's `arity` coordinates after the previous update's.
    pub coords: Vec<u64>,
}

impl RawSends {
    /// Room for about `updates` updates.
    pub fn with_capacity(updates: usize) -> RawSends {
        RawSends { updates: Vec::with_capacity(updates), coords: Vec::with_capacity(updates * 2) }
    }

    /// Appends one update whose time `write` appends to the coordinates.
    #[inline]
    pub fn push(
        &mut self,
        identifier: usize,
        node: u32,
        port: u32,
        source: bool,
        delta: i64,
        write: impl FnOnce(&mut Vec<u64>),
    ) {
        let before = self.coords.len();
        write(&mut self.coords);
        let arity = (self.coords.len() - before) as u8;
        self.updates.push((identifier, node, port, source, delta, arity));
    }

    /// Updates held.
    pub fn len(&self) -> usize {
        self.updates.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.updates.is_empty()
    }

    /// The updates with their times: `(identifier, node, port, is_source, time, delta)`.
    pub fn iter(&self) -> impl Iterator<Item = (usize, u32, u32, bool, &[u64], i64)> {
        let mut offset = 0;
        self.updates.iter().map(move |&(identifier, node, port, source, delta, arity)| {
            let time = &self.coords[offset..offset + arity as usize];
            offset += arity as usize;
            (identifier, node, port, source, time, delta)
        })
    }
}

/// A time as a hash key, inline up to four coordinates (no allocation for the usual times).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimeKey {
    /// Up to four coordinates: how many, and them.
    Short(u8, [u64; 4]),
    /// More.
    Long(Box<[u64]>),
}

impl TimeKey {
    /// The key of a time.
    #[inline]
    pub fn new(time: &[u64]) -> TimeKey {
        if time.len() <= 4 {
            let mut short = [0; 4];
            short[..time.len()].copy_from_slice(time);
            TimeKey::Short(time.len() as u8, short)
        } else {
            TimeKey::Long(time.into())
        }
    }

    /// The time's coordinates.
    pub fn as_slice(&self) -> &[u64] {
        match self {
            TimeKey::Short(n, short) => &short[..*n as usize],
            TimeKey::Long(long) => long,
        }
    }
}

/// A raw update's key, for consolidating many sends into one batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawKey {
    /// The scope's identifier.
    pub identifier: usize,
    /// Node in the scope (0: the boundary).
    pub node: u32,
    /// Port.
    pub port: u32,
    /// Output (`true`) or input.
    pub source: bool,
    /// Time, in the scope's coordinates.
    pub time: TimeKey,
}

/// Consolidated counts: every key's net delta, zero counts removed.
///
/// Hashed with [`FxHasher`] rather than the default SipHash: the keys are the program's own
/// pointstamps, not an adversary's, and consolidating is most of the sender's work.
pub type Counts<K> = HashMap<K, i64, BuildHasherDefault<FxHasher>>;

/// The multiply-and-rotate hash of `rustc-hash` (Firefox's), a few instructions per word.
#[derive(Clone, Copy, Default)]
pub struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// Adds `delta` at `key` into consolidated counts; a count reaching zero is removed.
#[inline]
pub fn add_raw(into: &mut Counts<RawKey>, key: RawKey, delta: i64) {
    match into.entry(key) {
        Entry::Occupied(mut entry) => {
            *entry.get_mut() += delta;
            if *entry.get() == 0 {
                entry.remove();
            }
        }
        Entry::Vacant(entry) => {
            if delta != 0 {
                entry.insert(delta);
            }
        }
    }
}

/// Adds sends' updates into consolidated counts; zero counts are removed.
pub fn consolidate_into(sends: &RawSends, into: &mut Counts<RawKey>) {
    for (identifier, node, port, source, time, delta) in sends.iter() {
        add_raw(into, RawKey { identifier, node, port, source, time: TimeKey::new(time) }, delta);
    }
}

/// A location and time in the service's terms: scope position in the graph, node, port, kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// Position of the scope in [`DataflowGraph::scopes`].
    pub scope: usize,
    /// Node.
    pub node: usize,
    /// Port.
    pub port: usize,
    /// Output (`true`) or input.
    pub source: bool,
    /// Time, in the scope's coordinates.
    pub time: Vec<u64>,
}

struct ScopeIndex {
    parent: Option<usize>,
    index: usize,
    arity: usize,
    outputs: HashMap<usize, usize>,
    inputs: HashMap<usize, usize>,
    edges_from: HashMap<Port, Vec<Port>>,
}

/// Maps raw updates of one dataflow to the service's locations (see the module's documentation).
pub struct Mapper {
    scopes: Vec<ScopeIndex>,
    by_identifier: HashMap<usize, usize>,
    /// Updates dropped because timely sent them for a port the registration does not have.
    pub dropped: u64,
    /// The first such update, described.
    pub first_dropped: Option<String>,
    /// Times sent at [`MAX_TIME`] because they were larger.
    pub clamped: u64,
}

impl Mapper {
    /// The mapper for a registered graph.
    pub fn new(graph: &DataflowGraph) -> Mapper {
        let scopes = graph
            .scopes
            .iter()
            .map(|scope| {
                let mut edges_from: HashMap<Port, Vec<Port>> = HashMap::new();
                for (source, target) in &scope.edges {
                    edges_from.entry(*source).or_default().push(*target);
                }
                ScopeIndex {
                    parent: scope.parent,
                    index: scope.addr[scope.addr.len() - 1],
                    arity: scope.arity,
                    outputs: scope.nodes.iter().map(|n| (n.index, n.outputs)).collect(),
                    inputs: scope.nodes.iter().map(|n| (n.index, n.inputs)).collect(),
                    edges_from,
                }
            })
            .collect();
        let by_identifier = graph.scopes.iter().enumerate().map(|(i, s)| (s.identifier, i)).collect();
        Mapper { scopes, by_identifier, dropped: 0, first_dropped: None, clamped: 0 }
    }

    /// Whether `identifier` is one of this dataflow's scopes.
    pub fn knows(&self, identifier: usize) -> bool {
        self.by_identifier.contains_key(&identifier)
    }

    /// Adds the service's updates for consolidated raw updates into `out` (zero counts removed).
    pub fn map(&mut self, raw: &Counts<RawKey>, out: &mut Counts<ServiceKey>) {
        for (key, delta) in raw {
            let Some(&scope) = self.by_identifier.get(&key.identifier) else { continue };
            let mut time: Vec<u64> = key.time.as_slice().to_vec();
            for c in time.iter_mut().filter(|c| **c > MAX_TIME) {
                *c = MAX_TIME;
                self.clamped += 1;
            }
            let (node, port) = (key.node as usize, key.port as usize);
            if node != 0 {
                let ports = if key.source {
                    self.scopes[scope].outputs.get(&node)
                } else {
                    self.scopes[scope].inputs.get(&node)
                };
                if ports.is_some_and(|n| port < *n) {
                    add(out, ServiceKey { scope, node, port, source: key.source, time }, *delta);
                } else {
                    self.dropped += 1;
                    self.first_dropped.get_or_insert_with(|| {
                        format!("scope identifier {} node {node} {} port {port}", key.identifier, kind(key.source))
                    });
                }
            } else if let Some(parent) = self.scopes[scope].parent {
                let outer = time[..self.scopes[parent].arity].to_vec();
                let index = self.scopes[scope].index;
                if key.source {
                    // Records entering the scope: consumed at the scope node's input.
                    add(out, ServiceKey { scope: parent, node: index, port, source: false, time: outer }, *delta);
                } else {
                    self.produce(parent, index, port, outer, *delta, out);
                }
            }
        }
    }

    /// Records produced at output `port` of node `node` of scope `scope` reach the targets of
    /// its channels; a channel to the scope's boundary carries them on into the parent.
    fn produce(
        &self,
        scope: usize,
        node: usize,
        port: usize,
        time: Vec<u64>,
        delta: i64,
        out: &mut Counts<ServiceKey>,
    ) {
        let Some(targets) = self.scopes[scope].edges_from.get(&(node, port)) else { return };
        for &(target, target_port) in targets {
            if target != 0 {
                add(
                    out,
                    ServiceKey { scope, node: target, port: target_port, source: false, time: time.clone() },
                    delta,
                );
            } else if let Some(parent) = self.scopes[scope].parent {
                let outer = time[..self.scopes[parent].arity].to_vec();
                self.produce(parent, self.scopes[scope].index, target_port, outer, delta, out);
            }
        }
    }
}

fn add(out: &mut Counts<ServiceKey>, key: ServiceKey, delta: i64) {
    match out.entry(key) {
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

fn kind(source: bool) -> &'static str {
    if source {
        "output"
    } else {
        "input"
    }
}

/// Splits consolidated updates into batches of at most `limit` updates that are safe to apply
/// one after another: every positive update before any negative one.
///
/// Applying the increments first can only hold frontiers back (each is at a time some live
/// pointstamp already could-result-in), so no intermediate version is ahead of the state the
/// whole batch leads to. Within each sign, the order is the keys' (deterministic).
pub fn split(updates: Counts<ServiceKey>, limit: usize) -> Vec<Vec<(ServiceKey, i64)>> {
    let mut all: Vec<(ServiceKey, i64)> = updates.into_iter().collect();
    all.sort_by(|a, b| (a.1 < 0, &a.0).cmp(&(b.1 < 0, &b.0)));
    if all.len() <= limit {
        return vec![all];
    }
    all.chunks(limit.max(1)).map(<[_]>::to_vec).collect()
}

/// One batch's body, `{"worker", "seq", "updates"}`, written straight into a string: it is
/// the sender's most frequent allocation otherwise (a JSON value tree per update).
pub fn batch_body(graph: &DataflowGraph, worker: &str, seq: u64, updates: &[(ServiceKey, i64)]) -> String {
    use std::fmt::Write;
    let mut body = String::with_capacity(64 + 80 * updates.len());
    let _ = write!(body, r#"{{"worker":{},"seq":{seq},"updates":["#, Value::from(worker));
    for (i, (key, delta)) in updates.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(r#"{"location":{"#);
        let path = graph.scopes[key.scope].path();
        if !path.is_empty() {
            let _ = write!(body, r#""scope":{path:?},"#);
        }
        let kind = if key.source { "source" } else { "target" };
        let _ = write!(
            body,
            r#""node":{},"port":{},"kind":"{kind}"}},"time":{:?},"delta":{delta}}}"#,
            key.node, key.port, key.time
        );
    }
    body.push_str("]}");
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Node, Scope};
    use crate::time::ScopeKind;

    fn op(index: usize, inputs: usize, outputs: usize) -> Node {
        Node { index, name: format!("op{index}"), inputs, outputs, connections: Some(vec![]), scope: None }
    }

    /// input(1) -> loop scope(2) [ 0 -> inner(1) -> 0 ] -> probe(3), the loop's output also
    /// going to a second consumer (4).
    fn nested() -> DataflowGraph {
        let mut scope =
            Node { index: 2, name: "Iterative".into(), inputs: 1, outputs: 1, connections: None, scope: Some(1) };
        scope.connections = None;
        let root = Scope {
            identifier: 10,
            addr: vec![0],
            parent: None,
            kind: ScopeKind::Root,
            arity: 1,
            nodes: vec![op(1, 0, 1), scope, op(3, 1, 0), op(4, 1, 0)],
            edges: vec![((1, 0), (2, 0)), ((2, 0), (3, 0)), ((2, 0), (4, 0))],
        };
        let inner = Scope {
            identifier: 11,
            addr: vec![0, 2],
            parent: Some(0),
            kind: ScopeKind::Iterative,
            arity: 2,
            nodes: vec![op(1, 1, 1)],
            edges: vec![((0, 0), (1, 0)), ((1, 0), (0, 0))],
        };
        DataflowGraph { name: "t".into(), dataflow: 0, peers: 2, scopes: vec![root, inner] }
    }

    fn raw(identifier: usize, updates: &[(u32, u32, bool, &[u64], i64)]) -> Counts<RawKey> {
        let mut out = Counts::default();
        for (node, port, source, time, delta) in updates {
            let key = RawKey { identifier, node: *node, port: *port, source: *source, time: TimeKey::new(time) };
            *out.entry(key).or_insert(0) += delta;
        }
        out
    }

    #[test]
    fn records_entering_a_scope_are_consumed_at_its_node() {
        let graph = nested();
        let mut mapper = Mapper::new(&graph);
        let mut out = Counts::default();
        // Three records enter at epoch 5: +3 at the inner operator, -3 at the boundary output.
        mapper.map(&raw(11, &[(1, 0, false, &[5, 0], 3), (0, 0, true, &[5, 0], -3)]), &mut out);
        assert_eq!(out[&ServiceKey { scope: 1, node: 1, port: 0, source: false, time: vec![5, 0] }], 3);
        assert_eq!(out[&ServiceKey { scope: 0, node: 2, port: 0, source: false, time: vec![5] }], -3);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn records_leaving_a_scope_arrive_at_every_consumer_in_the_parent() {
        let graph = nested();
        let mut mapper = Mapper::new(&graph);
        let mut out = Counts::default();
        mapper.map(&raw(11, &[(0, 0, false, &[5, 7], 2)]), &mut out);
        assert_eq!(out[&ServiceKey { scope: 0, node: 3, port: 0, source: false, time: vec![5] }], 2);
        assert_eq!(out[&ServiceKey { scope: 0, node: 4, port: 0, source: false, time: vec![5] }], 2);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn unknown_ports_are_dropped_and_counted() {
        let graph = nested();
        let mut mapper = Mapper::new(&graph);
        let mut out = Counts::default();
        mapper.map(&raw(10, &[(1, 1, true, &[0], -1), (1, 0, true, &[u64::MAX], 1)]), &mut out);
        assert_eq!(mapper.dropped, 1);
        assert_eq!(mapper.clamped, 1);
        assert_eq!(out[&ServiceKey { scope: 0, node: 1, port: 0, source: true, time: vec![MAX_TIME] }], 1);
    }

    #[test]
    fn batch_bodies_are_the_services_json() {
        let graph = nested();
        let updates = vec![
            (ServiceKey { scope: 1, node: 1, port: 0, source: false, time: vec![5, 0] }, 3),
            (ServiceKey { scope: 0, node: 1, port: 0, source: true, time: vec![6] }, -1),
        ];
        let body: Value = serde_json::from_str(&batch_body(&graph, "w3", 7, &updates)).expect("JSON");
        let expected = serde_json::json!({"worker": "w3", "seq": 7, "updates": [
            {"location": {"scope": [2], "node": 1, "port": 0, "kind": "target"}, "time": [5, 0], "delta": 3},
            {"location": {"node": 1, "port": 0, "kind": "source"}, "time": [6], "delta": -1}]});
        assert_eq!(body, expected);
    }

    #[test]
    fn splits_put_increments_first() {
        let mut updates = Counts::default();
        for i in 0..10u64 {
            let key = ServiceKey { scope: 0, node: 1, port: 0, source: true, time: vec![i] };
            updates.insert(key, if i % 2 == 0 { 1 } else { -1 });
        }
        let parts = split(updates, 3);
        assert_eq!(parts.len(), 4);
        let signs: Vec<bool> = parts.iter().flatten().map(|(_, d)| *d > 0).collect();
        assert!(signs.windows(2).all(|w| w[0] >= w[1]), "{signs:?}");
    }
}
