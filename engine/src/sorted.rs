//! Operations on sorted times: counts sorted by time, and antichains sorted lexicographically
//! (the frontiers of [`crate::antichain::MutableAntichain`]).
//!
//! Sorted lexicographically, an antichain of two coordinates is a staircase: its first
//! coordinates strictly increase and its second ones strictly decrease. That turns "is `t`
//! dominated" into a binary search, and the minimal times of a sorted set into one pass keeping
//! the least second coordinate seen (for three coordinates, the least pairs of the last two, in
//! a staircase of their own).

use std::collections::BTreeMap;

use crate::time::Time;

/// Sorts `updates` by time, sums the deltas of equal times and drops those that sum to zero.
pub fn consolidate<T: Time>(updates: &mut Vec<(T, i64)>) {
    consolidate_from(updates, 0);
}

/// [`consolidate`] of `updates[from..]`, leaving `updates[..from]` as it is.
pub fn consolidate_from<T: Time>(updates: &mut Vec<(T, i64)>, from: usize) {
    let tail = &mut updates[from..];
    if !tail.windows(2).all(|w| w[0].0 <= w[1].0) {
        tail.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    }
    let mut kept = from;
    for index in from..updates.len() {
        if kept > from && updates[kept - 1].0 == updates[index].0 {
            updates[kept - 1].1 += updates[index].1;
        } else {
            if kept > from && updates[kept - 1].1 == 0 {
                kept -= 1;
            }
            updates.swap(kept, index);
            kept += 1;
        }
    }
    if kept > from && updates[kept - 1].1 == 0 {
        kept -= 1;
    }
    updates.truncate(kept);
}

/// The two coordinates of a time of arity 2.
#[inline]
pub(crate) fn pair<T: Time>(time: &T) -> (u64, u64) {
    let coords = time.coords();
    (coords[0], coords[1])
}

/// True iff some element of `frontier` (sorted, an antichain) is `<= time`.
#[inline]
pub(crate) fn dominated<T: Time>(frontier: &[T], time: &T) -> bool {
    match time.coords().len() {
        1 => frontier.first().is_some_and(|f| f.coords()[0] <= time.coords()[0]),
        2 => {
            // The last element whose first coordinate is <= time's has the least second
            // coordinate of all of them.
            let (x, y) = pair(time);
            let end = frontier.partition_point(|f| f.coords()[0] <= x);
            end > 0 && frontier[end - 1].coords()[1] <= y
        }
        _ => {
            let end = frontier.partition_point(|f| f <= time);
            frontier[..end].iter().any(|f| f.less_equal(time))
        }
    }
}

/// The minimal times of the positive counts in `counts` (sorted by time), in order, into `out`.
pub(crate) fn minimal_of<T: Time>(counts: &[(T, i64)], out: &mut Vec<T>) {
    out.clear();
    let positive = counts.iter().filter(|(_, count)| *count > 0).map(|(time, _)| time);
    let Some(first) = counts.first() else { return };
    match first.0.coords().len() {
        1 => out.extend(positive.take(1).cloned()),
        2 => {
            let mut least = u64::MAX;
            for time in positive {
                let (_, y) = pair(time);
                if out.is_empty() || y < least {
                    out.push(time.clone());
                    least = y;
                    if y == 0 {
                        break; // everything after it has a first coordinate at least as large
                    }
                }
            }
        }
        3 => {
            // Every time <= this one comes before it, so it is minimal iff no minimal time
            // before it is <= it in the last two coordinates: a staircase of those pairs,
            // `z` strictly decreasing as `y` increases, answers in a logarithmic look.
            let mut stairs: BTreeMap<u64, u64> = BTreeMap::new();
            for time in positive {
                let (y, z) = (time.coords()[1], time.coords()[2]);
                if stairs.range(..=y).next_back().is_some_and(|(_, &low)| low <= z) {
                    continue;
                }
                let gone: Vec<u64> = stairs.range(y..).take_while(|(_, &high)| high >= z).map(|(&k, _)| k).collect();
                for key in gone {
                    stairs.remove(&key);
                }
                stairs.insert(y, z);
                out.push(time.clone());
            }
        }
        _ => {
            // An element whose coordinates after the first are all zero dominates every later
            // time whose first coordinate is at least its own.
            let mut stop = u64::MAX;
            for time in positive {
                let coords = time.coords();
                if coords[0] >= stop {
                    break;
                }
                if !out.iter().any(|f| f.less_equal(time)) {
                    if coords[1..].iter().all(|&c| c == 0) {
                        stop = coords[0];
                    }
                    out.push(time.clone());
                }
            }
        }
    }
}

