//! The engine's first antichain, kept as the reference the faster one is tested against and as
//! the comparison `Engine(..., pairwise=True)` offers (`python -m bench native`): every
//! dominance question is a scan of the whole frontier, and the frontier is unordered.

use crate::antichain::{Antichain, Scratch};
use crate::sorted::consolidate_from;
use crate::time::Time;

/// Counts per time (kept sorted lexicographically) and the frontier: the minimal times with a
/// positive count. Counts may go negative; only positive counts are active.
#[derive(Clone, Debug)]
pub struct Pairwise<T> {
    counts: Vec<(T, i64)>,
    frontier: Vec<T>,
}

impl<T> Default for Pairwise<T> {
    fn default() -> Self {
        Pairwise { counts: Vec::new(), frontier: Vec::new() }
    }
}

impl<T: Time> Pairwise<T> {
    /// An antichain with no counts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `delta` to the count of `time` and appends the frontier's changes
    /// (`(time, +1)` entering, `(time, -1)` leaving) to `changes`.
    ///
    /// Only a change of a count's sign matters: a time becoming active extends the frontier
    /// without looking at other counts, and only a frontier element becoming inactive rescans.
    pub fn update(&mut self, time: &T, delta: i64, changes: &mut Vec<(T, i64)>) {
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
            if self.frontier.iter().any(|f| f.less_equal(time)) {
                return;
            }
            let mut position = 0;
            while position < self.frontier.len() {
                if time.less_equal(&self.frontier[position]) {
                    changes.push((self.frontier.swap_remove(position), -1));
                } else {
                    position += 1;
                }
            }
            self.frontier.push(time.clone());
            changes.push((time.clone(), 1));
        } else if let Some(position) = self.frontier.iter().position(|f| f == time) {
            self.frontier.swap_remove(position);
            changes.push((time.clone(), -1));
            self.rebuild(index, changes);
        }
    }

    /// After frontier element `time` left (its count's slot was `from`): every remaining
    /// element stays minimal; add the positive times no longer dominated.
    ///
    /// Only times lexicographically after `time` can have been dominated by it, so the scan
    /// starts at `from`; counts are sorted, so no later time dominates an earlier one. It stops
    /// once a frontier element `f` with all but its first coordinate zero has `f[0] <= x[0]`
    /// for the scanned `x`: then `f` dominates `x` and everything after it (for one
    /// coordinate, at the first positive time).
    fn rebuild(&mut self, from: usize, changes: &mut Vec<(T, i64)>) {
        let kept = self.frontier.len();
        let floor = |f: &T| {
            let coords = f.coords();
            coords[1..].iter().all(|&c| c == 0).then_some(coords[0])
        };
        let mut stop = self.frontier.iter().filter_map(floor).min().unwrap_or(u64::MAX);
        for (time, count) in &self.counts[from..] {
            if time.coords()[0] >= stop {
                break;
            }
            if *count > 0 && !self.frontier.iter().any(|f| f.less_equal(time)) {
                if let Some(first) = floor(time) {
                    stop = stop.min(first);
                }
                self.frontier.push(time.clone());
            }
        }
        for time in &self.frontier[kept..] {
            changes.push((time.clone(), 1));
        }
    }

    /// The frontier, in no particular order.
    pub fn frontier(&self) -> &[T] {
        &self.frontier
    }

    /// The frontier, sorted lexicographically.
    pub fn sorted_frontier(&self) -> Vec<T> {
        let mut out = self.frontier.clone();
        out.sort();
        out
    }

    /// True iff some frontier element is `<= time`.
    pub fn less_equal(&self, time: &T) -> bool {
        self.frontier.iter().any(|f| f.less_equal(time))
    }

    /// Every non-zero count, sorted by time.
    pub fn counts(&self) -> &[(T, i64)] {
        &self.counts
    }

    /// True iff no count is non-zero.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

impl<T: Time> Antichain<T> for Pairwise<T> {
    const BATCHED: bool = false;

    fn update(&mut self, time: &T, delta: i64, changes: &mut Vec<(T, i64)>) {
        Pairwise::update(self, time, delta, changes);
    }

