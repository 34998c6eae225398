//! The graph as the tracker needs it: locations renumbered in a topological order of the
//! identity (zero-summary) transitions, and each location's outgoing transitions.

use std::fmt;

use crate::summary::Summary;
use crate::time::Time;

/// A transition given by the caller: from location `src` to location `dst` (indices as the
/// caller numbers them), with `summary` `None` (or all zeros) for an edge or plain operator.
#[derive(Clone, Debug)]
pub struct TransitionSpec {
    /// Index of the location the transition leaves.
    pub src: usize,
    /// Index of the location the transition enters.
    pub dst: usize,
    /// The increments, one per coordinate; `None` means all zero.
    pub summary: Option<Vec<u64>>,
}

/// Why a graph was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologyError {
    /// Arity zero.
    Arity,
    /// A transition names a location outside `0..locations`.
    UnknownLocation { transition: usize, location: usize },
    /// A summary has the wrong number of coordinates.
    SummaryArity { transition: usize, got: usize, arity: usize },
    /// The identity transitions form a cycle (a non-incrementing cycle), through this location.
    Cycle { location: usize },
    /// More locations than 32-bit indices hold.
    TooLarge,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyError::Arity => write!(f, "arity must be at least 1"),
            TopologyError::UnknownLocation { transition, location } => {
                write!(f, "transition {transition}: unknown location {location}")
            }
            TopologyError::SummaryArity { transition, got, arity } => {
                write!(f, "transition {transition}: summary has {got} coordinates, the arity is {arity}")
            }
            TopologyError::Cycle { location } => {
                write!(f, "graph has a non-incrementing cycle through location {location}")
            }
            TopologyError::TooLarge => write!(f, "too many locations"),
        }
    }
}

impl std::error::Error for TopologyError {}

/// One outgoing transition, in internal numbering.
#[derive(Clone, Debug)]
pub struct Step<T> {
    /// Internal position of the destination.
    pub dst: u32,
    /// `None` for an identity transition.
    pub summary: Option<Summary<T>>,
}

impl<T: Time> Step<T> {
    /// Where a time at the transition's source goes; `None` if nowhere.
    #[inline]
    pub fn advance(&self, time: &T) -> Option<T> {
        match &self.summary {
            None => Some(time.clone()),
            Some(summary) => summary.results_in(time),
        }
    }
}

/// Locations in internal order (a topological order of the identity transitions, so that
/// within one time every push goes to a later position) and their outgoing steps.
#[derive(Clone, Debug)]
pub struct Topology<T> {
    arity: usize,
    /// Internal position -> caller's index.
    external: Vec<u32>,
    /// Caller's index -> internal position.
    internal: Vec<u32>,
    /// `steps[offsets[p]..offsets[p + 1]]` leave position `p`.
    offsets: Vec<u32>,
    steps: Vec<Step<T>>,
}

