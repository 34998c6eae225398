//! Signed counts per time and the frontier they imply, reporting exactly how it moves.
//!
//! The frontier is kept sorted lexicographically ([`crate::sorted`]), which makes dominance
//! cheap where the order has structure: with one coordinate the frontier holds at most one
//! time, and with two it is a staircase, so "is `t` dominated" is a binary search and "which
//! elements does `t` dominate" a contiguous run from where `t` would sit. Three coordinates and
//! more compare pairwise, though only with the elements lexicographically before `t` (those
//! that can be `<= t`) or after it (those that can be `>= t`).
//!
//! A batch of updates to one antichain ([`Antichain::update_batch`]) that is not small beside
//! its counts is merged into them in one pass and the frontier recomputed from the merged
//! counts (one pass for one and two coordinates, `n log n` for three, pairwise beyond), instead
//! of shifting the sorted counts once per time.

use crate::sorted::{consolidate_from, difference, dominated, merge, minimal_of, pair};
use crate::time::Time;

/// Counts per time and their frontier, as the tracker needs them; [`MutableAntichain`] is the
/// engine's, [`crate::pairwise::Pairwise`] the pairwise one it replaced.
pub trait Antichain<T: Time>: Default + std::fmt::Debug + Send + Sync {
    /// True when [`Antichain::update_batch`] costs less than one [`Antichain::update`] per
    /// time, so that the tracker should gather the work of many times per location.
    const BATCHED: bool;

    /// Adds `delta` to the count of `time` and appends the frontier's changes (`(time, +1)`
    /// entering, `(time, -1)` leaving) to `changes`: exactly the net change of the frontier.
    fn update(&mut self, time: &T, delta: i64, changes: &mut Vec<(T, i64)>);

    /// Applies `updates` (sorted by time, at most one per time) and appends the frontier's net
    /// changes to `changes`, sorted by time, at most one per time. `scratch` is working memory
    /// shared by many antichains.
    fn update_batch(&mut self, updates: &[(T, i64)], scratch: &mut Scratch<T>, changes: &mut Vec<(T, i64)>);

    /// The frontier (the minimal times with a positive count), sorted lexicographically.
    fn sorted_frontier(&self) -> Vec<T>;

    /// True iff some frontier element is `<= time`.
    fn less_equal(&self, time: &T) -> bool;

    /// Every non-zero count, sorted by time.
    fn counts(&self) -> &[(T, i64)];
}

/// Working memory for [`Antichain::update_batch`], kept by the tracker so that batches
/// allocate nothing once it has grown.
#[derive(Debug)]
pub struct Scratch<T> {
    counts: Vec<(T, i64)>,
    frontier: Vec<T>,
}

impl<T> Default for Scratch<T> {
    fn default() -> Self {
        Scratch { counts: Vec::new(), frontier: Vec::new() }
    }
}

/// Counts per time (sorted lexicographically) and the frontier: the minimal times with a
/// positive count, sorted lexicographically. Counts may go negative; only positive counts are
/// active.
#[derive(Clone, Debug)]
pub struct MutableAntichain<T> {
    counts: Vec<(T, i64)>,
    frontier: Vec<T>,
}

impl<T> Default for MutableAntichain<T> {
    fn default() -> Self {
        MutableAntichain { counts: Vec::new(), frontier: Vec::new() }
    }
}

impl<T: Time> MutableAntichain<T> {
    /// An antichain with no counts.
    pub fn new() -> Self {
        Self::default()
    }

    /// The frontier, sorted lexicographically.
    pub fn frontier(&self) -> &[T] {
        &self.frontier
    }

    /// True iff no count is non-zero.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// `time`, active and not dominated, joins the frontier; the elements it dominates leave.
    fn insert(&mut self, time: &T, changes: &mut Vec<(T, i64)>) {
        match time.coords().len() {
            1 => {
                // Not dominated: before the one element there may be, which leaves.
                match self.frontier.first_mut() {
                    Some(first) => changes.push((std::mem::replace(first, time.clone()), -1)),
                    None => self.frontier.push(time.clone()),
                }
            }
            2 => {
                // The elements it dominates follow it in a run: those whose second coordinate
                // is still >= its own.
                let start = self.frontier.partition_point(|f| f < time);
                let y = time.coords()[1];
                let run = self.frontier[start..].iter().take_while(|f| f.coords()[1] >= y).count();
                changes.extend(self.frontier[start..start + run].iter().map(|f| (f.clone(), -1)));
                if run == 0 {
                    self.frontier.insert(start, time.clone());
                } else {
                    self.frontier[start] = time.clone();
                    self.frontier.drain(start + 1..start + run);
                }
            }
            _ => {
                let start = self.frontier.partition_point(|f| f < time);
                let mut kept = start;
                for index in start..self.frontier.len() {
                    if time.less_equal(&self.frontier[index]) {
                        changes.push((self.frontier[index].clone(), -1));
                    } else {
                        self.frontier.swap(kept, index);
                        kept += 1;
                    }
                }
                self.frontier.truncate(kept);
                self.frontier.insert(start, time.clone());
            }
        }
        changes.push((time.clone(), 1));
    }