    /// One update at a time.
    fn update_batch(&mut self, updates: &[(T, i64)], _scratch: &mut Scratch<T>, changes: &mut Vec<(T, i64)>) {
        let from = changes.len();
        for (time, delta) in updates {
            Pairwise::update(self, time, *delta, changes);
        }
        consolidate_from(changes, from);
    }

    fn sorted_frontier(&self) -> Vec<T> {
        Pairwise::sorted_frontier(self)
    }

    fn less_equal(&self, time: &T) -> bool {
        Pairwise::less_equal(self, time)
    }

    fn counts(&self) -> &[(T, i64)] {
        Pairwise::counts(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply<T: Time>(m: &mut Pairwise<T>, time: T, delta: i64) -> Vec<(T, i64)> {
        let mut out = Vec::new();
        m.update(&time, delta, &mut out);
        out.sort();
        out
    }

    #[test]
    fn total_order() {
        let mut m = Pairwise::new();
        assert_eq!(apply(&mut m, [3u64], 1), vec![([3], 1)]);
        assert_eq!(apply(&mut m, [5u64], 1), vec![]);
        assert_eq!(apply(&mut m, [3u64], -1), vec![([3], -1), ([5], 1)]);
        assert_eq!(m.sorted_frontier(), vec![[5]]);
        assert_eq!(apply(&mut m, [5u64], -1), vec![([5], -1)]);
        assert!(m.is_empty());
    }

    #[test]
    fn negative_counts_hold_nothing_back() {
        let mut m = Pairwise::new();
        assert_eq!(apply(&mut m, [2u64], -1), vec![]);
        assert_eq!(apply(&mut m, [4u64], 1), vec![([4], 1)]);
        assert_eq!(apply(&mut m, [2u64], 1), vec![]); // back to zero: still inactive
        assert_eq!(apply(&mut m, [2u64], 1), vec![([2], 1), ([4], -1)]);
        assert_eq!(m.counts(), &[([2], 1), ([4], 1)]);
    }

    #[test]
    fn partial_order() {
        let mut m = Pairwise::new();
        assert_eq!(apply(&mut m, [2u64, 0], 1), vec![([2, 0], 1)]);
        assert_eq!(apply(&mut m, [0u64, 2], 1), vec![([0, 2], 1)]);
        assert_eq!(apply(&mut m, [3u64, 3], 1), vec![]);
        assert_eq!(apply(&mut m, [1u64, 1], 1), vec![([1, 1], 1)]);
        assert_eq!(apply(&mut m, [0u64, 0], 1), vec![([0, 0], 1), ([0, 2], -1), ([1, 1], -1), ([2, 0], -1)]);
        assert_eq!(apply(&mut m, [0u64, 0], -1), vec![([0, 0], -1), ([0, 2], 1), ([1, 1], 1), ([2, 0], 1)]);
        assert_eq!(apply(&mut m, [1u64, 1], -1), vec![([1, 1], -1)]);
        assert_eq!(apply(&mut m, [0u64, 2], -1), vec![([0, 2], -1)]);
        assert!(m.less_equal(&[3, 4]) && !m.less_equal(&[1, 9]));
        assert_eq!(m.sorted_frontier(), vec![[2, 0]]);
        assert_eq!(apply(&mut m, [2u64, 0], -1), vec![([2, 0], -1), ([3, 3], 1)]);
        // Rebuilding stops at a time with a zero tail, and skips what the others dominate.
        for t in [[1u64, 4], [1, 2], [2, 0], [2, 1], [4, 0], [5, 5]] {
            apply(&mut m, t, 1);
        }
        assert_eq!(m.sorted_frontier(), vec![[1, 2], [2, 0]]);
        assert_eq!(apply(&mut m, [1u64, 2], -1), vec![([1, 2], -1), ([1, 4], 1)]);
        assert_eq!(apply(&mut m, [2u64, 0], -1), vec![([2, 0], -1), ([2, 1], 1), ([4, 0], 1)]);
        assert_eq!(apply(&mut m, [2u64, 1], -1), vec![([2, 1], -1), ([3, 3], 1)]);
        assert_eq!(apply(&mut m, [1u64, 4], -1), vec![([1, 4], -1)]);
        assert_eq!(m.sorted_frontier(), vec![[3, 3], [4, 0]]);
    }
}
