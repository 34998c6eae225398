//! Differential dataflow's `iterate` (an iterative scope with `Product<u64, u64>` times and
//! differential's arrangements inside): distances from a root in a random graph, after
//! differential's `bfs` example, then rounds of edge changes, each waited for.
//!
//! `cargo run --example dd_bfs -- -w 4 --rounds 5 --nodes 1000 --edges 2000 --changes 20 [--name N] [--journal DIR] [--detached]`

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Instant;

use differential_dataflow::input::Input;
use differential_dataflow::operators::Iterate;
use differential_dataflow::VecCollection;
use timely::dataflow::operators::probe::Handle;

type Node = u32;

fn main() {
    let options = Arc::new(common::Options::parse("dd_bfs"));
    let rounds = options.number("rounds", 5);
    let (nodes, edges, changes) =
        (options.number("nodes", 1000), options.number("edges", 2000), options.number("changes", 20));
    let args = std::iter::once("dd_bfs".to_owned()).chain(options.timely.clone());
    let started = Instant::now();
    let shared = Arc::clone(&options);
    let guards = timely::execute_from_args(args, move |worker| {
        let attached = shared.attach(worker);
        let index = worker.index() as u64;
        let probe = Handle::new();
        let (mut roots, mut graph) = worker.dataflow::<u64, _, _>(|scope| {
            let (root_input, roots) = scope.new_collection();
            let (edge_input, graph) = scope.new_collection();
            distances(graph, roots).map(|(_, distance)| distance).consolidate().probe_with(&probe);
            (root_input, edge_input)
        });
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut random = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % nodes) as Node
        };
        roots.insert(0);
        roots.close();
        let mut added = Vec::new();
        for e in 0..edges {
            let edge = (random(), random());
            if e % worker.peers() as u64 == index {
                graph.insert(edge);
                added.push(edge);
            }
        }
        graph.advance_to(1);
        graph.flush();
        worker.step_or_park_while(None, || probe.less_than(graph.time()));
        for round in 0..rounds {
            for c in 0..changes {
                let edge = (random(), random());
                if c % worker.peers() as u64 == index {
                    graph.insert(edge);
                    if let Some(old) = added.pop() {
                        graph.remove(old);
                    }
                }
            }
            graph.advance_to(round + 2);
            graph.flush();
            worker.step_or_park_while(None, || probe.less_than(graph.time()));
        }
        graph.close();
        attached // timely runs the dataflow to its end after this closure returns
    })
    .expect("timely runs");
    options.finish(started, guards.join());
}

/// Pairs `(node, distance)` for every node reachable from a root.
fn distances<'scope>(
    edges: VecCollection<'scope, u64, (Node, Node)>,
    roots: VecCollection<'scope, u64, Node>,
) -> VecCollection<'scope, u64, (Node, u32)> {
    let start = roots.map(|node| (node, 0));
    start.clone().iterate(|scope, reached| {
        let start = start.enter(scope);
        let edges = edges.enter(scope);
        reached
            .join_map(edges, |_src, distance, dst| (*dst, distance + 1))
            .concat(start)
            .reduce(|_node, distances, shortest| shortest.push((*distances[0].0, 1)))
    })
}
