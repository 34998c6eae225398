//! A program that is slow in one place: `Sleepy` sleeps for every batch it receives, the other
//! operators do little. With statistics on (`--statistics-ms 1000`) the service shows `Sleepy`
//! as the busiest operator and the records each channel carried.
//!
//! `cargo run --example slow -- -w 4 --rounds 20 --records 100 --sleep-ms 20 --statistics-ms 1000`
//!
//! Each worker sends `--records R` records per round for `--rounds N` rounds, so the channel
//! from `Input` to `Exchange` carries `R * N * workers` records in all; they reach `Sleepy`
//! (which sleeps `--sleep-ms` per message and passes them on), then `Cheap` (a map) and a probe.
//! `--round-ms M` paces the rounds (default 0: as fast as they go).

#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::operator::Operator;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{Exchange, Input, Probe};
use timely::dataflow::{InputHandle, ProbeHandle};

fn main() {
    let options = Arc::new(common::Options::parse("slow"));
    let (rounds, records) = (options.number("rounds", 20), options.number("records", 100));
    let sleep = Duration::from_millis(options.number("sleep-ms", 20));
    let pace = Duration::from_millis(options.number("round-ms", 0));
    let args = std::iter::once("slow".to_owned()).chain(options.timely.clone());
    let started = Instant::now();
    let shared = Arc::clone(&options);
    let guards = timely::execute_from_args(args, move |worker| {
        let attached = shared.attach(worker);
        let index = worker.index() as u64;
        let mut input = InputHandle::new();
        let probe = ProbeHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            scope
                .input_from(&mut input)
                .exchange(|x: &u64| *x)
                .unary(Pipeline, "Sleepy", |_capability, _info| {
                    move |input, output| {
                        input.for_each(|capability, data| {
                            std::thread::sleep(sleep);
                            output.session(&capability).give_container(data);
                        });
                    }
                })
                .container::<Vec<u64>>()
                .map(|x| x + 1)
                .probe_with(&probe);
        });
        for round in 0..rounds {
            for record in 0..records {
                input.send(round * 1_000_000 + record * 64 + index);
            }
            input.advance_to(round + 1);
            let next = Instant::now() + pace;
            worker.step_or_park_while(None, || probe.less_than(&round));
            while let Some(left) = next.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
                worker.step_or_park(Some(left));
            }
        }
        input.close();
        attached
    })
    .expect("timely runs");
    options.finish(started, guards.join());
}
