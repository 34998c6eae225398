//! Signed counts per time and the frontier they imply, reporting exactly how it moves.

use crate::time::Time;

/// Counts per time (kept sorted lexicographically) and the frontier: the minimal times with a
/// positive count. Counts may go negative; only positive counts are active.
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

    /// Adds `delta` to the count of `time` and appends the frontier's changes
    /// (`(time, +1)` entering, `(time, -1)` leaving) to `changes`.
    ///
    /// Only a change of a count's sign matters: a time becoming active extends the frontier
    /// without looking at other counts, and only a frontier element becoming inactive rescans.
    pub fn update(&mut self, time: &T, delta: i64, changes: &mut Vec<(T, i64)>) {
        if delta == 0 {
            return;
        }
        let (old, new) = match self.counts.binary_search_by(|(t, _)| t.cmp(time)) {
            Ok(index) => {
                let old = self.counts[index].1;
                let new = old + delta;
                if new == 0 {
                    self.counts.remove(index);
                } else {
                    self.counts[index].1 = new;
                }
                (old, new)
            }
            Err(index) => {
                self.counts.insert(index, (time.clone(), delta));
                (0, delta)
            }
        };
        if (old > 0) == (new > 0) {
            return;
        }
        if new > 0 {
            if self.frontier.iter().any(|f| f.less_equal(time)) {
                return;
            }
            let mut index = 0;
            while index < self.frontier.len() {
                if time.less_equal(&self.frontier[index]) {
                    changes.push((self.frontier.swap_remove(index), -1));
                } else {
                    index += 1;
                }
            }
            self.frontier.push(time.clone());
            changes.push((time.clone(), 1));
        } else if let Some(index) = self.frontier.iter().position(|f| f == time) {
            self.frontier.swap_remove(index);
            changes.push((time.clone(), -1));
            self.rebuild(changes);
        }
    }

    /// After a frontier element left: every remaining element stays minimal; add the positive
    /// times no longer dominated. Counts are sorted, so no later time dominates an earlier one.
    fn rebuild(&mut self, changes: &mut Vec<(T, i64)>) {
        let kept = self.frontier.len();
        for (time, count) in &self.counts {
            if *count > 0 && !self.frontier.iter().any(|f| f.less_equal(time)) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(m.sorted_frontier(), vec![[5]]);
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
    fn partial_order() {
        let mut m = MutableAntichain::new();
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
    }
}
