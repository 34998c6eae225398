//! Replays a recorded workload through the engine, for profiling without Python:
//! `cargo run --release --example replay -- FILE [REPEATS]`.
//!
//! FILE: a line `arity locations transitions`, one line `src dst increments...` per transition,
//! then one line per batch of `location coords... delta` groups (the first batch is the
//! initial one and is not timed).

use std::time::Instant;

use progress_engine::batch::Changes;
use progress_engine::time::Time;
use progress_engine::topology::TransitionSpec;
use progress_engine::tracker::Tracker;

fn numbers(line: &str) -> Vec<u64> {
    line.split_whitespace().map(|x| x.parse::<i64>().expect("an integer") as u64).collect()
}

fn replay<T: Time>(arity: usize, locations: usize, specs: &[TransitionSpec], batches: &[Vec<u64>], repeats: usize) {
    let mut best = f64::MAX;
    let mut total_changes = 0;
    for _ in 0..repeats {
        let mut tracker = Tracker::<T>::new(arity, locations, specs).expect("a valid graph");
        let mut changes = Changes::new(arity);
        let apply = |tracker: &mut Tracker<T>, batch: &[u64], changes: &mut Changes| {
            for update in batch.chunks(arity + 2) {
                tracker.update_coords(update[0] as usize, &update[1..=arity], update[arity + 1] as i64);
            }
            tracker.propagate(changes);
        };
        apply(&mut tracker, &batches[0], &mut changes);
        total_changes = 0;
        let started = Instant::now();
        for batch in &batches[1..] {
            changes.clear();
            apply(&mut tracker, batch, &mut changes);
            total_changes += changes.len();
        }
        best = best.min(started.elapsed().as_secs_f64());
    }
    let count = (batches.len() - 1) as f64;
    println!("{:.2} us per batch, {:.1} changes per batch", best / count * 1e6, total_changes as f64 / count);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let text = std::fs::read_to_string(&args[1]).expect("a readable file");
    let repeats = args.get(2).map_or(10, |r| r.parse().expect("a count"));
    let mut lines = text.lines();
    let header = numbers(lines.next().expect("a header"));
    let (arity, locations, transitions) = (header[0] as usize, header[1] as usize, header[2] as usize);
    let specs: Vec<TransitionSpec> = (0..transitions)
        .map(|_| {
            let n = numbers(lines.next().expect("a transition"));
            TransitionSpec { src: n[0] as usize, dst: n[1] as usize, summary: Some(n[2..].to_vec()) }
        })
        .collect();
    let batches: Vec<Vec<u64>> = lines.map(numbers).collect();
    match arity {
        1 => replay::<[u64; 1]>(arity, locations, &specs, &batches, repeats),
        2 => replay::<[u64; 2]>(arity, locations, &specs, &batches, repeats),
        3 => replay::<[u64; 3]>(arity, locations, &specs, &batches, repeats),
        4 => replay::<[u64; 4]>(arity, locations, &specs, &batches, repeats),
        _ => replay::<progress_engine::time::DynTime>(arity, locations, &specs, &batches, repeats),
    }
}
