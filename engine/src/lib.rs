//! `progress_engine`: the compiled incremental progress tracker of the timely progress service.
//!
//! It maintains, for one dataflow graph, the occurrence count of every pointstamp
//! `(location, time)` and every location's frontier (the minimal times that positive-count
//! pointstamps could-result-in there), and turns each atomic batch of count changes into the
//! exact, consolidated frontier changes it causes, sorted by (time, location), exactly as the
//! Python reference `tracker.reachability.Tracker` does.
//!
//! Design. The graph arrives as plain integers (locations `0..n`, transitions
//! `(src, dst, summary)`), already checked for non-incrementing cycles by the caller
//! ([`topology`] refuses identity cycles too). Locations are renumbered in a topological order
//! of the identity transitions, and each keeps two [`antichain::MutableAntichain`]s: its
//! pointstamps, and its implications (one count per frontier element of its own pointstamps and
//! of each predecessor's implications moved along the connecting transition), as in timely's
//! `reachability::Tracker`. A batch updates pointstamps first (many updates at one location at
//! once); their frontier changes become work at `(time, location)`.
//! [`tracker::Tracker::propagate`] settles work in rounds: the least pending time (in the
//! lexicographic order, a linear extension of the product order) with every pending time
//! incomparable to all others before it, and within a round in topological position: identity
//! transitions lead to later positions and every other transition strictly advances the time,
//! so each `(time, location)` is settled exactly once with all its contributions summed, and
//! transient support around loops cancels. A round of one time keeps net diffs per position
//! ([`pending::Pending`]); a round of many (a wide antichain moving) keeps lists per position
//! ([`round::Round`]) that each location's antichain takes at once, merging them into its
//! counts and recomputing its frontier in one pass. Frontiers are kept sorted ([`sorted`]):
//! with two coordinates an antichain is a staircase, and dominance is a binary search.
//! Frontier changes are collected per time ([`groups::TimeGroups`]) and drained consolidated
//! into flat storage ([`batch::Changes`]), from which the Python layer encodes lists or the JSON
//! payload ([`json::Fragments`]) for all locations or a [`selection::Selection`]. Times are
//! [`time::Time`]s: `[u64; N]` for arities 1 to 4 (no allocation), [`time::DynTime`] beyond.
//! The tracker is generic over its antichain: [`pairwise::Pairwise`] is the one the engine had
//! before (every dominance question a scan of the frontier, one time per round), kept as the
//! reference of the Rust tests and for comparisons (`Engine(..., pairwise=True)`).
//!
//! Scopes (later). Every move of a time along a transition goes through
//! [`topology::Step::advance`] and [`summary::Summary::results_in`]; the tracker is generic over
//! the time type. Nested scopes can then be per-scope trackers wired like timely's subgraphs
//! (each with its own time type, the parent seeing a scope's summaries), or one flattened
//! tracker whose ingress and egress steps extend and truncate times inside `advance`, given a
//! time type of variable arity (as [`time::DynTime`]) and an order that still puts every
//! non-identity step strictly later.
//!
//! The Python module (feature `python`, built by maturin) exposes `Engine` (construction from
//! integers, `apply_indexed` over flat integer sequences or buffers, `apply` over labelled
//! updates, frontier queries), `ChangeBatch` and `Selection`; `tracker/compiled.py` wraps it
//! with the reference tracker's interface. Beside the tracker, the service's wall-clock
//! bookkeeping per location and pointstamp lives here too, so that it costs no Python object per
//! change or update: `MovedAt` (when each frontier last moved) and `Births` ([`births`]: when
//! each live pointstamp was born, and who last touched it); and `split_members` ([`split`]), which
//! finds a JSON registration body's members and list elements without the GIL.

pub mod antichain;
pub mod batch;
pub mod births;
pub mod groups;
pub mod json;
pub mod pairwise;
pub mod pending;
#[cfg(feature = "python")]
mod python;
pub mod round;
pub mod selection;
pub mod sorted;
pub mod split;
pub mod summary;
pub mod time;
pub mod topology;
pub mod tracker;