    /// Frontier element `self.frontier[at]` became inactive (its count's slot is `from`): it
    /// leaves, and the positive times only it dominated join.
    ///
    /// Only times lexicographically after it can have been dominated by it, so the scan of the
    /// counts starts at `from`. Two coordinates: the times freed lie between its neighbours,
    /// with a first coordinate below the next element's and a second below the previous
    /// element's, so the scan stops at the next element and keeps a staircase.
    fn remove(&mut self, at: usize, from: usize, changes: &mut Vec<(T, i64)>) {
        let arity = self.frontier[at].coords().len();
        changes.push((self.frontier[at].clone(), -1));
        let mut positive = self.counts[from..].iter().filter(|(_, count)| *count > 0).map(|(time, _)| time);
        let added_from = changes.len();
        match arity {
            1 => match positive.next() {
                // The least positive time, the only one that can join.
                Some(time) => {
                    changes.push((time.clone(), 1));
                    self.frontier[0] = time.clone();
                }
                None => self.frontier.clear(),
            },
            2 => {
                let limit = self.frontier.get(at + 1).map(|f| f.coords()[0]);
                let mut bound = at.checked_sub(1).map(|p| self.frontier[p].coords()[1]);
                for time in positive {
                    let (x, y) = pair(time);
                    if limit.is_some_and(|limit| x >= limit) {
                        break;
                    }
                    if bound.is_none_or(|bound| y < bound) {
                        changes.push((time.clone(), 1));
                        bound = Some(y);
                    }
                }
                // The new elements take its place, in order.
                match &changes[added_from..] {
                    [] => {
                        self.frontier.remove(at);
                    }
                    [(time, _)] => self.frontier[at] = time.clone(),
                    added => {
                        let added: Vec<T> = added.iter().map(|(time, _)| time.clone()).collect();
                        self.frontier.splice(at..at + 1, added);
                    }
                }
            }
            _ => {
                self.frontier.remove(at);
                let floor = |f: &T| {
                    let coords = f.coords();
                    coords[1..].iter().all(|&c| c == 0).then_some(coords[0])
                };
                let mut stop = self.frontier.iter().filter_map(floor).min().unwrap_or(u64::MAX);
                for time in positive {
                    if time.coords()[0] >= stop {
                        break;
                    }
                    if !dominated(&self.frontier, time)
                        && !changes[added_from..].iter().any(|(f, _)| f.less_equal(time))
                    {
                        if let Some(first) = floor(time) {
                            stop = stop.min(first);
                        }
                        changes.push((time.clone(), 1));
                    }
                }
                for (time, _) in &changes[added_from..] {
                    let position = self.frontier.partition_point(|f| f < time);
                    self.frontier.insert(position, time.clone());
                }
            }
        }
    }
}

impl<T: Time> Antichain<T> for MutableAntichain<T> {
    const BATCHED: bool = true;

    /// Only a change of a count's sign matters: a time becoming active joins unless dominated,
    /// and only a frontier element becoming inactive looks at other counts.
    fn update(&mut self, time: &T, delta: i64, changes: &mut Vec<(T, i64)>) {
        if delta == 0 {
            return;
        }
        let (old, new, index) = match self.counts.binary_search_by(|(t, _)| t.cmp(time)) {
            Ok(index) => {
                let old = self.counts[index].1;
                let new = old + delta;
                if new == 0 {
                    self.counts.remove(index);
                } else {
                    self.counts[index].1 = new;
                }
                (old, new, index)
            }
            Err(index) => {
                self.counts.insert(index, (time.clone(), delta));
                (0, delta, index)
            }
        };
        if (old > 0) == (new > 0) {
            return;
        }
        if new > 0 {
            if !dominated(&self.frontier, time) {
                self.insert(time, changes);
            }
        } else if let Ok(at) = self.frontier.binary_search(time) {
            self.remove(at, index, changes);
        }
    }

    /// Few updates beside many counts go one at a time; otherwise the counts are merged and the
    /// frontier recomputed, linear in the counts for one and two coordinates.
    fn update_batch(&mut self, updates: &[(T, i64)], scratch: &mut Scratch<T>, changes: &mut Vec<(T, i64)>) {
        if updates.len() < 2 || updates.len() * 8 < self.counts.len() {
            let from = changes.len();
            for (time, delta) in updates {
                self.update(time, *delta, changes);
            }
            consolidate_from(changes, from);
            return;
        }
        merge(&self.counts, updates, &mut scratch.counts);
        minimal_of(&scratch.counts, &mut scratch.frontier);
        difference(&self.frontier, &scratch.frontier, changes);
        std::mem::swap(&mut self.counts, &mut scratch.counts);
        std::mem::swap(&mut self.frontier, &mut scratch.frontier);
    }

    fn sorted_frontier(&self) -> Vec<T> {
        self.frontier.clone()
    }

    fn less_equal(&self, time: &T) -> bool {
        dominated(&self.frontier, time)
    }

