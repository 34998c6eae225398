//! One timely dataflow's graph, as its worker logged it, and its registration with the service.
//!
//! Timely logs every operator (`Operates`: a worker-unique id, an address, a name), every
//! channel (`Channels`: the scope's address, a source and a target port) and every operator's
//! internal connectivity (`timely/summary/T`, under the time type `T` of the operator's scope).
//! [`DataflowGraph::assemble`] turns those into scopes: an address `[d, 3, 2]` is operator 2 of
//! the scope that is operator 3 of dataflow `d`, whose service scope path is `[3]`. Inside a
//! scope, node 0 is its boundary in timely as in the service. A scope's kind comes from the
//! type its children's summaries were logged under ([`crate::time::scope_kind`]).
//!
//! The shape timely does not log is the number of outputs of an operator: it is taken as one
//! past the highest output port that a channel leaves or that the operator's connectivity
//! reaches. An output nothing is connected to and no input reaches leads nowhere, so leaving it
//! out changes no other location's frontier; updates timely sends for it are dropped (and said
//! once) rather than refused by the service.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::time::{scope_kind, ScopeKind, TimeShape, MAX_SUMMARY};

/// An operator's connectivity as logged: per input, `(output, summaries)` with each summary's
/// coordinates.
pub type Connectivity = Vec<Vec<(usize, Vec<Vec<u64>>)>>;

/// A port: `(node, port)` within a scope.
pub type Port = (usize, usize);

/// A channel within a scope: source port, target port.
pub type Edge = (Port, Port);

/// A channel as logged: the scope's address, source port, target port.
pub type LoggedChannel = (Vec<usize>, Port, Port);

/// What a worker logged about one operator.
#[derive(Clone, Debug)]
pub struct LoggedOperator {
    /// Worker-unique id (for a scope: the identifier its progress events carry).
    pub id: usize,
    /// Address from the dataflow (first element) down to the operator.
    pub addr: Vec<usize>,
    /// The operator's name.
    pub name: String,
}

/// One internal connection of an operator, in the service's terms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    /// Input port.
    pub input: usize,
    /// Output port.
    pub output: usize,
    /// The antichain of summaries, each as coordinates.
    pub summaries: Vec<Vec<u64>>,
}

/// One operator of a scope.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Node {
    /// Index in its scope (from 1; 0 is the scope's boundary).
    pub index: usize,
    /// Timely's name for it.
    pub name: String,
    /// Input ports.
    pub inputs: usize,
    /// Output ports (see the module's documentation).
    pub outputs: usize,
    /// Internal connectivity; `None` for a scope, whose connectivity the service computes.
    pub connections: Option<Vec<Connection>>,
    /// For a scope: its position in [`DataflowGraph::scopes`].
    pub scope: Option<usize>,
}

/// One scope: the dataflow itself or a nested one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Scope {
    /// Timely's identifier of the subgraph: the `identifier` of its progress events.
    pub identifier: usize,
    /// Timely's address of the subgraph (`[d]` for the dataflow).
    pub addr: Vec<usize>,
    /// Position of the parent scope in [`DataflowGraph::scopes`].
    pub parent: Option<usize>,
    /// Root, region or iterative.
    pub kind: ScopeKind,
    /// Coordinates of the scope's time.
    pub arity: usize,
    /// The scope's operators, by index.
    pub nodes: Vec<Node>,
    /// Channels inside the scope, `((node, port), (node, port))`, node 0 being the boundary; a
    /// channel timely created twice is listed twice, as timely counts its messages twice.
    pub edges: Vec<Edge>,
}

impl Scope {
    /// The service's scope path: the address below the dataflow.
    pub fn path(&self) -> &[usize] {
        &self.addr[1..]
    }
}

/// A timely dataflow as the service hosts it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DataflowGraph {
    /// The name it is registered under.
    pub name: String,
    /// Timely's dataflow index (the first element of its operators' addresses).
    pub dataflow: usize,
    /// Workers of the program: each holds one initial capability per operator output.
    pub peers: usize,
    /// Scopes, the dataflow itself first, each after its parent.
    pub scopes: Vec<Scope>,
}

