//! The incremental tracker: occurrence counts, implications, propagation in rounds of times.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::antichain::{Antichain, MutableAntichain, Scratch};
use crate::batch::Changes;
use crate::groups::TimeGroups;
use crate::pending::Pending;
use crate::round::Round;
use crate::sorted::consolidate;
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

/// Rounds of fewer incomparable times settle them one time after another (the lists per
/// location of a round of many times cost more than they save when short).
const ROUND_OF_MANY: usize = 16;

/// How many updates of a batch go to the pointstamp counts one at a time, as they come, and
/// how many counts a location may hold for that; the others are grouped by location (a sort),
/// which pays off once a location may take many.
pub const DIRECT_UPDATES: usize = 64;

/// Occurrence counts and exact, incrementally maintained frontiers of one dataflow graph.
///
/// Locations are the caller's indices `0..len`. [`Tracker::update`] stages count changes;
/// [`Tracker::propagate`] settles them and writes the consolidated frontier changes. `A` is the
/// antichain kept per location: the engine's [`MutableAntichain`], or the pairwise one it
/// replaced ([`crate::pairwise::Pairwise`], which also settles one time per round), for
/// comparisons.
#[derive(Debug)]
pub struct Tracker<T: Time, A: Antichain<T> = MutableAntichain<T>> {
    topology: Topology<T>,
    /// Per internal position: the occurrence counts of pointstamps.
    pointstamps: Vec<A>,
    /// Per internal position: one count per frontier element of its own pointstamps and per
    /// frontier element of each predecessor moved along the connecting transition.
    implications: Vec<A>,
    /// Work at times after the ones being settled.
    worklist: BinaryHeap<Work<T>>,
    /// Work of a round of one time: net diffs per position.
    pending: Pending,
    /// The updates of the batch applied so far, up to [`DIRECT_UPDATES`].
    direct: usize,
    /// Pointstamp updates staged for the next propagation: `(position, time, delta)`.
    staged: Vec<(u32, T, i64)>,
    /// The work of a round of several times: lists per position.
    round: Round<T>,
    /// The times of the round being settled after its first, sorted.
    times: Vec<T>,
    /// The work at those times, grouped by time in the same order.
    gathered: Vec<Work<T>>,
    /// Work looked at while gathering a round but left for a later one.
    deferred: Vec<Work<T>>,
    /// The list of the position being settled.
    list: Vec<(T, i64)>,
    scratch: Vec<(T, i64)>,
    spare: Scratch<T>,
    pushed: TimeGroups<T>,
}