/// `counts` and `updates` (both sorted by time) summed per time, zero sums dropped, into `out`.
pub(crate) fn merge<T: Time>(counts: &[(T, i64)], updates: &[(T, i64)], out: &mut Vec<(T, i64)>) {
    out.clear();
    out.reserve(counts.len() + updates.len());
    let (mut i, mut j) = (0, 0);
    while i < counts.len() && j < updates.len() {
        match counts[i].0.cmp(&updates[j].0) {
            std::cmp::Ordering::Less => {
                out.push(counts[i].clone());
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                if updates[j].1 != 0 {
                    out.push(updates[j].clone());
                }
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let sum = counts[i].1 + updates[j].1;
                if sum != 0 {
                    out.push((counts[i].0.clone(), sum));
                }
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&counts[i..]);
    out.extend(updates[j..].iter().filter(|(_, delta)| *delta != 0).cloned());
}

/// The changes from frontier `old` to frontier `new` (both sorted), in order, into `changes`.
pub(crate) fn difference<T: Time>(old: &[T], new: &[T], changes: &mut Vec<(T, i64)>) {
    let (mut i, mut j) = (0, 0);
    while i < old.len() && j < new.len() {
        match old[i].cmp(&new[j]) {
            std::cmp::Ordering::Less => {
                changes.push((old[i].clone(), -1));
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                changes.push((new[j].clone(), 1));
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
            }
        }
    }
    changes.extend(old[i..].iter().map(|t| (t.clone(), -1)));
    changes.extend(new[j..].iter().map(|t| (t.clone(), 1)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consolidation() {
        let mut updates = vec![([3u64], 1), ([1], 2), ([3], -1), ([2], 0), ([1], 1), ([0], -1), ([0], 1)];
        consolidate(&mut updates);
        assert_eq!(updates, vec![([1], 3)]);
        let mut updates = vec![([5u64], 1), ([5], -1)];
        consolidate(&mut updates);
        assert!(updates.is_empty());
    }

    #[test]
    fn dominance_in_a_staircase() {
        let stairs = [[0u64, 9], [2, 5], [4, 1]];
        assert!(dominated(&stairs, &[2, 5]) && dominated(&stairs, &[3, 7]) && dominated(&stairs, &[9, 1]));
        assert!(!dominated(&stairs, &[1, 8]) && !dominated(&stairs, &[3, 4]) && !dominated(&stairs, &[9, 0]));
        assert!(dominated(&[[3u64]], &[4]) && !dominated(&[[3u64]], &[2]) && !dominated::<[u64; 1]>(&[], &[2]));
        let three = [[0u64, 2, 2], [1, 0, 5], [1, 1, 0]];
        assert!(dominated(&three, &[1, 2, 2]) && !dominated(&three, &[0, 9, 1]));
    }

    #[test]
    fn minimal_times_of_sorted_counts() {
        let mut out = Vec::new();
        let counts = [([0u64, 5], 1), ([0, 6], 1), ([1, 3], -1), ([2, 4], 2), ([3, 4], 1), ([4, 0], 1), ([5, 0], 1)];
        minimal_of(&counts, &mut out);
        assert_eq!(out, vec![[0, 5], [2, 4], [4, 0]]);
        let counts =
            [([0u64, 2, 2], 1), ([0, 3, 1], 1), ([1, 2, 2], 1), ([1, 3, 0], 1), ([2, 0, 9], 1), ([2, 3, 1], 1)];
        let mut three = Vec::new();
        minimal_of(&counts, &mut three);
        assert_eq!(three, vec![[0, 2, 2], [0, 3, 1], [1, 3, 0], [2, 0, 9]]);
        let mut one = Vec::new();
        minimal_of(&[([3u64], -1), ([4], 2), ([5], 1)], &mut one);
        assert_eq!(one, vec![[4]]);
    }

    #[test]
    fn merged_counts_and_frontier_differences() {
        let mut out = Vec::new();
        merge(&[([1u64], 2), ([3], 1)], &[([0], 1), ([1], -2), ([4], 0), ([5], 1)], &mut out);
        assert_eq!(out, vec![([0], 1), ([3], 1), ([5], 1)]);
        let mut changes = Vec::new();
        difference(&[[0u64, 3], [1, 2], [3, 0]], &[[0, 3], [2, 1], [3, 0], [4, 0]], &mut changes);
        assert_eq!(changes, vec![([1, 2], -1), ([2, 1], 1), ([4, 0], 1)]);
    }
}