impl DataflowGraph {
    /// Builds the graph of dataflow `root.addr[0]` from what one worker logged, or says why the
    /// service cannot host it.
    ///
    /// `operators` holds every operator of the dataflow and the dataflow itself (`root`);
    /// `summaries` maps an operator's id to the time shape of its scope and its connectivity.
    pub fn assemble(
        name: String,
        peers: usize,
        root: &LoggedOperator,
        operators: &[LoggedOperator],
        channels: &[LoggedChannel],
        summaries: &HashMap<usize, (TimeShape, Connectivity)>,
    ) -> Result<DataflowGraph, String> {
        // Scopes are the addresses that are some operator's parent address, plus the root.
        let by_addr: HashMap<&[usize], &LoggedOperator> =
            operators.iter().chain(Some(root)).map(|op| (&op.addr[..], op)).collect();
        let mut children: BTreeMap<Vec<usize>, Vec<&LoggedOperator>> = BTreeMap::new();
        children.insert(root.addr.clone(), Vec::new());
        for op in operators.iter().filter(|op| op.addr.len() > root.addr.len()) {
            let parent = op.addr[..op.addr.len() - 1].to_vec();
            if !by_addr.contains_key(&parent[..]) {
                return Err(format!("operator {:?} ({}) has no enclosing scope in the log", op.addr, op.name));
            }
            children.entry(parent).or_default().push(op);
        }
        for list in children.values_mut() {
            list.sort_by_key(|op| op.addr[op.addr.len() - 1]);
        }
        // Every operator's summary is logged under its scope's time type; none means a time
        // type the connector registered no logger for.
        let mut shapes: HashMap<&[usize], &TimeShape> = HashMap::new();
        for (addr, list) in &children {
            for op in list {
                let Some((shape, _)) = summaries.get(&op.id) else {
                    return Err(format!(
                        "operator {:?} ({}) logged no connectivity: its scope's time type is not one the connector \
                         maps (unsigned integers and timely::order::Product of them; declare others with \
                         Attach::timestamp)",
                        op.addr, op.name
                    ));
                };
                if let Some(other) = shapes.insert(&addr[..], shape) {
                    if other != shape {
                        return Err(format!("scope {addr:?} logged two time types, {} and {}", other.name, shape.name));
                    }
                }
            }
        }
        let mut graph = DataflowGraph { name, dataflow: root.addr[0], peers, scopes: Vec::new() };
        let Some(root_shape) = shapes.get(&root.addr[..]).copied() else {
            return Err("the dataflow has no operators".to_owned());
        };
        let mut edges: HashMap<&[usize], Vec<Edge>> = HashMap::new();
        for (scope, source, target) in channels {
            edges.entry(&scope[..]).or_default().push((*source, *target));
        }
        graph.add_scope(root, None, root_shape, ScopeKind::Root, &children, &shapes, &edges, summaries)?;
        Ok(graph)
    }

    #[allow(clippy::too_many_arguments)]
    fn add_scope(
        &mut self,
        op: &LoggedOperator,
        parent: Option<usize>,
        shape: &TimeShape,
        kind: ScopeKind,
        children: &BTreeMap<Vec<usize>, Vec<&LoggedOperator>>,
        shapes: &HashMap<&[usize], &TimeShape>,
        edges: &HashMap<&[usize], Vec<Edge>>,
        summaries: &HashMap<usize, (TimeShape, Connectivity)>,
    ) -> Result<usize, String> {
        let position = self.scopes.len();
        let scope_edges = edges.get(&op.addr[..]).cloned().unwrap_or_default();
        self.scopes.push(Scope {
            identifier: op.id,
            addr: op.addr.clone(),
            parent,
            kind,
            arity: shape.arity,
            nodes: Vec::new(),
            edges: scope_edges.clone(),
        });
        let mut nodes = Vec::new();
        for child in children.get(&op.addr).map(Vec::as_slice).unwrap_or_default() {
            let index = child.addr[child.addr.len() - 1];
            let (_, connectivity) = &summaries[&child.id];
            // Outputs: what channels leave, what the connectivity reaches, and for a scope what
            // its inside sends to its boundary.
            let mut outputs = scope_edges.iter().filter(|(s, _)| s.0 == index).map(|(s, _)| s.1 + 1).max().unwrap_or(0);
            outputs = outputs.max(connectivity.iter().flatten().map(|(o, _)| o + 1).max().unwrap_or(0));
            let mut node = Node {
                index,
                name: child.name.clone(),
                inputs: connectivity.len(),
                outputs,
                connections: None,
                scope: None,
            };
            let is_scope = shapes.contains_key(&child.addr[..]) || edges.contains_key(&child.addr[..]);
            if is_scope {
                let Some(inner_shape) = shapes.get(&child.addr[..]) else {
                    return Err(format!(
                        "scope {:?} ({}) holds no operators, so the type of its time is unknown",
                        child.addr, child.name
                    ));
                };
                let inner_kind = scope_kind(shape, inner_shape)
                    .map_err(|e| format!("scope {:?} ({}): {e}", child.addr, child.name))?;
                if let Some(inner) = edges.get(&child.addr[..]) {
                    node.outputs = node
                        .outputs
                        .max(inner.iter().filter(|(_, t)| t.0 == 0).map(|(_, t)| t.1 + 1).max().unwrap_or(0));
                }
                let nested =
                    self.add_scope(child, Some(position), inner_shape, inner_kind, children, shapes, edges, summaries)?;
                node.scope = Some(nested);
            } else {
                let mut connections = Vec::new();
                for (input, reached) in connectivity.iter().enumerate() {
                    for (output, summaries) in reached {
                        if let Some(big) = summaries.iter().flatten().find(|c| **c > MAX_SUMMARY) {
                            return Err(format!(
                                "operator {:?} ({}) has a summary coordinate {big}, beyond the service's {MAX_SUMMARY}",
                                child.addr, child.name
                            ));
                        }
                        connections.push(Connection { input, output: *output, summaries: summaries.clone() });
                    }
                }
                node.connections = Some(connections);
            }
            nodes.push(node);
        }
        self.scopes[position].nodes = nodes;
        Ok(position)
    }

