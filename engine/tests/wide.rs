//! The engine against the pairwise algorithm it replaced (the engine as it was, held to the
//! Python reference and the oracle by the Python suite): the antichains on random updates, one
//! at a time and in batches; the trackers on random graphs (loops included) whose batches
//! place, retract and shift wide antichains, with the same changes after every batch and the
//! same frontiers and counts everywhere. Arities 1 to 3, and a dynamic arity.

use progress_engine::antichain::{Antichain, MutableAntichain, Scratch};
use progress_engine::batch::Changes;
use progress_engine::pairwise::Pairwise;
use progress_engine::sorted::consolidate;
use progress_engine::time::{DynTime, Time};
use progress_engine::topology::TransitionSpec;
use progress_engine::tracker::Tracker;

/// A small deterministic generator (no dependency for tests).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }

    fn index(&mut self, bound: usize) -> usize {
        self.below(bound as u64) as usize
    }
}

/// Identity transitions from lower to higher locations; with `loops`, transitions that advance
/// times go anywhere (every cycle then advances times, as the engine requires).
fn random_graph(rng: &mut Lcg, locations: usize, arity: usize, loops: bool) -> Vec<TransitionSpec> {
    let mut transitions = Vec::new();
    for _ in 0..locations * 2 {
        let (a, b) = (rng.index(locations), rng.index(locations));
        if a < b && rng.below(3) > 0 {
            transitions.push(TransitionSpec { src: a, dst: b, summary: None });
        } else if a != b && (loops || a < b) {
            let mut summary: Vec<u64> = (0..arity).map(|_| rng.below(3)).collect();
            if summary.iter().all(|&c| c == 0) {
                summary[arity - 1] = 1;
            }
            transitions.push(TransitionSpec { src: a, dst: b, summary: Some(summary) });
        }
    }
    transitions
}

/// `width + 1` times, mutually incomparable from arity 2 on: `[base + i, base + width - i, ...]`.
fn antichain(rng: &mut Lcg, arity: usize, width: u64) -> Vec<Vec<u64>> {
    let base = rng.below(4);
    let tail: Vec<u64> = (2..arity).map(|_| rng.below(3)).collect();
    (0..=width)
        .map(|i| {
            let mut time = vec![base + i, base + width - i];
            time.truncate(arity);
            time.extend(&tail);
            time
        })
        .collect()
}

/// Random updates, one at a time and in batches, against the pairwise antichain: the same
/// changes, frontiers and counts at every step, for arities 1 to 3 and a dynamic arity.
fn against_pairwise<T: Time>(arity: usize, seed: u64) {
    let mut rng = Lcg(seed);
    let mut fast = MutableAntichain::<T>::new();
    let mut slow = Pairwise::<T>::new();
    let mut scratch = Scratch::default();
    for step in 0..400 {
        let size = if step % 3 == 0 { 1 + rng.below(40) as usize } else { 1 };
        let mut updates: Vec<(T, i64)> = (0..size)
            .map(|_| {
                let coords: Vec<u64> = (0..arity).map(|_| rng.below(7)).collect();
                (T::from_coords(&coords), [-2, -1, -1, 1, 1, 1, 2][rng.below(7) as usize])
            })
            .collect();
        consolidate(&mut updates);
        let (mut got, mut want) = (Vec::new(), Vec::new());
        fast.update_batch(&updates, &mut scratch, &mut got);
        slow.update_batch(&updates, &mut scratch, &mut want);
        assert_eq!(got, want, "step {step}");
        assert_eq!(fast.frontier(), slow.sorted_frontier().as_slice());
        assert_eq!(fast.counts(), slow.counts());
        let probe: Vec<u64> = (0..arity).map(|_| rng.below(8)).collect();
        assert_eq!(fast.less_equal(&T::from_coords(&probe)), slow.less_equal(&T::from_coords(&probe)));
    }
}

#[test]
fn random_updates_match_the_pairwise_antichain() {
    for seed in 0..20 {
        against_pairwise::<[u64; 1]>(1, seed);
        against_pairwise::<[u64; 2]>(2, seed);
        against_pairwise::<[u64; 3]>(3, seed);
        against_pairwise::<DynTime>(2, seed);
        against_pairwise::<DynTime>(5, seed);
    }
}

type Update = (usize, Vec<u64>, i64);

fn apply<T: Time, A: Antichain<T>>(tracker: &mut Tracker<T, A>, batch: &[Update]) -> Changes {
    for (location, time, delta) in batch {
        tracker.update_coords(*location, time, *delta);
    }
    let mut changes = Changes::new(tracker.arity());
    tracker.propagate(&mut changes);
    changes
}