impl<T: Time, A: Antichain<T>> Tracker<T, A> {
    /// A tracker for `locations` locations joined by `transitions`, all counts zero.
    pub fn new(arity: usize, locations: usize, transitions: &[TransitionSpec]) -> Result<Self, TopologyError> {
        let topology = Topology::new(arity, locations, transitions)?;
        Ok(Tracker {
            pointstamps: (0..locations).map(|_| A::default()).collect(),
            implications: (0..locations).map(|_| A::default()).collect(),
            topology,
            worklist: BinaryHeap::new(),
            pending: Pending::new(locations),
            direct: 0,
            staged: Vec::new(),
            round: Round::new(locations),
            times: Vec::new(),
            gathered: Vec::new(),
            deferred: Vec::new(),
            list: Vec::new(),
            scratch: Vec::new(),
            spare: Scratch::default(),
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
    ///
    /// The first updates of a batch go to the pointstamp counts at once, unless the location
    /// holds many counts already; the others are staged, and each location takes its staged
    /// updates at once when the batch is propagated (a wide antichain placed or moved in one
    /// batch), instead of shifting its sorted counts once per update.
    pub fn update(&mut self, location: usize, time: &T, delta: i64) {
        let position = self.topology.internal(location) as u32;
        if self.direct < DIRECT_UPDATES && self.pointstamps[position as usize].counts().len() < DIRECT_UPDATES {
            self.direct += 1;
            let Tracker { pointstamps, worklist, scratch, .. } = self;
            scratch.clear();
            pointstamps[position as usize].update(time, delta, scratch);
            for (time, diff) in scratch.drain(..) {
                worklist.push(Work { time, position, diff });
            }
        } else if delta != 0 {
            self.staged.push((position, time.clone(), delta));
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
    /// A location's pointstamp counts take its staged updates at once. The frontier changes
    /// that follow are settled in rounds: a round takes the least pending time and every other
    /// pending time that no other pending time is `<=` (a wide antichain moves in one round),
    /// and settles its work in position order. Positions follow the identity transitions and
    /// every other transition strictly advances times, so work at a round's time only goes to
    /// later positions, and everything else a round produces is at a time after one of the
    /// round's: each (time, location) is settled once, with every contribution to it already
    /// summed. A round of few times settles them one after another with net diffs per position
    /// ([`Pending`]); a round of many keeps lists per position ([`Round`]), which each
    /// location's implications take at once.
    pub fn propagate(&mut self, changes: &mut Changes) {
        self.apply_staged();
        while let Some(first) = self.worklist.pop() {
            let now = first.time;
            self.pending.add(first.position, first.diff);
            while let Some(next) = self.worklist.peek().filter(|next| next.time == now) {
                self.pending.add(next.position, next.diff);
                self.worklist.pop();
            }
            if A::BATCHED && self.topology.arity() > 1 && self.gather(&now) + 1 >= ROUND_OF_MANY {
                while let Some((position, diff)) = self.pending.pop() {
                    self.round.add(position as u32, now.clone(), diff);
                }
                for work in self.gathered.drain(..) {
                    self.round.add(work.position, work.time, work.diff);
                }
                self.settle_many();
                continue;
            }
            self.settle_one(&now);
            // Few other times: one round each, in order. Each stays minimal while the others
            // are settled, since all they produce comes after them.
            let mut start = 0;
            while start < self.gathered.len() {
                let time = self.gathered[start].time.clone();
                while let Some(work) = self.gathered.get(start).filter(|work| work.time == time) {
                    self.pending.add(work.position, work.diff);
                    start += 1;
                }
                self.settle_one(&time);
            }
            self.gathered.clear();
        }
        self.pushed.drain_into(changes);
    }

    /// The staged pointstamp updates, sorted by location: each location takes its own at
    /// once; their frontier changes become work.
    fn apply_staged(&mut self) {
        let Tracker { pointstamps, worklist, staged, list, scratch, spare, .. } = self;
        self.direct = 0;
        staged.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let mut start = 0;
        while start < staged.len() {
            let position = staged[start].0;
            let end = start + staged[start..].partition_point(|update| update.0 == position);
            list.clear();
            list.extend(staged[start..end].iter().map(|(_, time, delta)| (time.clone(), *delta)));
            start = end;
            consolidate(list);
            scratch.clear();
            pointstamps[position as usize].update_batch(list, spare, scratch);
            for (time, diff) in scratch.drain(..) {
                worklist.push(Work { time, position, diff });
            }
        }
        staged.clear();
    }

    /// The other times of the round starting at `now` (whose work is in `self.pending`):
    /// every pending time that no earlier one is `<=`, into `self.times`, their work into
    /// `self.gathered`; returns how many. Lexicographic order puts a time after every time `<=`
    /// it, so a time is incomparable with all pending ones once the round's times (which are
    /// `<=` whatever was passed over) are not `<=` it. The scan passes over fewer times than
    /// the round has, so that a round of one time costs one look.
    fn gather(&mut self, now: &T) -> usize {
        let Tracker { topology, worklist, times, gathered, deferred, .. } = self;
        times.clear();
        let two = topology.arity() == 2;
        let mut least = now.coords()[1];
        let mut passed = 0;
        while let Some(next) = worklist.peek() {
            let dominated = if two {
                next.time.coords()[1] >= least
            } else {
                now.less_equal(&next.time) || times.iter().any(|t| t.less_equal(&next.time))
            };
            if dominated && passed >= times.len() {
                break;
            }
            let time = next.time.clone();
            let into = if dominated { &mut *deferred } else { &mut *gathered };
            while worklist.peek().is_some_and(|more| more.time == time) {
                into.extend(worklist.pop());
            }
            if dominated {
                passed += 1;
            } else {
                least = time.coords()[1];
                times.push(time);
            }
        }
        for work in deferred.drain(..) {
            worklist.push(work);
        }
        times.len()
    }

    /// A round of one time, its work in `self.pending`: positions in order, each with its net
    /// diff.
    fn settle_one(&mut self, now: &T) {
        let Tracker { topology, implications, worklist, pending, scratch, pushed, .. } = self;
        while let Some((position, diff)) = pending.pop() {
            if diff == 0 {
                continue;
            }
            scratch.clear();
            implications[position].update(now, diff, scratch);
            if scratch.is_empty() {
                continue;
            }
            let steps = topology.steps(position);
            let external = topology.external(position);
            for (time, diff) in scratch.drain(..) {
                for step in steps {
                    if let Some(moved) = step.advance(&time) {
                        if moved == *now {
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

    /// A round of several times: positions in order, each with its list of (time, diff),
    /// which its implications take at once.
    fn settle_many(&mut self) {
        let Tracker { topology, implications, worklist, round, list, scratch, spare, pushed, .. } = self;
        while let Some(position) = round.pop_into(list) {
            consolidate(list);
            scratch.clear();
            match list.as_slice() {
                [] => continue,
                [(time, delta)] => {
                    implications[position].update(time, *delta, scratch);
                    scratch.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                }
                _ => implications[position].update_batch(list, spare, scratch),
            }
            let steps = topology.steps(position);
            let external = topology.external(position);
            // Changes and the list are both sorted: a change is at one of the round's times
            // iff it is at one of this position's.
            let mut cursor = 0;
            for (time, diff) in scratch.drain(..) {
                while cursor < list.len() && list[cursor].0 < time {
                    cursor += 1;
                }
                let in_round = cursor < list.len() && list[cursor].0 == time;
                for step in steps {
                    if let Some(moved) = step.advance(&time) {
                        if in_round && moved == time {
                            debug_assert!(step.dst as usize > position);
                            round.add(step.dst, moved, diff);
                        } else {
                            worklist.push(Work { time: moved, position: step.dst, diff });
                        }
                    }
                }
                pushed.push(time, external, diff);
            }
        }
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
