//! The incremental tracker: occurrence counts, implications, propagation in time order.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::antichain::MutableAntichain;
use crate::batch::Changes;
use crate::groups::TimeGroups;
use crate::pending::Pending;
use crate::time::Time;
use crate::topology::{Topology, TopologyError, TransitionSpec};

/// Pending work: `diff` to add to the implications of internal position `position` at `time`.
/// Ordered so that the max-heap pops the least `(time, position)` first.
#[derive(Debug)]
struct Work<T> {
    time: T,
    position: u32,
    diff: i64,
}

impl<T: Time> PartialEq for Work<T> {
    fn eq(&self, other: &Self) -> bool {
        self.position == other.position && self.time == other.time
    }
}

impl<T: Time> Eq for Work<T> {}

impl<T: Time> PartialOrd for Work<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: Time> Ord for Work<T> {
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        other.time.cmp(&self.time).then_with(|| other.position.cmp(&self.position))
    }
}

/// Occurrence counts and exact, incrementally maintained frontiers of one dataflow graph.
///
/// Locations are the caller's indices `0..len`. [`Tracker::update`] stages count changes;
/// [`Tracker::propagate`] settles them and writes the consolidated frontier changes.
#[derive(Debug)]
pub struct Tracker<T: Time> {
    topology: Topology<T>,
    /// Per internal position: the occurrence counts of pointstamps.
    pointstamps: Vec<MutableAntichain<T>>,
    /// Per internal position: one count per frontier element of its own pointstamps and per
    /// frontier element of each predecessor moved along the connecting transition.
    implications: Vec<MutableAntichain<T>>,
    /// Work at times after the one being settled.
    worklist: BinaryHeap<Work<T>>,
    /// Work at the time being settled.
    pending: Pending,
    scratch: Vec<(T, i64)>,
    pushed: TimeGroups<T>,
}

impl<T: Time> Tracker<T> {
    /// A tracker for `locations` locations joined by `transitions`, all counts zero.
    pub fn new(arity: usize, locations: usize, transitions: &[TransitionSpec]) -> Result<Self, TopologyError> {
        let topology = Topology::new(arity, locations, transitions)?;
        Ok(Tracker {
            pointstamps: (0..locations).map(|_| MutableAntichain::new()).collect(),
            implications: (0..locations).map(|_| MutableAntichain::new()).collect(),
            topology,
            worklist: BinaryHeap::new(),
            pending: Pending::new(locations),
            scratch: Vec::new(),
            pushed: TimeGroups::new(),
        })
    }

    /// The number of coordinates of every time.
    pub fn arity(&self) -> usize {
        self.topology.arity()
    }

    /// The number of locations.
    pub fn len(&self) -> usize {
        self.topology.len()
    }

    /// True for a graph without locations.
    pub fn is_empty(&self) -> bool {
        self.topology.is_empty()
    }

    /// Adds `delta` to the count of `(location, time)`; takes effect on the frontiers at the
    /// next [`Tracker::propagate`]. `location < len()` and `time` of the tracker's arity.
    pub fn update(&mut self, location: usize, time: &T, delta: i64) {
        let position = self.topology.internal(location);
        self.scratch.clear();
        self.pointstamps[position].update(time, delta, &mut self.scratch);
        for (time, diff) in self.scratch.drain(..) {
            self.worklist.push(Work { time, position: position as u32, diff });
        }
    }

    /// [`Tracker::update`] with the time given as coordinates.
    pub fn update_coords(&mut self, location: usize, time: &[u64], delta: i64) {
        self.update(location, &T::from_coords(time), delta);
    }

    /// Settles every staged update and appends the frontier changes they cause to `changes`:
    /// exactly one `+1` or `-1` per `(location, time)` whose frontier membership changed,
    /// sorted by (time, location).
    ///
    /// Work is taken in (time, position) order. Positions follow the identity transitions, and
    /// every other transition strictly advances times, so every push goes to a later key: each
    /// (time, location) is settled once, with every contribution to it already summed. Work at
    /// the time being settled waits in [`Pending`] (positions only); later work in a heap.
    pub fn propagate(&mut self, changes: &mut Changes) {
        let Tracker { topology, implications, worklist, pending, scratch, pushed, .. } = self;
        while let Some(first) = worklist.pop() {
            let now = first.time;
            pending.add(first.position, first.diff);
            while let Some(next) = worklist.peek() {
                if next.time != now {
                    break;
                }
                pending.add(next.position, next.diff);
                worklist.pop();
            }
            while let Some((position, diff)) = pending.pop() {
                if diff == 0 {
                    continue;
                }
                scratch.clear();
                implications[position].update(&now, diff, scratch);
                if scratch.is_empty() {
                    continue;
                }
                let steps = topology.steps(position);
                let external = topology.external(position);
                for (time, diff) in scratch.drain(..) {
                    for step in steps {
                        if let Some(moved) = step.advance(&time) {
                            if moved == now {
                                debug_assert!(step.dst as usize > position);
                                pending.add(step.dst, diff);
                            } else {
                                worklist.push(Work { time: moved, position: step.dst, diff });
                            }
                        }
                    }
                    pushed.push(time, external, diff);
                }
            }
        }
        pushed.drain_into(changes);
    }

    /// The frontier of `location`, sorted.
    pub fn frontier(&self, location: usize) -> Vec<T> {
        self.implications[self.topology.internal(location)].sorted_frontier()
    }