fn compare<T: Time>(arity: usize, seed: u64, loops: bool) {
    let mut rng = Lcg(seed);
    let locations = 2 + rng.index(10);
    let transitions = random_graph(&mut rng, locations, arity, loops);
    let mut fast = Tracker::<T>::new(arity, locations, &transitions).expect("a valid graph");
    let mut slow = Tracker::<T, Pairwise<T>>::new(arity, locations, &transitions).expect("a valid graph");
    // The antichains placed so far: (location, times).
    let mut groups: Vec<(usize, Vec<Vec<u64>>)> = Vec::new();
    for number in 0..30 {
        let mut batch: Vec<Update> = Vec::new();
        match rng.below(5) {
            0 | 1 => {
                let (location, width) = (rng.index(locations), 2 + rng.below(30));
                let times = antichain(&mut rng, arity, width);
                batch.extend(times.iter().map(|t| (location, t.clone(), 1)));
                groups.push((location, times));
            }
            2 if !groups.is_empty() => {
                // Retract a whole antichain and add it shifted, in one batch.
                let index = rng.index(groups.len());
                let (location, times) = &mut groups[index];
                let shift: Vec<u64> = (0..arity).map(|_| rng.below(3)).collect();
                batch.extend(times.iter().map(|t| (*location, t.clone(), -1)));
                for time in times.iter_mut() {
                    time.iter_mut().zip(&shift).for_each(|(c, s)| *c += s);
                }
                batch.extend(times.iter().map(|t| (*location, t.clone(), 1)));
            }
            3 if !groups.is_empty() => {
                let (location, times) = groups.swap_remove(rng.index(groups.len()));
                batch.extend(times.into_iter().map(|t| (location, t, -1)));
            }
            _ => {
                // A few updates anywhere, counts going transiently negative.
                for _ in 0..1 + rng.below(6) {
                    let time: Vec<u64> = (0..arity).map(|_| rng.below(6)).collect();
                    let delta = [-1, 1, 1, 2][rng.index(4)];
                    batch.push((rng.index(locations), time.clone(), delta));
                    batch.push((rng.index(locations), time, -delta));
                }
            }
        }
        // Shuffled, so that a location's updates do not arrive in time order.
        for index in (1..batch.len()).rev() {
            batch.swap(index, rng.index(index + 1));
        }
        let (got, want) = (apply(&mut fast, &batch), apply(&mut slow, &batch));
        assert_eq!(got, want, "arity {arity}, seed {seed}, batch {number}");
        for location in 0..locations {
            assert_eq!(fast.frontier(location), slow.frontier(location), "seed {seed}, batch {number}");
            assert_eq!(fast.counts(location), slow.counts(location));
        }
    }
}

#[test]
fn wide_antichains_as_the_pairwise_tracker_without_loops() {
    for seed in 0..25 {
        compare::<[u64; 1]>(1, seed, false);
        compare::<[u64; 2]>(2, seed, false);
        compare::<[u64; 3]>(3, seed, false);
    }
}

#[test]
fn wide_antichains_as_the_pairwise_tracker_with_loops() {
    for seed in 0..25 {
        compare::<[u64; 1]>(1, seed, true);
        compare::<[u64; 2]>(2, seed, true);
        compare::<[u64; 3]>(3, seed, true);
        compare::<DynTime>(2, seed, true);
        compare::<DynTime>(5, seed, true);
    }
}

/// The benchmark's workload, smaller: a chain of identity transitions whose input holds an
/// antichain of 101 times, retracted and added shifted in one batch; every location's frontier
/// moves entirely.
#[test]
fn a_chain_moves_a_wide_antichain_in_one_batch() {
    let transitions: Vec<TransitionSpec> =
        (0..40).map(|l| TransitionSpec { src: l, dst: l + 1, summary: None }).collect();
    let mut fast = Tracker::<[u64; 2]>::new(2, 41, &transitions).unwrap();
    let mut slow = Tracker::<[u64; 2], Pairwise<[u64; 2]>>::new(2, 41, &transitions).unwrap();
    let old: Vec<Update> = (0..=100).map(|i| (0, vec![i, 100 - i], 1)).collect();
    assert_eq!(apply(&mut fast, &old), apply(&mut slow, &old));
    let mut moved: Vec<Update> = old.iter().map(|(l, t, _)| (*l, t.clone(), -1)).collect();
    moved.extend(old.iter().map(|(l, t, _)| (*l, vec![t[0] + 1, t[1] + 1], 1)));
    let changes = apply(&mut fast, &moved);
    assert_eq!(changes, apply(&mut slow, &moved));
    assert_eq!(changes.len(), 2 * 101 * 41);
    assert_eq!(fast.frontier(40), (0..=100).map(|i| [i + 1, 101 - i]).collect::<Vec<_>>());
}
