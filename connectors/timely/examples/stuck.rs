//! A dataflow held back on purpose: on one worker, `Hold` keeps a capability at one epoch for
//! a while, so everything downstream waits. What the service's dashboard and `explain` show
//! then is the point: the operator (`Hold`), the worker (`w<holder>`) and the pointstamp.
//!
//! `cargo run --example stuck -- -w 4 --rounds 6 --hold-at 3 --holder 3 --hold-seconds 20 [--name N]`

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::operator::Operator;
use timely::dataflow::operators::{Exchange, Input, Inspect, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};

fn main() {
    let options = Arc::new(common::Options::parse("stuck"));
    let rounds = options.number("rounds", 6);
    let hold_at = options.number("hold-at", 3);
    let hold_for = Duration::from_secs(options.number("hold-seconds", 20));
    let args = std::iter::once("stuck".to_owned()).chain(options.timely.clone());
    let started = Instant::now();
    let shared = Arc::clone(&options);
    let guards = timely::execute_from_args(args, move |worker| {
        let attached = shared.attach(worker);
        let holder = shared.number("holder", worker.peers() as u64 - 1) as usize;
        let index = worker.index();
        let mut input = InputHandle::new();
        let probe = ProbeHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            scope
                .input_from(&mut input)
                .exchange(|x: &u64| *x)
                .unary_frontier(Pipeline, "Hold", |capability, info| {
                    let activator = scope.activator_for(info.address.clone());
                    let release = Instant::now() + hold_for;
                    let mut held = (index == holder).then(|| capability.delayed(&hold_at));
                    if held.is_some() {
                        eprintln!("worker {index}: Hold keeps a capability at {hold_at} for {hold_for:?}");
                    }
                    move |(input, _frontier), output| {
                        input.for_each_stamp(|cap, data| {
                            let received: Vec<u64> = data.flat_map(|batch: &mut Vec<u64>| batch.drain(..)).collect();
                            for time in cap.stamp().iter() {
                                let out = cap.delayed(time, 0);
                                output.session(&out).give_iterator(received.iter().copied());
                            }
                        });
                        if held.is_some() {
                            if Instant::now() >= release {
                                held = None;
                                eprintln!("worker {index}: Hold released its capability");
                            } else {
                                activator.activate_after(Duration::from_millis(200));
                            }
                        }
                    }
                })
                .container::<Vec<u64>>()
                .inspect(|_| {})
                .probe_with(&probe);
        });
        for round in 0..rounds {
            input.send(round * 10 + index as u64);
            input.advance_to(round + 1);
            worker.step();
        }
        input.close();
        while worker.step_or_park(Some(Duration::from_millis(100))) {}
        attached
    })
    .expect("timely runs");
    options.finish(started, guards.join());
}
