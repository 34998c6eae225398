//! A loop with feedback at the root, after timely's `loopdemo`: numbers go around
//! `concat -> region(step, exchange) -> filter -> feedback(+1)` until they reach 1, so each
//! epoch's records spread over later times and epochs overlap in the loop. The step runs in a
//! region (a nested scope with the root's time).
//!
//! `cargo run --example collatz -- -w 4 --rounds 20 --records 1000 [--name N] [--journal DIR] [--detached]`

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Instant;

use timely::dataflow::operators::vec::{Filter, Map};
use timely::dataflow::operators::{Concat, ConnectLoop, Enter, Exchange, Feedback, Input, Leave, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};

fn main() {
    let options = Arc::new(common::Options::parse("collatz"));
    let (rounds, records) = (options.number("rounds", 20), options.number("records", 1000));
    let args = std::iter::once("collatz".to_owned()).chain(options.timely.clone());
    let started = Instant::now();
    let shared = Arc::clone(&options);
    let guards = timely::execute_from_args(args, move |worker| {
        let attached = shared.attach(worker);
        let (index, peers) = (worker.index() as u64, worker.peers() as u64);
        let mut input = InputHandle::new();
        let probe = ProbeHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            let (handle, cycle) = scope.feedback(1);
            let stepped = scope.region(|region| {
                scope
                    .input_from(&mut input)
                    .concat(cycle)
                    .enter(region)
                    .map(|x: u64| if x.is_multiple_of(2) { x / 2 } else { 3 * x + 1 })
                    .exchange(|x| *x)
                    .leave(scope)
            });
            stepped.filter(|x| *x > 1).probe_with(&probe).connect_loop(handle);
        });
        for round in 0..rounds {
            for n in (round * records..(round + 1) * records).filter(|n| n % peers == index) {
                input.send(n + 1);
            }
            input.advance_to(round + 1);
            // At most two epochs in flight; an idle worker parks rather than spins.
            worker.step_or_park_while(None, || probe.less_than(&round.saturating_sub(1)));
        }
        input.close();
        attached // timely runs the dataflow to its end after this closure returns
    })
    .expect("timely runs");
    options.finish(started, guards.join());
}