impl<T: Time> Topology<T> {
    /// Builds the topology of `locations` locations, refusing identity cycles.
    pub fn new(arity: usize, locations: usize, transitions: &[TransitionSpec]) -> Result<Self, TopologyError> {
        if arity == 0 {
            return Err(TopologyError::Arity);
        }
        if locations >= u32::MAX as usize || transitions.len() >= u32::MAX as usize {
            return Err(TopologyError::TooLarge);
        }
        let mut summaries: Vec<Option<Summary<T>>> = Vec::with_capacity(transitions.len());
        for (index, spec) in transitions.iter().enumerate() {
            for location in [spec.src, spec.dst] {
                if location >= locations {
                    return Err(TopologyError::UnknownLocation { transition: index, location });
                }
            }
            let summary = match &spec.summary {
                None => None,
                Some(increments) if increments.len() != arity => {
                    return Err(TopologyError::SummaryArity { transition: index, got: increments.len(), arity });
                }
                Some(increments) => Some(Summary::new(T::from_coords(increments))).filter(|s| !s.is_identity()),
            };
            summaries.push(summary);
        }
        // Kahn's algorithm over the identity transitions; ties broken by the caller's index so
        // the numbering is deterministic.
        let mut indegree = vec![0usize; locations];
        let mut identity_out: Vec<Vec<usize>> = vec![Vec::new(); locations];
        for (spec, summary) in transitions.iter().zip(&summaries) {
            if summary.is_none() {
                indegree[spec.dst] += 1;
                identity_out[spec.src].push(spec.dst);
            }
        }
        let mut order: Vec<usize> = (0..locations).filter(|&l| indegree[l] == 0).collect();
        order.reverse();
        let mut external = Vec::with_capacity(locations);
        while let Some(location) = order.pop() {
            external.push(location as u32);
            for &next in identity_out[location].iter().rev() {
                indegree[next] -= 1;
                if indegree[next] == 0 {
                    order.push(next);
                }
            }
        }
        if external.len() < locations {
            let location = (0..locations).find(|&l| indegree[l] > 0).unwrap_or(0);
            return Err(TopologyError::Cycle { location });
        }
        let mut internal = vec![0u32; locations];
        for (position, &location) in external.iter().enumerate() {
            internal[location as usize] = position as u32;
        }
        let mut per_source: Vec<Vec<Step<T>>> = (0..locations).map(|_| Vec::new()).collect();
        for (spec, summary) in transitions.iter().zip(summaries) {
            per_source[internal[spec.src] as usize].push(Step { dst: internal[spec.dst], summary });
        }
        let mut offsets = Vec::with_capacity(locations + 1);
        let mut steps = Vec::with_capacity(transitions.len());
        offsets.push(0u32);
        for out in per_source {
            steps.extend(out);
            offsets.push(steps.len() as u32);
        }
        Ok(Topology { arity, external, internal, offsets, steps })
    }

    /// The number of coordinates of every time.
    pub fn arity(&self) -> usize {
        self.arity
    }

    /// The number of locations.
    pub fn len(&self) -> usize {
        self.external.len()
    }

    /// True for a graph without locations.
    pub fn is_empty(&self) -> bool {
        self.external.is_empty()
    }

    /// The caller's index of internal position `position`.
    #[inline]
    pub fn external(&self, position: usize) -> u32 {
        self.external[position]
    }

    /// The internal position of the caller's index `location`.
    #[inline]
    pub fn internal(&self, location: usize) -> usize {
        self.internal[location] as usize
    }

    /// The transitions leaving internal position `position`.
    #[inline]
    pub fn steps(&self, position: usize) -> &[Step<T>] {
        &self.steps[self.offsets[position] as usize..self.offsets[position + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(src: usize, dst: usize, summary: Option<Vec<u64>>) -> TransitionSpec {
        TransitionSpec { src, dst, summary }
    }

    #[test]
    fn identity_transitions_go_forward_in_internal_order() {
        // 3 -> 2 -> 1 -> 0, and 0 -> 3 with +1.
        let transitions = [spec(3, 2, None), spec(2, 1, Some(vec![0])), spec(1, 0, None), spec(0, 3, Some(vec![1]))];
        let topology = Topology::<[u64; 1]>::new(1, 4, &transitions).unwrap();
        for position in 0..4 {
            for step in topology.steps(position) {
                if step.summary.is_none() {
                    assert!(step.dst as usize > position);
                }
            }
            assert_eq!(topology.internal(topology.external(position) as usize), position);
        }
        assert_eq!(topology.steps(topology.internal(0))[0].advance(&[5]), Some([6]));
    }

    #[test]
    fn refuses_bad_graphs() {
        let cycle = [spec(0, 1, None), spec(1, 0, Some(vec![0, 0]))];
        assert_eq!(Topology::<[u64; 2]>::new(2, 2, &cycle).unwrap_err(), TopologyError::Cycle { location: 0 });
        let unknown = [spec(0, 5, None)];
        assert!(matches!(
            Topology::<[u64; 1]>::new(1, 2, &unknown),
            Err(TopologyError::UnknownLocation { transition: 0, location: 5 })
        ));
        let arity = [spec(0, 1, Some(vec![1]))];
        assert!(matches!(Topology::<[u64; 2]>::new(2, 2, &arity), Err(TopologyError::SummaryArity { .. })));
        assert_eq!(Topology::<[u64; 1]>::new(0, 2, &[]).unwrap_err(), TopologyError::Arity);
    }
}