    /// The scope a progress event's `identifier` names, if it is one of this dataflow's.
    pub fn scope_of(&self, identifier: usize) -> Option<usize> {
        self.scopes.iter().position(|s| s.identifier == identifier)
    }

    /// The initial capabilities: every worker holds one at time zero on each output of each
    /// operator that is not a scope (timely's trackers start so; workers only send their `-1`).
    pub fn initial(&self) -> Vec<(usize, usize, usize, Vec<u64>, i64)> {
        let mut out = Vec::new();
        for (position, scope) in self.scopes.iter().enumerate() {
            for node in scope.nodes.iter().filter(|n| n.scope.is_none()) {
                for port in 0..node.outputs {
                    out.push((position, node.index, port, vec![0; scope.arity], self.peers as i64));
                }
            }
        }
        out
    }

    /// The body of `POST /v1/dataflows`.
    ///
    /// ```
    /// # use timely_progress_service::graph::*;
    /// # use timely_progress_service::time::ScopeKind;
    /// let input = Node { index: 1, name: "Input".into(), inputs: 0, outputs: 1, connections: Some(vec![]), scope: None };
    /// let probe = Node { index: 2, name: "Probe".into(), inputs: 1, outputs: 0, connections: Some(vec![]), scope: None };
    /// let root = Scope { identifier: 0, addr: vec![0], parent: None, kind: ScopeKind::Root, arity: 1,
    ///                    nodes: vec![input, probe], edges: vec![((1, 0), (2, 0))] };
    /// let graph = DataflowGraph { name: "demo".into(), dataflow: 0, peers: 4, scopes: vec![root] };
    /// let body = graph.registration();
    /// assert_eq!(body["initial"][0]["delta"], 4);            // one capability per worker
    /// assert_eq!(body["edges"][0]["target"]["node"], 2);
    /// ```
    pub fn registration(&self) -> Value {
        let root = &self.scopes[0];
        let initial: Vec<Value> = self
            .initial()
            .into_iter()
            .map(|(scope, node, port, time, delta)| {
                json!({"location": location(self.scopes[scope].path(), node, port, true), "time": time, "delta": delta})
            })
            .collect();
        json!({
            "name": self.name,
            "timestamp_arity": root.arity,
            "nodes": self.nodes_json(0),
            "edges": edges_json(&root.edges),
            "initial": initial,
        })
    }

    fn nodes_json(&self, position: usize) -> Vec<Value> {
        let mut out = Vec::new();
        for node in &self.scopes[position].nodes {
            let mut value =
                json!({"id": node.index, "name": node.name, "inputs": node.inputs, "outputs": node.outputs});
            if let Some(nested) = node.scope {
                let scope = &self.scopes[nested];
                let kind = if scope.kind == ScopeKind::Iterative { "iterative" } else { "region" };
                value["scope"] =
                    json!({"kind": kind, "nodes": self.nodes_json(nested), "edges": edges_json(&scope.edges)});
            } else {
                let connections = node.connections.as_deref().unwrap_or_default();
                value["connections"] = json!(connections
                    .iter()
                    .map(|c| json!({"input": c.input, "output": c.output, "summaries": c.summaries}))
                    .collect::<Vec<_>>());
            }
            out.push(value);
        }
        out
    }
}

/// A location as the service spells it (`scope` left out at the root).
pub fn location(path: &[usize], node: usize, port: usize, source: bool) -> Value {
    let kind = if source { "source" } else { "target" };
    if path.is_empty() {
        json!({"node": node, "port": port, "kind": kind})
    } else {
        json!({"scope": path, "node": node, "port": port, "kind": kind})
    }
}

fn edges_json(edges: &[Edge]) -> Vec<Value> {
    // The service's graph is a set of edges; timely's multiplicities only matter for counting.
    let unique: BTreeSet<_> = edges.iter().collect();
    unique
        .into_iter()
        .map(|((sn, sp), (tn, tp))| json!({"source": {"node": sn, "port": sp}, "target": {"node": tn, "port": tp}}))
        .collect()
}