    /// True iff some frontier element of `location` is `<= time` (a notification at `time`
    /// is not yet safe).
    pub fn less_equal(&self, location: usize, time: &T) -> bool {
        self.implications[self.topology.internal(location)].less_equal(time)
    }

    /// The non-zero occurrence counts at `location`, sorted by time.
    pub fn counts(&self, location: usize) -> &[(T, i64)] {
        self.pointstamps[self.topology.internal(location)].counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(src: usize, dst: usize, summary: Option<Vec<u64>>) -> TransitionSpec {
        TransitionSpec { src, dst, summary }
    }

    /// Timely's documentation example: three operators in a cycle, the third adds one.
    /// Locations: target(n) = 2n, source(n) = 2n + 1.
    fn timely_example() -> Tracker<[u64; 1]> {
        let transitions = [
            spec(0, 1, None),
            spec(2, 3, None),
            spec(4, 5, Some(vec![1])),
            spec(1, 2, None),
            spec(3, 4, None),
            spec(5, 0, None),
        ];
        Tracker::new(1, 6, &transitions).unwrap()
    }

    fn apply<T: Time>(tracker: &mut Tracker<T>, updates: &[(usize, T, i64)]) -> Vec<(u32, Vec<u64>, i64)> {
        for (location, time, delta) in updates {
            tracker.update(*location, time, *delta);
        }
        let mut changes = Changes::new(tracker.arity());
        tracker.propagate(&mut changes);
        changes.iter().map(|(l, t, d)| (l, t.to_vec(), d)).collect()
    }

    #[test]
    fn timely_worked_example() {
        let mut tracker = timely_example();
        let added = apply(&mut tracker, &[(1, [17], 1)]);
        let expected: Vec<(u32, Vec<u64>, i64)> = vec![
            (1, vec![17], 1),
            (2, vec![17], 1),
            (3, vec![17], 1),
            (4, vec![17], 1),
            (0, vec![18], 1),
            (5, vec![18], 1),
        ];
        let mut sorted = expected.clone();
        sorted.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
        assert_eq!(added, sorted);
        assert_eq!(tracker.frontier(0), vec![[18]]);
        assert!(tracker.less_equal(2, &[17]) && !tracker.less_equal(2, &[16]));
        let removed = apply(&mut tracker, &[(1, [17], -1)]);
        assert_eq!(removed, sorted.iter().map(|(l, t, d)| (*l, t.clone(), -d)).collect::<Vec<_>>());
        assert!((0..6).all(|l| tracker.frontier(l).is_empty()));
    }

    #[test]
    fn moving_a_capability_moves_every_frontier() {
        let mut tracker = timely_example();
        apply(&mut tracker, &[(1, [0], 1)]);
        for epoch in 0..5u64 {
            let changes = apply(&mut tracker, &[(1, [epoch + 1], 1), (1, [epoch], -1)]);
            assert_eq!(changes.len(), 12);
            assert!(changes.windows(2).all(|w| (&w[0].1, w[0].0) < (&w[1].1, w[1].0)));
        }
        assert_eq!(tracker.frontier(3), vec![[5]]);
        assert_eq!(tracker.frontier(0), vec![[6]]);
    }

    #[test]
    fn transient_negative_counts_hold_nothing_back() {
        let mut tracker = timely_example();
        assert!(apply(&mut tracker, &[(2, [3], -1)]).is_empty());
        assert_eq!(tracker.counts(2), &[([3], -1)]);
        assert!(apply(&mut tracker, &[(2, [3], 1)]).is_empty());
        assert!(tracker.counts(2).is_empty());
        // Within one batch: +1 and -1 at the same pointstamp cancel out.
        assert!(apply(&mut tracker, &[(1, [4], 1), (1, [4], -1)]).is_empty());
    }

    #[test]
    fn partial_order_and_any_arity() {
        // Two sources feeding one target through a +(0,..,1) step and an identity step.
        let arity = 5;
        let mut bump = vec![0u64; arity];
        bump[arity - 1] = 1;
        let transitions = [spec(0, 2, Some(bump)), spec(1, 2, None)];
        let mut tracker = Tracker::<crate::time::DynTime>::new(arity, 3, &transitions).unwrap();
        let t = |c: &[u64]| crate::time::DynTime::from_coords(c);
        let changes = apply(&mut tracker, &[(0, t(&[1, 0, 0, 0, 0]), 1), (1, t(&[0, 1, 0, 0, 0]), 1)]);
        assert_eq!(changes.len(), 4);
        assert_eq!(
            tracker.frontier(2).iter().map(|t| t.coords().to_vec()).collect::<Vec<_>>(),
            vec![vec![0, 1, 0, 0, 0], vec![1, 0, 0, 0, 1]]
        );
        let changes = apply(&mut tracker, &[(1, t(&[0, 0, 0, 0, 0]), 1)]);
        assert_eq!(
            changes,
            vec![
                (1, vec![0, 0, 0, 0, 0], 1),
                (2, vec![0, 0, 0, 0, 0], 1),
                (1, vec![0, 1, 0, 0, 0], -1),
                (2, vec![0, 1, 0, 0, 0], -1),
                (2, vec![1, 0, 0, 0, 1], -1),
            ]
        );
    }
}
