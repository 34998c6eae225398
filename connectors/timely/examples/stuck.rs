//! A dataflow held back on purpose: on some workers, `Hold` keeps a capability at one epoch for
//! a while, so everything downstream waits. What the service's dashboard and `explain` show
//! then is the point: the operator (`Hold`), the workers (`w<holder>`) and the pointstamps.
//!
//! `cargo run --example stuck -- -w 4 --rounds 6 --hold-at 3 --holder 3 --hold-seconds 20 [--name N]`
//!
//! Options: `--holder H` (default: the last worker) holds at `--hold-at E`; with `--holders K`,
//! workers `H`, `H - 1`, ... `H - K + 1` hold, at `E`, `E + 1`, ... (one epoch later each);
//! `--records R` records per worker and round (default 1); `--round-ms M` paces the rounds, one
//! every `M` milliseconds (default 0: as fast as they go). `--nested 1` puts `Hold` in an
//! iterative scope (`Product<u64, u32>` times) where each record goes round the loop `--laps L`
//! times (default 4), exchanged to another worker at every lap: `Hold` keeps its capability at
//! `(E, 0)` there, and the records behind it cross between workers at times it dominates, the
//! updates timely's default progress mode (`Demand`) defers. Timely's `--progress-mode eager`
//! sends every update at once instead.

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use timely::dataflow::channels::pact::{Exchange as ExchangePact, Pipeline};
use timely::dataflow::operators::generic::operator::Operator;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{
    Concat, ConnectLoop, Enter, Exchange, Feedback, Input, Inspect, Leave, OkErr, Probe,
};
use timely::dataflow::{InputHandle, ProbeHandle};
use timely::order::Product;

fn main() {
    let options = Arc::new(common::Options::parse("stuck"));
    let rounds = options.number("rounds", 6);
    let hold_at = options.number("hold-at", 3);
    let hold_for = Duration::from_secs(options.number("hold-seconds", 20));
    let holders = options.number("holders", 1) as usize;
    let records = options.number("records", 1);
    let nested = options.number("nested", 0) == 1;
    let laps = options.number("laps", 4) as u32;
    let pace = Duration::from_millis(options.number("round-ms", 0));
    let args = std::iter::once("stuck".to_owned()).chain(options.timely.clone());
    let started = Instant::now();
    let shared = Arc::clone(&options);
    let guards = timely::execute_from_args(args, move |worker| {
        let attached = shared.attach(worker);
        let peers = worker.peers();
        let holder = shared.number("holder", peers as u64 - 1) as usize;
        let index = worker.index();
        // Workers holder, holder - 1, ... hold, one epoch later each.
        let epoch = (index <= holder && holder - index < holders).then(|| hold_at + (holder - index) as u64);
        if let Some(epoch) = epoch {
            eprintln!("worker {index}: Hold keeps a capability at {epoch} for {hold_for:?}");
        }
        let mut input = InputHandle::new();
        let probe = ProbeHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            let stream = scope.input_from(&mut input).exchange(|x: &u64| *x);
            if !nested {
                stream
                    .unary_frontier(Pipeline, "Hold", |capability, info| {
                        let activator = scope.activator_for(info.address.clone());
                        let release = Instant::now() + hold_for;
                        let mut held = epoch.map(|e| capability.delayed(&e));
                        move |(input, _frontier), output| {
                            input.for_each_stamp(|cap, data| {
                                let received: Vec<u64> =
                                    data.flat_map(|batch: &mut Vec<u64>| batch.drain(..)).collect();
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
                return;
            }
            let entering = stream.map(|x| (x, 0u32));
            let left = scope.iterative::<u32, _, _>(|inner| {
                let (handle, cycle) = inner.feedback(Product::new(0, 1));
                let stepped = entering
                    .enter(inner)
                    .concat(cycle)
                    .unary_frontier(
                        // Each lap takes a record to another worker.
                        ExchangePact::new(|(x, lap): &(u64, u32)| x + u64::from(*lap)),
                        "Hold",
                        |capability, info| {
                            let activator = inner.activator_for(info.address.clone());
                            let release = Instant::now() + hold_for;
                            let mut held = epoch.map(|e| capability.delayed(&Product::new(e, 0)));
                            move |(input, _frontier), output| {
                                input.for_each_stamp(|cap, data| {
                                    let received: Vec<(u64, u32)> =
                                        data.flat_map(|batch: &mut Vec<(u64, u32)>| batch.drain(..)).collect();
                                    for time in cap.stamp().iter() {
                                        let out = cap.delayed(time, 0);
                                        output
                                            .session(&out)
                                            .give_iterator(received.iter().map(|(x, lap)| (*x, lap + 1)));
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
                        },
                    )
                    .container::<Vec<(u64, u32)>>();
                let (again, done) = stepped.ok_err::<Vec<(u64, u32)>, _, Vec<u64>, _, _>(move |(x, lap)| {
                    if lap < laps {
                        Ok((x, lap))
                    } else {
                        Err(x)
                    }
                });
                again.connect_loop(handle);
                done.leave(scope)
            });
            left.inspect(|_| {}).probe_with(&probe);
        });
        for round in 0..rounds {
            for record in 0..records {
                input.send(round * 1_000_000 + record * peers as u64 + index as u64);
            }
            input.advance_to(round + 1);
            worker.step();
            let next = Instant::now() + pace;
            while let Some(left) = next.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
                worker.step_or_park(Some(left));
            }
        }
        input.close();
        while worker.step_or_park(Some(Duration::from_millis(100))) {}
        attached
    })
    .expect("timely runs");
    options.finish(started, guards.join());
}
