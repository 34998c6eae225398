//! Path summaries: what one transition does to a time.
//!
//! Every move of a time along a transition goes through [`Summary::results_in`], the one place
//! to change when transitions learn new tricks (scopes' ingress and egress, bounded loops that
//! let nothing through).

use crate::time::Time;

/// The increments a transition adds to every time crossing it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary<T> {
    increments: T,
}

impl<T: Time> Summary<T> {
    /// A summary adding `increments` coordinate-wise.
    pub fn new(increments: T) -> Self {
        Summary { increments }
    }

    /// True for the summary that changes nothing (an edge, a plain operator).
    pub fn is_identity(&self) -> bool {
        self.increments.is_zero()
    }

    /// The time a record at `time` carries after the transition, or `None` if it cannot pass.
    #[inline]
    pub fn results_in(&self, time: &T) -> Option<T> {
        Some(time.plus(&self.increments))
    }

    /// The increments, for display and tests.
    pub fn increments(&self) -> &T {
        &self.increments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_increments() {
        let s = Summary::new([0u64, 1]);
        assert_eq!(s.results_in(&[3, 4]), Some([3, 5]));
        assert!(!s.is_identity());
        assert!(Summary::new([0u64]).is_identity());
    }
}
