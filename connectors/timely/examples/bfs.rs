//! Breadth-first search in a nested iterative scope (`Product<u64, u32>` times): each epoch
//! brings a random graph's edges and a root; inside the loop, `Expand` sends each node reached
//! for the first time to its neighbours, one iteration later (`feedback(Product(0, 1))`). It
//! waits for an epoch's edges (its first input's frontier) before expanding, so its
//! notifications depend on exact frontiers inside the loop.
//!
//! `cargo run --example bfs -- -w 4 --rounds 5 --nodes 2000 --edges 4000 [--name N] [--journal DIR] [--detached]`

#[path = "common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::operator::Operator;
use timely::dataflow::operators::{Capability, Concat, ConnectLoop, Enter, Feedback, Input, Leave, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};
use timely::order::Product;

type Time = Product<u64, u32>;

fn main() {
    let options = Arc::new(common::Options::parse("bfs"));
    let (rounds, nodes, edges) =
        (options.number("rounds", 5), options.number("nodes", 2000), options.number("edges", 4000));
    let args = std::iter::once("bfs".to_owned()).chain(options.timely.clone());
    let started = Instant::now();
    let shared = Arc::clone(&options);
    let guards = timely::execute_from_args(args, move |worker| {
        let attached = shared.attach(worker);
        let (index, peers) = (worker.index() as u64, worker.peers() as u64);
        let mut edge_input = InputHandle::new();
        let mut root_input = InputHandle::new();
        let probe = ProbeHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            let edge_stream = scope.input_from(&mut edge_input);
            let root_stream = scope.input_from(&mut root_input);
            let reached = scope.iterative::<u32, _, _>(|inner| {
                let (handle, cycle) = inner.feedback(Product::new(0, 1));
                let edge_stream = edge_stream.enter(inner);
                let visit = root_stream.enter(inner).concat(cycle);
                let next = edge_stream.binary_frontier(
                    visit,
                    Exchange::new(|e: &(u32, u32)| u64::from(e.0)),
                    Exchange::new(|n: &u32| u64::from(*n)),
                    "Expand",
                    |_, _| {
                        let mut graph: HashMap<u64, HashMap<u32, Vec<u32>>> = HashMap::new();
                        let mut seen: HashMap<u64, HashSet<u32>> = HashMap::new();
                        let mut stash: BTreeMap<Time, (Capability<Time>, Vec<u32>)> = BTreeMap::new();
                        move |(edges, edge_frontier), (visits, visit_frontier), output| {
                            edges.for_each_stamp(|cap, data| {
                                let received: Vec<(u32, u32)> = data.flat_map(|batch| batch.drain(..)).collect();
                                for time in cap.stamp().iter() {
                                    let adjacency = graph.entry(time.outer).or_default();
                                    for (src, dst) in &received {
                                        adjacency.entry(*src).or_default().push(*dst);
                                    }
                                }
                            });
                            visits.for_each_stamp(|cap, data| {
                                let received: Vec<u32> = data.flat_map(|batch| batch.drain(..)).collect();
                                for time in cap.stamp().iter() {
                                    let entry =
                                        stash.entry(*time).or_insert_with(|| (cap.delayed(time, 0), Vec::new()));
                                    entry.1.extend_from_slice(&received);
                                }
                            });
                            let ready: Vec<_> = stash
                                .keys()
                                .filter(|t| !edge_frontier.less_equal(t) && !visit_frontier.less_equal(t))
                                .copied()
                                .collect();
                            for time in ready {
                                let (cap, visited) = stash.remove(&time).expect("ready");
                                let epoch_seen = seen.entry(time.outer).or_default();
                                let adjacency = graph.entry(time.outer).or_default();
                                let mut session = output.session(&cap);
                                for node in visited {
                                    if epoch_seen.insert(node) {
                                        for dst in adjacency.get(&node).into_iter().flatten() {
                                            session.give(*dst);
                                        }
                                    }
                                }
                            }
                        }
                    },
                );
                next.clone().connect_loop(handle);
                next.leave(scope)
            });
            reached.probe_with(&probe);
        });
        let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ index;
        let mut random = move |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % bound) as u32
        };
        for round in 0..rounds {
            for _ in (0..edges).filter(|e| e % peers == index) {
                edge_input.send((random(nodes), random(nodes)));
            }
            if index == 0 {
                root_input.send(random(nodes));
            }
            edge_input.advance_to(round + 1);
            root_input.advance_to(round + 1);
            worker.step_or_park_while(None, || probe.less_than(&(round + 1)));
        }
        edge_input.close();
        root_input.close();
        attached // timely runs the dataflow to its end after this closure returns
    })
    .expect("timely runs");
    options.finish(started, guards.join());
}