    fn counts(&self) -> &[(T, i64)] {
        &self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sorted::consolidate;

    fn apply<T: Time>(m: &mut MutableAntichain<T>, time: T, delta: i64) -> Vec<(T, i64)> {
        let mut out = Vec::new();
        m.update(&time, delta, &mut out);
        out.sort();
        out
    }

    #[test]
    fn total_order() {
        let mut m = MutableAntichain::new();
        assert_eq!(apply(&mut m, [3u64], 1), vec![([3], 1)]);
        assert_eq!(apply(&mut m, [5u64], 1), vec![]);
        assert_eq!(apply(&mut m, [3u64], -1), vec![([3], -1), ([5], 1)]);
        assert_eq!(m.frontier(), &[[5]]);
        assert_eq!(apply(&mut m, [5u64], -1), vec![([5], -1)]);
        assert!(m.is_empty());
    }

    #[test]
    fn negative_counts_hold_nothing_back() {
        let mut m = MutableAntichain::new();
        assert_eq!(apply(&mut m, [2u64], -1), vec![]);
        assert_eq!(apply(&mut m, [4u64], 1), vec![([4], 1)]);
        assert_eq!(apply(&mut m, [2u64], 1), vec![]); // back to zero: still inactive
        assert_eq!(apply(&mut m, [2u64], 1), vec![([2], 1), ([4], -1)]);
        assert_eq!(m.counts(), &[([2], 1), ([4], 1)]);
    }

    #[test]
    fn staircase_of_two_coordinates() {
        let mut m = MutableAntichain::new();
        assert_eq!(apply(&mut m, [2u64, 0], 1), vec![([2, 0], 1)]);
        assert_eq!(apply(&mut m, [0u64, 2], 1), vec![([0, 2], 1)]);
        assert_eq!(apply(&mut m, [3u64, 3], 1), vec![]);
        assert_eq!(apply(&mut m, [1u64, 1], 1), vec![([1, 1], 1)]);
        assert_eq!(apply(&mut m, [0u64, 0], 1), vec![([0, 0], 1), ([0, 2], -1), ([1, 1], -1), ([2, 0], -1)]);
        assert_eq!(apply(&mut m, [0u64, 0], -1), vec![([0, 0], -1), ([0, 2], 1), ([1, 1], 1), ([2, 0], 1)]);
        assert_eq!(m.frontier(), &[[0, 2], [1, 1], [2, 0]]);
        assert_eq!(apply(&mut m, [1u64, 1], -1), vec![([1, 1], -1)]);
        assert_eq!(apply(&mut m, [0u64, 2], -1), vec![([0, 2], -1)]);
        assert!(m.less_equal(&[3, 4]) && !m.less_equal(&[1, 9]));
        assert_eq!(apply(&mut m, [2u64, 0], -1), vec![([2, 0], -1), ([3, 3], 1)]);
        // Removal frees only what lies between the neighbours, as a staircase.
        for t in [[1u64, 4], [1, 2], [2, 0], [2, 1], [4, 0], [5, 5], [0, 9], [1, 3]] {
            apply(&mut m, t, 1);
        }
        assert_eq!(m.frontier(), &[[0, 9], [1, 2], [2, 0]]);
        assert_eq!(apply(&mut m, [1u64, 2], -1), vec![([1, 2], -1), ([1, 3], 1)]);
        assert_eq!(apply(&mut m, [2u64, 0], -1), vec![([2, 0], -1), ([2, 1], 1), ([4, 0], 1)]);
        assert_eq!(apply(&mut m, [0u64, 9], -1), vec![([0, 9], -1)]);
        assert_eq!(m.frontier(), &[[1, 3], [2, 1], [4, 0]]);
    }

    #[test]
    fn batches_equal_one_update_at_a_time() {
        let mut batched = MutableAntichain::new();
        let mut single = MutableAntichain::new();
        let mut scratch = Scratch::default();
        let width = 50u64;
        let old: Vec<([u64; 2], i64)> = (0..=width).map(|i| ([i, width - i], 1)).collect();
        let mut changes = Vec::new();
        batched.update_batch(&old, &mut scratch, &mut changes);
        assert_eq!(changes, old);
        for (time, delta) in &old {
            single.update(time, *delta, &mut Vec::new());
        }
        // Retract every time and add it shifted, in one batch.
        let mut moved: Vec<([u64; 2], i64)> = old.iter().map(|(t, _)| (*t, -1)).collect();
        moved.extend(old.iter().map(|(t, _)| ([t[0] + 1, t[1] + 1], 1)));
        consolidate(&mut moved);
        changes.clear();
        batched.update_batch(&moved, &mut scratch, &mut changes);
        let mut expected = moved.clone();
        expected.sort();
        assert_eq!(changes, expected);
        for (time, delta) in &moved {
            single.update(time, *delta, &mut Vec::new());
        }
        assert_eq!(batched.frontier(), single.frontier());
        assert_eq!(batched.counts(), single.counts());
    }
}
