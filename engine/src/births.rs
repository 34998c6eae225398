//! Births of live pointstamps: when each `(location, time)` count last became positive, and
//! which worker last touched it (the service's lag and blame answers).
//!
//! Fed every durable batch in log order, as flat integers (the form the engine applies), so a
//! batch costs no Python object per update. A batch is atomic: its updates to one pointstamp
//! are summed first, so a batch that retires and re-reports a live pointstamp (`-1`, `+1`) does
//! not make it newborn.

use std::collections::HashMap;

/// One pointstamp's net count, the arrival of the batch that last made it positive, and the
/// worker (an id the caller interns) of the last batch that touched it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Birth {
    pub count: i64,
    pub born: f64,
    pub worker: u32,
}

/// Every pointstamp with a non-zero net count, with its [`Birth`], by location then time (so
/// that a live pointstamp is found by its borrowed time, without building a key).
#[derive(Clone, Debug, Default)]
pub struct Births {
    arity: usize,
    entries: HashMap<u32, HashMap<Box<[i64]>, Birth>>,
}

impl Births {
    /// No pointstamps, times of `arity` coordinates.
    pub fn new(arity: usize) -> Self {
        Births { arity, entries: HashMap::new() }
    }

    /// Folds one batch received at `at` from `worker`: update `i` is `deltas[i]` at location
    /// `locations[i]` and time `times[i * arity..(i + 1) * arity]` (the caller checked the
    /// lengths). A pointstamp whose count goes from zero or below to above zero is born at
    /// `at`; every pointstamp the batch names is last touched by `worker`; one whose count is
    /// back at zero is forgotten.
    pub fn add(&mut self, locations: &[i64], times: &[i64], deltas: &[i64], at: f64, worker: u32) {
        let mut net: HashMap<(u32, &[i64]), i64> = HashMap::with_capacity(locations.len());
        for (i, (&location, &delta)) in locations.iter().zip(deltas).enumerate() {
            *net.entry((location as u32, &times[i * self.arity..(i + 1) * self.arity])).or_insert(0) += delta;
        }
        for ((location, time), delta) in net {
            let at_location = self.entries.entry(location).or_default();
            match at_location.get_mut(time) {
                Some(entry) => {
                    let before = entry.count;
                    entry.count += delta;
                    entry.worker = worker;
                    if entry.count == 0 {
                        at_location.remove(time);
                    } else if before <= 0 && entry.count > 0 {
                        entry.born = at;
                    }
                }
                None if delta != 0 => {
                    at_location.insert(Box::from(time), Birth { count: delta, born: at, worker });
                }
                None => {}
            }
            if at_location.is_empty() {
                self.entries.remove(&location);
            }
        }
    }

    /// The pointstamp's birth if its count is positive.
    pub fn get(&self, location: u32, time: &[i64]) -> Option<Birth> {
        self.entries.get(&location)?.get(time).copied().filter(|birth| birth.count > 0)
    }

    /// For every location holding positive counts, the pointstamp born first (the least time
    /// among those born at the same instant): `(location, time, birth)`, by location.
    pub fn oldest_by_location(&self) -> Vec<(u32, &[i64], Birth)> {
        let mut found: Vec<(u32, &[i64], Birth)> = self
            .entries
            .iter()
            .filter_map(|(&location, times)| {
                times
                    .iter()
                    .filter(|(_, birth)| birth.count > 0)
                    .min_by(|a, b| a.1.born.total_cmp(&b.1.born).then_with(|| a.0.cmp(b.0)))
                    .map(|(time, birth)| (location, &time[..], *birth))
            })
            .collect();
        found.sort_by_key(|entry| entry.0);
        found
    }

    /// The number of coordinates of every time.
    pub fn arity(&self) -> usize {
        self.arity
    }

    /// Pointstamps with a non-zero count.
    pub fn len(&self) -> usize {
        self.entries.values().map(HashMap::len).sum()
    }

    /// Whether no pointstamp has a non-zero count.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every pointstamp.
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn born_when_positive_forgotten_at_zero_atomic_per_batch() {
        let mut births = Births::new(1);
        births.add(&[3], &[0], &[1], 10.0, 1);
        births.add(&[3, 3], &[0, 1], &[1, 1], 20.0, 2);
        assert_eq!(births.get(3, &[0]), Some(Birth { count: 2, born: 10.0, worker: 2 }));
        births.add(&[3, 3], &[0, 0], &[-2, 2], 30.0, 1); // net zero: still live, not newborn
        assert_eq!(births.get(3, &[0]), Some(Birth { count: 2, born: 10.0, worker: 1 }));
        births.add(&[3], &[0], &[-2], 40.0, 1);
        assert_eq!(births.get(3, &[0]), None);
        assert_eq!(births.oldest_by_location(), vec![(3, &[1i64][..], Birth { count: 1, born: 20.0, worker: 2 })]);
        births.add(&[5], &[7], &[-1], 50.0, 3); // negative: kept, not live
        assert_eq!((births.get(5, &[7]), births.len()), (None, 2));
        births.add(&[5], &[7], &[2], 60.0, 4); // positive now: born
        assert_eq!(births.get(5, &[7]), Some(Birth { count: 1, born: 60.0, worker: 4 }));
    }

    #[test]
    fn oldest_prefers_the_earliest_birth_then_the_least_time() {
        let mut births = Births::new(2);
        births.add(&[0, 0, 1], &[2, 0, 1, 1, 0, 0], &[1, 1, 1], 5.0, 0);
        births.add(&[1], &[0, 0], &[0], 6.0, 0);
        births.add(&[1], &[0, 1], &[1], 4.0, 0);
        let oldest = births.oldest_by_location();
        assert_eq!(oldest[0].0, 0);
        assert_eq!(oldest[0].1, &[1, 1]);
        assert_eq!((oldest[1].0, oldest[1].1, oldest[1].2.born), (1, &[0i64, 1][..], 4.0));
    }
}
