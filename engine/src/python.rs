//! The Python module `progress_engine`: `Engine`, `ChangeBatch`, `Selection`.
//!
//! Nothing here builds a Python object per update: batches come in as three flat integer
//! sequences (lists or buffers such as `array('q')`), and changes go out as a compiled
//! `ChangeBatch` that encodes its JSON payload in one pass, for all locations or a selection.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyIndexError, PyKeyError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict, PyList, PySet, PyString, PyTuple, PyType};

use crate::batch::{Changes, Columns, ColumnsError};
use crate::births::Births;
use crate::json::Fragments;
use crate::pairwise::Pairwise;
use crate::selection::Selection;
use crate::split;
use crate::time::{DynTime, Time};
use crate::topology::TransitionSpec;
use crate::tracker::Tracker;

/// A tracker of one arity; the common arities get fixed-size times. The `P` variants keep
/// the pairwise antichains and one time per round (`Engine(..., pairwise=True)`), for
/// comparisons.
enum Inner {
    A1(Tracker<[u64; 1]>),
    A2(Tracker<[u64; 2]>),
    A3(Tracker<[u64; 3]>),
    A4(Tracker<[u64; 4]>),
    Dyn(Tracker<DynTime>),
    P1(Tracker<[u64; 1], Pairwise<[u64; 1]>>),
    P2(Tracker<[u64; 2], Pairwise<[u64; 2]>>),
    P3(Tracker<[u64; 3], Pairwise<[u64; 3]>>),
    P4(Tracker<[u64; 4], Pairwise<[u64; 4]>>),
    PDyn(Tracker<DynTime, Pairwise<DynTime>>),
}

macro_rules! dispatch {
    ($inner:expr, $tracker:ident => $body:expr) => {
        match $inner {
            Inner::A1($tracker) => $body,
            Inner::A2($tracker) => $body,
            Inner::A3($tracker) => $body,
            Inner::A4($tracker) => $body,
            Inner::Dyn($tracker) => $body,
            Inner::P1($tracker) => $body,
            Inner::P2($tracker) => $body,
            Inner::P3($tracker) => $body,
            Inner::P4($tracker) => $body,
            Inner::PDyn($tracker) => $body,
        }
    };
}

/// What the batches of one engine share: the labels and JSON fragments of its locations.
struct Shared {
    labels: Option<Vec<Py<PyAny>>>,
    fragments: Option<Fragments>,
}

/// Integers from a list, a tuple, a buffer of 64-bit integers, or any iterable.
fn read_ints(values: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if let Ok(list) = values.cast::<PyList>() {
        // The hot path (a batch parsed from JSON): borrowed items and no Bound per element.
        let len = list.len();
        let mut out = Vec::with_capacity(len);
        for index in 0..len {
            // SAFETY: `list` is a live list and the GIL is held; `PyList_GetItem` checks the
            // index (the list could shrink if a non-int's `__index__` runs Python code) and
            // returns a borrowed reference, used before any other Python code runs.
            let value = unsafe {
                let item = ffi::PyList_GetItem(list.as_ptr(), index as ffi::Py_ssize_t);
                if item.is_null() {
                    return Err(PyErr::fetch(values.py()));
                }
                ffi::PyLong_AsLongLong(item)
            };
            if value == -1 {
                if let Some(error) = PyErr::take(values.py()) {
                    return Err(error);
                }
            }
            out.push(value);
        }
        return Ok(out);
    }
    if let Ok(tuple) = values.cast::<PyTuple>() {
        return tuple.iter().map(|x| x.extract::<i64>()).collect();
    }
    if let Ok(buffer) = PyBuffer::<i64>::get(values) {
        return buffer.to_vec(values.py());
    }
    values.try_iter()?.map(|x| x?.extract::<i64>()).collect()
}

/// One time's coordinates appended to `out`, checked against `arity`; `Err` says why not.
fn read_time(time: &Bound<'_, PyAny>, arity: usize, out: &mut Vec<u64>) -> Result<(), String> {
    let start = out.len();
    let mut push = |x: Bound<'_, PyAny>| -> Result<(), String> {
        match x.extract::<i64>() {
            Ok(c) if c >= 0 => {
                out.push(c as u64);
                Ok(())
            }
            _ => Err(format!("time coordinates must be non-negative integers, got {x}")),
        }
    };
    if let Ok(tuple) = time.cast::<PyTuple>() {
        tuple.iter().try_for_each(&mut push)?;
    } else if let Ok(list) = time.cast::<PyList>() {
        list.iter().try_for_each(&mut push)?;
    } else {
        return Err(format!("a time must be a tuple or list of {arity} integers, got {time}"));
    }
    let got = out.len() - start;
    if got != arity {
        return Err(format!("time has {got} coordinates, the arity is {arity}"));
    }
    Ok(())
}

/// A batch given as flat integers (`locations[i]`, the time `times[i * arity:(i + 1) * arity]`,
/// `deltas[i]`), read and its lengths checked: `ValueError` if they disagree.
fn read_batch(
    locations: &Bound<'_, PyAny>,
    times: &Bound<'_, PyAny>,
    deltas: &Bound<'_, PyAny>,
    arity: usize,
) -> PyResult<(Vec<i64>, Vec<i64>, Vec<i64>)> {
    let (locations, times, deltas) = (read_ints(locations)?, read_ints(times)?, read_ints(deltas)?);
    if deltas.len() != locations.len() || times.len() != locations.len() * arity {
        return Err(PyValueError::new_err(format!(
            "{} locations need {} deltas and {} time coordinates (arity {arity}), got {} and {}",
            locations.len(),
            locations.len(),
            locations.len() * arity,
            deltas.len(),
            times.len()
        )));
    }
    Ok((locations, times, deltas))
}

fn time_tuple<'py>(py: Python<'py>, coords: &[u64]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, coords)
}

/// The incremental progress tracker of one dataflow graph.
///
/// `Engine(arity, locations, transitions, *, labels=None, json=None)`: locations are the
/// indices `0..locations`; `transitions` is a sequence of `(src, dst, summary)` with `summary`
/// a sequence of `arity` non-negative increments, or `None` for zero (an edge). The graph must
/// have no cycle of zero summaries (checked: `ValueError`). `labels` (one Python object per
/// location, e.g. `Location` tuples) lets `apply` take labelled updates and `to_list`
/// return labels; `json` (one JSON text per location, as a sequence of strings or as one
/// string joined by `"\n"`, which no fragment may then contain, `""` joining none) lets
/// batches encode their payload. The joined form is read without copying it while the GIL is
/// held. `pairwise=True` builds the engine as it was before wide antichains were cheap
/// (pairwise antichains, one time per propagation round): the same results, for comparisons
/// (`python -m bench native`).
#[pyclass(module = "progress_engine", name = "Engine")]
pub struct Engine {
    /// Behind a lock so that a batch can be propagated by a thread without the GIL while the
    /// event loop reads other things of this engine (its labels, its index): every method
    /// takes `&self`, and a read that meets a propagation waits for it (never a half-applied
    /// state).
    inner: Mutex<Inner>,
    arity: usize,
    locations: usize,
    shared: Arc<Shared>,
    index: Option<Py<PyDict>>,
}

impl Engine {
    /// Applies validated flat updates and returns their changes.
    fn run(&self, locations: &[i64], times: &[u64], deltas: &[i64]) -> ChangeBatch {
        let arity = self.arity;
        let mut changes = Changes::new(arity);
        let mut regressions = Vec::new();
        dispatch!(&mut *self.locked(), tracker => {
            for (index, (&location, &delta)) in locations.iter().zip(deltas).enumerate() {
                let time = Time::from_coords(&times[index * arity..(index + 1) * arity]);
                // Staged updates reach the frontiers only in `propagate`: this is the frontier
                // before the batch.
                if delta > 0 && !tracker.less_equal(location as usize, &time) {
                    regressions.push(index as u32);
                }
                tracker.update(location as usize, &time, delta);
            }
            tracker.propagate(&mut changes);
        });
        let mut batch = ChangeBatch::new(changes, self.shared.clone());
        batch.regressions = regressions;
        batch
    }

    /// The tracker, once no other thread propagates into it. A panic while propagating leaves
    /// the tracker's state unknown: the lock stays poisoned and this panics too (a Python
    /// exception), rather than serve frontiers from a half-applied batch.
    fn locked(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("the engine's state is unknown after a panic while propagating")
    }

    fn check_location(&self, location: i64) -> PyResult<usize> {
        if location < 0 || location as usize >= self.locations {
            return Err(PyIndexError::new_err(format!("location {location} out of range 0..{}", self.locations)));
        }
        Ok(location as usize)
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (arity, locations, transitions, *, labels=None, json=None, index=None, pairwise=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        arity: usize,
        locations: usize,
        transitions: Vec<(usize, usize, Option<Vec<u64>>)>,
        labels: Option<Vec<Py<PyAny>>>,
        json: Option<Bound<'_, PyAny>>,
        index: Option<Bound<'_, PyDict>>,
        pairwise: bool,
    ) -> PyResult<Self> {
        let specs: Vec<TransitionSpec> =
            transitions.into_iter().map(|(src, dst, summary)| TransitionSpec { src, dst, summary }).collect();
        // The fragments as one string, split below without the GIL: a list of 100,000 Python
        // strings held the GIL ~2.5 ms while copied out, one joined string is read in place.
        let (joined, listed): (Option<Bound<'_, PyString>>, Option<Vec<String>>) = match json {
            None => (None, None),
            Some(json) => match json.cast_into::<PyString>() {
                Ok(joined) => (Some(joined), None),
                Err(other) => (None, Some(other.into_inner().extract()?)),
            },
        };
        let joined_text = joined.as_ref().map(|text| text.to_str()).transpose()?;
        // Building is pure Rust: without the GIL, so that a registration of a large graph (built
        // in a worker thread) does not hold the service's event loop (~80 ms for 100,000 locations).
        let (built, fragments) = py.detach(|| {
            let built = match (arity, pairwise) {
                (1, false) => Tracker::new(arity, locations, &specs).map(Inner::A1),
                (2, false) => Tracker::new(arity, locations, &specs).map(Inner::A2),
                (3, false) => Tracker::new(arity, locations, &specs).map(Inner::A3),
                (4, false) => Tracker::new(arity, locations, &specs).map(Inner::A4),
                (_, false) => Tracker::new(arity, locations, &specs).map(Inner::Dyn),
                (1, true) => Tracker::new(arity, locations, &specs).map(Inner::P1),
                (2, true) => Tracker::new(arity, locations, &specs).map(Inner::P2),
                (3, true) => Tracker::new(arity, locations, &specs).map(Inner::P3),
                (4, true) => Tracker::new(arity, locations, &specs).map(Inner::P4),
                (_, true) => Tracker::new(arity, locations, &specs).map(Inner::PDyn),
            };
            let fragments = match (joined_text, &listed) {
                (Some(""), _) => Some(Fragments::new::<&str>(&[])),
                (Some(text), _) => Some(Fragments::new(&text.split('\n').collect::<Vec<_>>())),
                (None, Some(list)) => Some(Fragments::new(list)),
                (None, None) => None,
            };
            (built, fragments)
        });
        let inner = built.map_err(|e| PyValueError::new_err(e.to_string()))?;
        let json_len = fragments.as_ref().map(Fragments::len);
        for (what, len) in [("labels", labels.as_ref().map(Vec::len)), ("json", json_len)] {
            if let Some(len) = len.filter(|&len| len != locations) {
                return Err(PyValueError::new_err(format!("{what} has {len} entries for {locations} locations")));
            }
        }
        let index = match (&labels, index) {
            (None, _) => None,
            // The caller's `{label: position}` (built in Python, where a registration's thread
            // lets the event loop in between): 100,000 labels hashed here held the GIL ~20 ms.
            (Some(_), Some(given)) => {
                if given.len() != locations {
                    return Err(PyValueError::new_err("index must map every label to its position"));
                }
                Some(given.unbind())
            }
            (Some(labels), None) => {
                let dict = PyDict::new(py);
                for (position, label) in labels.iter().enumerate() {
                    dict.set_item(label.bind(py), position)?;
                }
                if dict.len() != locations {
                    return Err(PyValueError::new_err("labels must be distinct"));
                }
                Some(dict.unbind())
            }
        };
        Ok(Engine { inner: Mutex::new(inner), arity, locations, shared: Arc::new(Shared { labels, fragments }), index })
    }

    /// The number of coordinates of every time.
    #[getter]
    fn arity(&self) -> usize {
        self.arity
    }

    /// The number of locations.
    fn __len__(&self) -> usize {
        self.locations
    }

    /// Applies one atomic batch given as flat integers: `locations[i]`, the time
    /// `times[i * arity:(i + 1) * arity]`, `deltas[i]`. Each argument is a list, a tuple, a
    /// buffer of 64-bit integers (`array('q')`) or an iterable. Validated first: a bad batch
    /// raises `ValueError` (`IndexError` for an unknown location) and changes nothing.
    ///
    /// `release_gil`: propagate without the GIL, for a caller on a thread of its own (a costly
    /// batch kept off the event loop); off by default, because taking the GIL back after a
    /// cheap batch can wait for another thread's turn.
    #[pyo3(signature = (locations, times, deltas, *, release_gil=false))]
    fn apply_indexed(
        &self,
        py: Python<'_>,
        locations: &Bound<'_, PyAny>,
        times: &Bound<'_, PyAny>,
        deltas: &Bound<'_, PyAny>,
        release_gil: bool,
    ) -> PyResult<ChangeBatch> {
        let (locations, times, deltas) = read_batch(locations, times, deltas, self.arity)?;
        for &location in &locations {
            self.check_location(location)?;
        }
        if let Some(position) = times.iter().position(|&c| c < 0) {
            return Err(PyValueError::new_err(format!(
                "update {}: time coordinates must be non-negative, got {}",
                position / self.arity,
                times[position]
            )));
        }
        // Non-negative i64 and u64 share their representation.
        let times: Vec<u64> = times.into_iter().map(|c| c as u64).collect();
        Ok(if release_gil {
            py.detach(|| self.run(&locations, &times, &deltas))
        } else {
            self.run(&locations, &times, &deltas)
        })
    }

    /// Applies one atomic batch of `(label, time, delta)` (labels as given at construction,
    /// times as tuples or lists). Validated first; a bad batch changes nothing.
    fn apply(&self, py: Python<'_>, updates: &Bound<'_, PyAny>) -> PyResult<ChangeBatch> {
        let index = match &self.index {
            Some(index) => index.bind(py),
            None => return Err(PyValueError::new_err("this engine has no labels: use apply_indexed")),
        };
        let mut locations = Vec::new();
        let mut times = Vec::new();
        let mut deltas = Vec::new();
        for (number, update) in updates.try_iter()?.enumerate() {
            let update = update?;
            let (label, time, delta): (Bound<'_, PyAny>, Bound<'_, PyAny>, i64) = match update.cast::<PyTuple>() {
                Ok(tuple) => tuple.extract()?,
                Err(_) => {
                    let fields = update.try_iter()?.collect::<PyResult<Vec<_>>>()?;
                    match <[Bound<'_, PyAny>; 3]>::try_from(fields) {
                        Ok([label, time, delta]) => (label, time, delta.extract()?),
                        Err(_) => {
                            return Err(PyValueError::new_err(format!(
                                "update {number}: expected (location, time, delta)"
                            )))
                        }
                    }
                }
            };
            let location = match index.get_item(&label)? {
                Some(location) => location.extract::<i64>()?,
                None => return Err(PyKeyError::new_err(format!("update {number}: unknown location {label}"))),
            };
            read_time(&time, self.arity, &mut times)
                .map_err(|message| PyValueError::new_err(format!("update {number}: {message}")))?;
            locations.push(location);
            deltas.push(delta);
        }
        // This path loads initial and recovered counts, which can move every frontier of a large
        // graph: propagated without the GIL.
        Ok(py.detach(|| self.run(&locations, &times, &deltas)))
    }

    /// The frontier of `location`: its minimal times, sorted.
    fn frontier<'py>(&self, py: Python<'py>, location: i64) -> PyResult<Bound<'py, PyList>> {
        let location = self.check_location(location)?;
        dispatch!(&*self.locked(), tracker => {
            let times = tracker.frontier(location);
            PyList::new(py, times.iter().map(|t| time_tuple(py, t.coords())).collect::<PyResult<Vec<_>>>()?)
        })
    }

    /// Every location's frontier, by index.
    fn frontiers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        // One lock for all: every frontier of the same version.
        dispatch!(&*self.locked(), tracker => {
            for location in 0..self.locations {
                let times = tracker.frontier(location);
                out.append(PyList::new(py, times.iter().map(|t| time_tuple(py, t.coords())).collect::<PyResult<Vec<_>>>()?)?)?;
            }
        });
        Ok(out)
    }

    /// A copy of every location's frontier, to be kept as of a published version by folding
    /// that version's changes into it ([`Frontiers::fold`]).
    fn frontier_copy(&self, py: Python<'_>) -> Frontiers {
        let chunks = py.detach(|| {
            let mut antichains: Vec<Vec<u64>> = Vec::with_capacity(self.locations);
            dispatch!(&*self.locked(), tracker => {
                for location in 0..self.locations {
                    antichains.push(tracker.frontier(location).iter().flat_map(|t| t.coords().to_vec()).collect());
                }
            });
            Frontiers::chunked(antichains)
        });
        Frontiers { arity: self.arity, len: self.locations, chunks, shared: self.shared.clone() }
    }

    /// Every non-zero occurrence count as `(location, time, count)`.
    fn pointstamps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        dispatch!(&*self.locked(), tracker => {
            for location in 0..self.locations {
                for (time, count) in tracker.counts(location) {
                    out.append((location, time_tuple(py, time.coords())?, *count))?;
                }
            }
        });
        Ok(out)
    }

    /// True iff a notification for `time` at `location` is safe: no frontier element is
    /// `<= time`.
    fn can_notify(&self, location: i64, time: &Bound<'_, PyAny>) -> PyResult<bool> {
        let location = self.check_location(location)?;
        let mut coords = Vec::with_capacity(self.arity);
        read_time(time, self.arity, &mut coords).map_err(PyValueError::new_err)?;
        Ok(dispatch!(&*self.locked(), tracker => !tracker.less_equal(location, &Time::from_coords(&coords))))
    }

    /// A selection of these location indices, for `ChangeBatch.to_json` and `select`.
    fn selection(&self, locations: &Bound<'_, PyAny>) -> PyResult<PySelection> {
        let members = read_ints(locations)?;
        for &location in &members {
            self.check_location(location)?;
        }
        let selection = Selection::new(self.locations, members.into_iter().map(|l| l as usize))
            .map_err(|l| PyIndexError::new_err(format!("location {l} out of range")))?;
        Ok(PySelection { selection })
    }

    /// The index of a label given at construction.
    fn index(&self, py: Python<'_>, label: &Bound<'_, PyAny>) -> PyResult<usize> {
        let index = self.index.as_ref().ok_or_else(|| PyValueError::new_err("this engine has no labels"))?;
        match index.bind(py).get_item(label)? {
            Some(location) => location.extract(),
            None => Err(PyKeyError::new_err(format!("unknown location {label}"))),
        }
    }
}

/// A set of location indices: a subscriber's interest.
#[pyclass(module = "progress_engine", name = "Selection", frozen)]
pub struct PySelection {
    selection: Selection,
}

#[pymethods]
impl PySelection {
    fn __len__(&self) -> usize {
        self.selection.members().len()
    }

    fn __contains__(&self, location: i64) -> bool {
        location >= 0 && location <= u32::MAX as i64 && self.selection.contains(location as u32)
    }

    /// The selected location indices, ascending.
    fn members(&self) -> Vec<usize> {
        self.selection.members()
    }
}

/// The consolidated frontier changes of one batch, sorted by (time, location index); each diff
/// is `+1` (the time entered the location's frontier) or `-1` (it left).
#[pyclass(module = "progress_engine", name = "ChangeBatch", frozen)]
pub struct ChangeBatch {
    changes: Arc<Changes>,
    shared: Arc<Shared>,
    /// The compact JSON of every change, being encoded by a thread of its own
    /// ([`ChangeBatch::prepare_json`]), until `to_json` takes it.
    prepared: Mutex<Option<JoinHandle<Option<String>>>>,
    /// The updates (indices in the batch) that added a pointstamp at a time the location's
    /// frontier did not allow before the batch: nothing held could have produced it.
    regressions: Vec<u32>,
}

/// How many batches have a prepared encoding not yet taken, across engines.
static PREPARED: AtomicUsize = AtomicUsize::new(0);
/// At most this many at once: `prepare_json` does nothing beyond (`to_json` then encodes).
const MAX_PREPARED: usize = 8;

impl Drop for ChangeBatch {
    fn drop(&mut self) {
        if self.prepared.get_mut().map(|prepared| prepared.is_some()).unwrap_or(false) {
            PREPARED.fetch_sub(1, Ordering::Relaxed);
        }
        if self.changes.len() >= DETACHED_ENCODING_MIN {
            drop_elsewhere(std::mem::take(&mut self.changes));
        }
    }
}

/// Drops `value` on a thread of its own: freeing the 22 MB of an 800,000-change batch (its
/// pages returned to the system) held the GIL, and so the event loop, several milliseconds.
fn drop_elsewhere<T: Send + 'static>(value: T) {
    static DROPPER: OnceLock<Mutex<mpsc::Sender<Box<dyn Send>>>> = OnceLock::new();
    let sender = DROPPER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<Box<dyn Send>>();
        // If the thread cannot start, the receiver is gone and `send` hands the value back.
        let _ = std::thread::Builder::new().name("dropper".into()).spawn(move || receiver.into_iter().for_each(drop));
        Mutex::new(sender)
    });
    if let Ok(sender) = sender.lock() {
        let _ = sender.send(Box::new(value)); // on failure, dropped here
    }
}

impl ChangeBatch {
    fn new(changes: Changes, shared: Arc<Shared>) -> Self {
        ChangeBatch { changes: Arc::new(changes), shared, prepared: Mutex::new(None), regressions: Vec::new() }
    }

    /// Every change as a 3-tuple `(label(location), time, diff)`, or as an instance of the
    /// tuple subclass `cls` built as `tuple.__new__(cls, ...)` would (without calling Python).
    fn list<'py>(
        &self,
        py: Python<'py>,
        cls: Option<&Bound<'py, PyType>>,
        label: impl Fn(u32) -> Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let alloc: Option<(ffi::allocfunc, *mut ffi::PyTypeObject)> = match cls {
            None => None,
            Some(cls) => {
                if !cls.is_subclass_of::<PyTuple>()? {
                    return Err(PyTypeError::new_err("cls must be a subclass of tuple (a NamedTuple)"));
                }
                let type_ptr = cls.as_type_ptr();
                // SAFETY: a type object's tp_alloc slot is an allocfunc (never null for a
                // tuple subclass: it inherits one).
                let slot = unsafe { ffi::PyType_GetSlot(type_ptr, ffi::Py_tp_alloc) };
                if slot.is_null() {
                    return Err(PyTypeError::new_err("cls has no allocator"));
                }
                Some((unsafe { std::mem::transmute::<*mut std::ffi::c_void, ffi::allocfunc>(slot) }, type_ptr))
            }
        };
        let mut items = Vec::with_capacity(self.changes.len());
        let mut last: Option<(&[u64], Bound<'py, PyTuple>)> = None;
        for (location, time, diff) in self.changes.iter() {
            let tuple = match &last {
                Some((coords, tuple)) if *coords == time => tuple.clone(),
                _ => {
                    let tuple = time_tuple(py, time)?;
                    last = Some((time, tuple.clone()));
                    tuple
                }
            };
            let fields = [label(location), tuple.into_any(), diff.into_pyobject(py)?.into_any()];
            let item = match alloc {
                None => PyTuple::new(py, fields)?.into_any(),
                // SAFETY: what `tuple.__new__(cls, fields)` does: allocate a tuple of 3 slots of
                // type `cls` (a tuple subclass) and fill each slot once; `PyTuple_SetItem`
                // steals the reference and checks the object is a fresh tuple.
                Some((alloc, type_ptr)) => unsafe {
                    let object = alloc(type_ptr, 3);
                    if object.is_null() {
                        return Err(PyErr::fetch(py));
                    }
                    let object = Bound::from_owned_ptr(py, object);
                    for (slot, field) in fields.into_iter().enumerate() {
                        if ffi::PyTuple_SetItem(object.as_ptr(), slot as ffi::Py_ssize_t, field.into_ptr()) != 0 {
                            return Err(PyErr::fetch(py));
                        }
                    }
                    object
                },
            };
            items.push(item);
        }
        PyList::new(py, items)
    }

    fn encode(&self, py: Python<'_>, selection: Option<&PySelection>, compact: bool) -> PyResult<String> {
        let fragments = self
            .shared
            .fragments
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("this engine has no JSON fragments (pass json= to Engine)"))?;
        if selection.is_none() && compact {
            let prepared =
                self.prepared.lock().map_err(|_| PyValueError::new_err("the prepared JSON's lock is poisoned"))?.take();
            if let Some(handle) = prepared {
                PREPARED.fetch_sub(1, Ordering::Relaxed);
                // Waited for without the GIL (the thread never needs it); a thread that failed
                // leaves the encoding to this call.
                if let Ok(Some(encoded)) = py.detach(|| handle.join()) {
                    return Ok(encoded);
                }
            }
        }
        let (changes, selection) = (&self.changes, selection.map(|s| &s.selection));
        if changes.len() < DETACHED_ENCODING_MIN {
            return Ok(encode_changes(fragments, changes, selection, compact));
        }
        // Without the GIL, which another thread may want meanwhile (not for small batches: taking
        // the GIL back may wait for another thread's turn).
        Ok(py.detach(|| encode_changes(fragments, changes, selection, compact)))
    }
}

/// Batches of at least this many changes are encoded without the GIL.
const DETACHED_ENCODING_MIN: usize = 16_384;
/// Texts at least this long become Python strings through [`detached_string`].
const DETACHED_STRING_MIN: usize = 1 << 20;

extern "C" {
    // Not in the limited API that abi3 exposes, but exported by every CPython 3 (3.3 on).
    fn PyUnicode_New(size: ffi::Py_ssize_t, maxchar: u32) -> *mut ffi::PyObject;
}

/// `text` as a Python `str`, copied into it without the GIL when it is long and ASCII: the
/// copy of a 61 MB change list (its first touch of fresh pages, mostly), the ASCII check and
/// the freeing of the Rust text held the GIL, and so every other dataflow's event loop, ~40 ms.
/// The string is allocated uninitialised under the GIL (`PyUnicode_New`), its buffer (for a
/// compact ASCII string, what `PyUnicode_AsUTF8AndSize` points at) filled detached: nothing
/// else can see the new object meanwhile.
fn detached_string(py: Python<'_>, text: String) -> PyResult<Bound<'_, PyString>> {
    if text.len() < DETACHED_STRING_MIN {
        return Ok(PyString::new(py, &text));
    }
    let (text, ascii) = py.detach(move || {
        let ascii = text.is_ascii();
        (text, ascii)
    });
    if !ascii {
        let object = PyString::new(py, &text);
        py.detach(move || drop(text));
        return Ok(object);
    }
    let length = ffi::Py_ssize_t::try_from(text.len()).map_err(|_| PyValueError::new_err("text too long"))?;
    // SAFETY: PyUnicode_New returns a new reference (or NULL with an exception set), taken over
    // by `Bound`; for maxchar 127 it is a compact ASCII string whose UTF-8 buffer is its data,
    // `length` bytes long, which is written exactly once below before the object is shared.
    unsafe {
        let object = Bound::from_owned_ptr_or_err(py, PyUnicode_New(length, 127))?;
        let mut size: ffi::Py_ssize_t = 0;
        let data = ffi::PyUnicode_AsUTF8AndSize(object.as_ptr(), &mut size);
        if data.is_null() || size != length {
            return Err(PyErr::fetch(py));
        }
        let target = data as usize;
        py.detach(move || {
            std::ptr::copy_nonoverlapping(text.as_ptr(), target as *mut u8, text.len());
            drop(text);
        });
        Ok(object.cast_into_unchecked::<PyString>())
    }
}

/// The JSON array of `changes`, in a string allocated once.
fn encode_changes(fragments: &Fragments, changes: &Changes, selection: Option<&Selection>, compact: bool) -> String {
    let mut out = String::with_capacity(fragments.encoded_len_bound(changes));
    fragments.encode(changes, selection, compact, &mut out);
    out
}

#[pymethods]
impl ChangeBatch {
    fn __len__(&self) -> usize {
        self.changes.len()
    }

    /// The indices (in the batch applied) of the updates that put a pointstamp at a time no
    /// frontier element of its location was at or before when the batch began: a frontier moved
    /// backwards, which no pointstamp held could have caused (a protocol violation).
    #[getter]
    fn regressions(&self) -> Vec<u32> {
        self.regressions.clone()
    }

    /// `[(location, time, diff), ...]`; with `labels=True` the location is its label, and
    /// with `cls` (a tuple subclass of three fields, e.g. `FrontierChange`) each change is an
    /// instance of it, as `tuple.__new__(cls, (location, time, diff))` would make it.
    #[pyo3(signature = (*, labels=false, cls=None))]
    fn to_list<'py>(
        &self,
        py: Python<'py>,
        labels: bool,
        cls: Option<&Bound<'py, PyType>>,
    ) -> PyResult<Bound<'py, PyList>> {
        if labels {
            let names =
                self.shared.labels.as_ref().ok_or_else(|| PyValueError::new_err("this engine has no labels"))?;
            self.list(py, cls, |location| names[location as usize].bind(py).clone())
        } else {
            self.list(py, cls, |location| location.into_pyobject(py).expect("infallible").into_any())
        }
    }

    /// The location index of every change.
    fn locations(&self) -> Vec<u32> {
        self.changes.locations().to_vec()
    }

    /// Every change's time coordinates, concatenated (`arity` per change).
    fn flat_times(&self) -> Vec<u64> {
        self.changes.flat_times().to_vec()
    }

    /// The diff of every change.
    fn diffs(&self) -> Vec<i64> {
        self.changes.diffs().to_vec()
    }

    /// How many changes fall in `selection`.
    fn count(&self, selection: &PySelection) -> usize {
        self.changes.locations().iter().filter(|&&l| selection.selection.contains(l)).count()
    }

    /// The changes at the selected locations only.
    fn select(&self, selection: &PySelection) -> ChangeBatch {
        ChangeBatch::new(self.changes.filter(|l| selection.selection.contains(l)), self.shared.clone())
    }

    /// Starts encoding `to_json(compact=True)` of every change in a thread of its own, so that
    /// the caller's thread goes on meanwhile; the next such `to_json` (or `to_json_bytes`)
    /// waits for it, without the GIL, and returns the same text it would have built itself.
    /// Worth it for big batches only (a thread costs tens of microseconds). Calling it again,
    /// on an engine without JSON fragments, or while 8 batches (of any engine) have a prepared
    /// encoding not yet taken, does nothing.
    fn prepare_json(&self) -> PyResult<()> {
        let mut prepared =
            self.prepared.lock().map_err(|_| PyValueError::new_err("the prepared JSON's lock is poisoned"))?;
        if prepared.is_some() || self.shared.fragments.is_none() {
            return Ok(());
        }
        // Bounded: each holds its batch's whole text until published (1.6 MB for 32,000
        // changes), and a client may pipeline many big batches while the log is slow.
        if PREPARED.fetch_add(1, Ordering::Relaxed) >= MAX_PREPARED {
            PREPARED.fetch_sub(1, Ordering::Relaxed);
            return Ok(());
        }
        let (changes, shared) = (self.changes.clone(), self.shared.clone());
        let spawned = std::thread::Builder::new()
            .name("prepare_json".into())
            .spawn(move || shared.fragments.as_ref().map(|fragments| encode_changes(fragments, &changes, None, true)));
        // A thread that cannot be started (resource limits) leaves the encoding to `to_json`.
        *prepared = spawned.ok();
        if prepared.is_none() {
            PREPARED.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The JSON array `[{"location": FRAGMENT, "time": [...], "diff": 1}, ...]`, equal to
    /// `json.dumps` of the same list (or with `separators=(",", ":")` when `compact`), of all
    /// changes or only those in `selection`.
    #[pyo3(signature = (selection=None, *, compact=false))]
    fn to_json<'py>(
        &self,
        py: Python<'py>,
        selection: Option<PyRef<'_, PySelection>>,
        compact: bool,
    ) -> PyResult<Bound<'py, PyString>> {
        detached_string(py, self.encode(py, selection.as_deref(), compact)?)
    }

    /// `to_json` as UTF-8 bytes.
    #[pyo3(signature = (selection=None, *, compact=false))]
    fn to_json_bytes<'py>(
        &self,
        py: Python<'py>,
        selection: Option<PyRef<'_, PySelection>>,
        compact: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, self.encode(py, selection.as_deref(), compact)?.as_bytes()))
    }
}

/// Every location's frontier as of some version, without a Python object per location or time
/// until asked ([`Frontiers::to_dict`]); folding a version's `ChangeBatch` moves it to that
/// version. A publisher keeps one per dataflow instead of a dict of sets it must update in
/// Python (16 ms for an 8,000-operator chain).
/// Departures from one location in a batch from which [`Frontiers::fold`] applies them through a
/// set rather than one search each.
const FOLD_BY_SET: usize = 16;

/// Locations per shared chunk of a [`Frontiers`]: a copy clones one `Arc` per chunk, and a
/// fold into a copy still shared clones only the chunks it touches.
const FRONTIER_CHUNK: usize = 256;

#[pyclass(module = "progress_engine", name = "Frontiers")]
pub struct Frontiers {
    arity: usize,
    len: usize,
    /// Per location, its antichain's times, flat (`arity` coordinates each), in chunks of
    /// [`FRONTIER_CHUNK`] locations shared between copies until one of them changes (a copy of
    /// 100,000 locations cloned each location's `Vec`: ~4 ms, taken on the event loop by every
    /// reader of a whole frontier).
    chunks: Vec<Arc<Vec<Vec<u64>>>>,
    shared: Arc<Shared>,
}

impl Frontiers {
    fn chunked(antichains: Vec<Vec<u64>>) -> Vec<Arc<Vec<Vec<u64>>>> {
        let mut chunks = Vec::with_capacity(antichains.len().div_ceil(FRONTIER_CHUNK));
        let mut rest = antichains.into_iter().peekable();
        while rest.peek().is_some() {
            chunks.push(Arc::new(rest.by_ref().take(FRONTIER_CHUNK).collect()));
        }
        chunks
    }

    fn times(&self, location: usize) -> &Vec<u64> {
        &self.chunks[location / FRONTIER_CHUNK][location % FRONTIER_CHUNK]
    }

    /// The location's times, its chunk made this copy's own first if it is shared.
    fn times_mut(&mut self, location: usize) -> &mut Vec<u64> {
        &mut Arc::make_mut(&mut self.chunks[location / FRONTIER_CHUNK])[location % FRONTIER_CHUNK]
    }

    fn antichains(&self) -> impl Iterator<Item = &Vec<u64>> {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }
}

#[pymethods]
impl Frontiers {
    fn __len__(&self) -> usize {
        self.len
    }

    /// Apply one version's changes (`+1`: the time entered the location's frontier, `-1`: it
    /// left); the batch must come from the engine this copy was taken from.
    ///
    /// A batch's changes are consolidated (no time both enters and leaves a location), so each
    /// location's departures are applied before its arrivals: few of them one at a time, many
    /// (a wide antichain moved whole) through a set in one pass over the location's times,
    /// linear in the width where one search per departure was quadratic (a 1,001-wide move
    /// along 200 locations took 0.3 s of the event loop).
    fn fold(&mut self, batch: &ChangeBatch) -> PyResult<()> {
        if !Arc::ptr_eq(&self.shared, &batch.shared) {
            return Err(PyValueError::new_err("the batch comes from another engine"));
        }
        let arity = self.arity;
        // Departures per location, counted only when the batch is large enough for a location
        // to have many: a batch moving one time at each of 8,000 locations stays one search each.
        let counts: Option<Vec<u32>> = (batch.changes.len() >= FOLD_BY_SET).then(|| {
            let mut counts = vec![0u32; self.len];
            for (location, _, diff) in batch.changes.iter() {
                if diff < 0 {
                    counts[location as usize] += 1;
                }
            }
            counts
        });
        let mut leaving: HashMap<u32, Vec<&[u64]>> = HashMap::new();
        for (location, time, diff) in batch.changes.iter() {
            if diff > 0 {
                continue;
            }
            if counts.as_ref().is_some_and(|counts| counts[location as usize] as usize >= FOLD_BY_SET) {
                leaving.entry(location).or_default().push(time);
                continue;
            }
            let times = self.times_mut(location as usize);
            let Some(at) = times.chunks_exact(arity).position(|t| t == time) else {
                return Err(PyValueError::new_err(format!(
                    "location {location} has no time {time:?} to retire: the batch does not follow this copy"
                )));
            };
            // Order within an antichain does not matter: move the last time into the gap.
            let last = times.len() - arity;
            times.copy_within(last.., at * arity);
            times.truncate(last);
        }
        for (location, gone) in leaving {
            let times = self.times_mut(location as usize);
            let set: HashSet<&[u64]> = gone.iter().copied().collect();
            let mut found: HashSet<&[u64]> = HashSet::with_capacity(set.len());
            let mut kept = Vec::with_capacity(times.len());
            for time in times.chunks_exact(arity) {
                match set.get(time) {
                    Some(&leaving) => {
                        found.insert(leaving);
                    }
                    None => kept.extend_from_slice(time),
                }
            }
            *times = kept;
            if let Some(time) = gone.iter().find(|time| !found.contains(**time)) {
                return Err(PyValueError::new_err(format!(
                    "location {location} has no time {time:?} to retire: the batch does not follow this copy"
                )));
            }
        }
        for (location, time, diff) in batch.changes.iter() {
            if diff > 0 {
                self.times_mut(location as usize).extend_from_slice(time);
            }
        }
        Ok(())
    }

    /// An independent copy (later folds into either do not show in the other): O(locations
    /// / 256), the chunks shared until either changes them.
    fn copy(&self) -> Frontiers {
        Frontiers { arity: self.arity, len: self.len, chunks: self.chunks.clone(), shared: self.shared.clone() }
    }

    /// The compact JSON rows `{"location":L,"frontier":[[c,...],...]}` of the locations at
    /// `indices`, in that order, joined by commas (no brackets), each frontier sorted: the
    /// `locations` of a frontier answer, built without the GIL or a Python object per row
    /// (Python took ~0.9 s for 100,000 locations, all of it holding the event loop).
    fn rows_json<'py>(&self, py: Python<'py>, indices: Vec<u32>) -> PyResult<Bound<'py, PyString>> {
        let fragments = self
            .shared
            .fragments
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("this engine has no JSON fragments (pass json= to Engine)"))?;
        if let Some(&bad) = indices.iter().find(|&&i| i as usize >= self.len) {
            return Err(PyIndexError::new_err(format!("no location {bad}")));
        }
        let arity = self.arity.max(1);
        let text = py.detach(|| {
            let mut out = String::with_capacity(indices.len() * 64);
            let mut numbers = itoa::Buffer::new();
            let mut sorted: Vec<&[u64]> = Vec::new();
            for (n, &index) in indices.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push_str(fragments.location_prefix(index as usize));
                out.push_str("\"frontier\":[");
                sorted.clear();
                sorted.extend(self.times(index as usize).chunks_exact(arity));
                sorted.sort_unstable();
                for (t, time) in sorted.iter().enumerate() {
                    out.push_str(if t > 0 { ",[" } else { "[" });
                    for (c, coord) in time.iter().enumerate() {
                        if c > 0 {
                            out.push(',');
                        }
                        out.push_str(numbers.format(*coord));
                    }
                    out.push(']');
                }
                out.push_str("]}");
            }
            out
        });
        detached_string(py, text)
    }

    /// The frontier of the location at `index`, sorted.
    fn frontier<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyList>> {
        if index >= self.len {
            return Err(PyIndexError::new_err("no such location"));
        }
        let times = self.times(index);
        let mut sorted: Vec<&[u64]> = times.chunks_exact(self.arity.max(1)).collect();
        sorted.sort_unstable();
        PyList::new(py, sorted.into_iter().map(|t| time_tuple(py, t)).collect::<PyResult<Vec<_>>>()?)
    }

    /// The frontiers of the locations at `indices`, in that order, as the buffers of an Arrow
    /// `list<list<int64>>` column: `(offsets, time_offsets, coordinates)`, little-endian, the
    /// first two `int32` (a location's times, a time's coordinates), the last `int64`; each
    /// frontier sorted. Built without the GIL or a Python object per time (a SQL view's rows
    /// built per location held the GIL ~0.1 s per 20,000 locations).
    fn list_columns<'py>(
        &self,
        py: Python<'py>,
        indices: Vec<u32>,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        if let Some(&bad) = indices.iter().find(|&&i| i as usize >= self.len) {
            return Err(PyIndexError::new_err(format!("no location {bad}")));
        }
        let arity = self.arity.max(1);
        let too_many = || PyValueError::new_err("too many times for 32-bit offsets");
        let (offsets, time_offsets, coordinates) = py.detach(|| {
            let mut offsets: Vec<u8> = Vec::with_capacity(4 * (indices.len() + 1));
            let mut time_offsets: Vec<u8> = vec![0; 4];
            let mut coordinates: Vec<u8> = Vec::new();
            let (mut times, mut coords) = (0i32, 0i32);
            offsets.extend_from_slice(&0i32.to_le_bytes());
            let mut sorted: Vec<&[u64]> = Vec::new();
            for &index in &indices {
                sorted.clear();
                sorted.extend(self.times(index as usize).chunks_exact(arity));
                sorted.sort_unstable();
                for time in &sorted {
                    for &c in time.iter() {
                        coordinates.extend_from_slice(&(i64::try_from(c).ok()?).to_le_bytes());
                    }
                    coords = coords.checked_add(i32::try_from(time.len()).ok()?)?;
                    time_offsets.extend_from_slice(&coords.to_le_bytes());
                }
                times = times.checked_add(i32::try_from(sorted.len()).ok()?)?;
                offsets.extend_from_slice(&times.to_le_bytes());
            }
            Some((offsets, time_offsets, coordinates))
        })
        .ok_or_else(too_many)?;
        Ok((PyBytes::new(py, &offsets), PyBytes::new(py, &time_offsets), PyBytes::new(py, &coordinates)))
    }

    /// `{label: {time, ...}}` for every location (an empty set where nothing can arrive).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let labels = self.shared.labels.as_ref().ok_or_else(|| PyValueError::new_err("this engine has no labels"))?;
        let out = PyDict::new(py);
        for (label, times) in labels.iter().zip(self.antichains()) {
            let set = PySet::empty(py)?;
            for time in times.chunks_exact(self.arity.max(1)) {
                set.add(time_tuple(py, time)?)?;
            }
            out.set_item(label.bind(py), set)?;
        }
        Ok(out)
    }
}

/// When each location's frontier last moved, stamped from whole `ChangeBatch`es without a
/// Python object per change. A dataflow's wall-clock bookkeeping keeps one: a dict update per
/// change of an 8,000-operator chain's batch (32,000 changes) held the event loop 2.7 ms;
/// stamping them here takes ~30 µs.
///
/// ```python
/// stamps = MovedAt()
/// stamps.stamp(batch, 12.5)   # every location of `batch` moved at 12.5
/// stamps.get(3)               # 12.5 if location 3 was in `batch`, else None
/// ```
#[pyclass(module = "progress_engine", name = "MovedAt")]
#[derive(Clone, Default)]
pub struct MovedAt {
    /// Per location index, its latest stamp (`NaN`: never stamped).
    at: Vec<f64>,
}

#[pymethods]
impl MovedAt {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Every location of `batch` moved at `at` (a later stamp replaces an earlier one).
    fn stamp(&mut self, batch: &ChangeBatch, at: f64) {
        for &location in batch.changes.locations() {
            let index = location as usize;
            if index >= self.at.len() {
                self.at.resize(index + 1, f64::NAN);
            }
            self.at[index] = at;
        }
    }

    /// The latest stamp of the location at `index`, `None` if it was never stamped.
    fn get(&self, index: usize) -> Option<f64> {
        self.at.get(index).copied().filter(|at| !at.is_nan())
    }

    /// The stamps of the locations at `indices`, in that order, as the little-endian `float64`
    /// buffer of an Arrow column (`NaN`: never stamped).
    fn stamps<'py>(&self, py: Python<'py>, indices: Vec<u32>) -> Bound<'py, PyBytes> {
        let mut out: Vec<u8> = Vec::with_capacity(8 * indices.len());
        for index in indices {
            out.extend_from_slice(&self.at.get(index as usize).copied().unwrap_or(f64::NAN).to_le_bytes());
        }
        PyBytes::new(py, &out)
    }

    /// An independent copy (later stamps do not show in it).
    fn copy(&self) -> MovedAt {
        self.clone()
    }
}

/// When each live pointstamp was born and which worker last touched it (see
/// [`crate::births`]), fed every durable batch as the engine takes it.
///
/// ```python
/// births = Births(1)
/// births.add([3], [0], [1], 10.0, 7)   # location 3, time (0,), +1, received at 10.0 from worker 7
/// births.get(3, [0])                   # (10.0, 7); None once its count is back at zero
/// births.oldest()                      # [(3, (0,), 10.0, 7)]: per location, the first born
/// ```
#[pyclass(module = "progress_engine", name = "Births")]
pub struct PyBirths {
    inner: Births,
}

#[pymethods]
impl PyBirths {
    #[new]
    fn new(arity: usize) -> Self {
        PyBirths { inner: Births::new(arity) }
    }

    /// Folds one batch received at `at` from `worker` (flat integers, as `Engine.apply_indexed`
    /// takes them): a count that becomes positive is born at `at`; every pointstamp named is
    /// last touched by `worker`; one back at zero is forgotten. `ValueError` if the lengths
    /// disagree (then nothing changed).
    fn add(
        &mut self,
        locations: &Bound<'_, PyAny>,
        times: &Bound<'_, PyAny>,
        deltas: &Bound<'_, PyAny>,
        at: f64,
        worker: u32,
    ) -> PyResult<()> {
        let (locations, times, deltas) = read_batch(locations, times, deltas, self.inner.arity())?;
        if let Some(&location) = locations.iter().find(|&&l| l < 0 || l > i64::from(u32::MAX)) {
            return Err(PyValueError::new_err(format!("location index out of range: {location}")));
        }
        self.inner.add(&locations, &times, &deltas, at, worker);
        Ok(())
    }

    /// `(born at, worker)` of the pointstamp if its count is positive, else `None`.
    fn get(&self, location: u32, time: Vec<i64>) -> Option<(f64, u32)> {
        self.inner.get(location, &time).map(|birth| (birth.born, birth.worker))
    }

    /// For every location holding positive counts, its first-born pointstamp, by location:
    /// `[(location, time, born at, worker)]`.
    fn oldest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for (location, time, birth) in self.inner.oldest_by_location() {
            out.append((location, PyTuple::new(py, time)?, birth.born, birth.worker))?;
        }
        Ok(out)
    }

    /// Forgets every pointstamp.
    fn clear(&mut self) {
        self.inner.clear();
    }

    /// An independent copy (later folds do not show in it): read off the event loop.
    fn copy(&self, py: Python<'_>) -> PyBirths {
        let inner = py.detach(|| self.inner.clone());
        PyBirths { inner }
    }

    /// Pointstamps with a non-zero count (positive or not).
    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// The native-endian bytes of a slice of integers (what `pyarrow.py_buffer` wraps as an
/// Arrow buffer).
fn raw_bytes<'py, T: Copy>(py: Python<'py>, values: &[T]) -> Bound<'py, PyBytes> {
    // SAFETY: `T` is a primitive integer (no padding, every byte initialised); the slice lives
    // while the bytes are copied.
    let bytes = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) };
    PyBytes::new(py, bytes)
}

type ColumnBytes<'py> =
    (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>);

/// `change_columns(batches, bases)`: the changes of `batches` as five buffers of native-endian
/// integers, `(batch_offsets: int32, locations: uint32, time_offsets: int32, times: int64,
/// diffs: int64)`, laid out as Arrow's list and primitive arrays want them: batch `b` holds
/// rows `batch_offsets[b]..batch_offsets[b + 1]`, row `r` is at location
/// `locations[r]` (its batch's index plus `bases[b]`) with time
/// `times[time_offsets[r]..time_offsets[r + 1]]` and diff `diffs[r]`. Built without the GIL
/// and without a Python object per change; a ``ValueError`` for a time above ``2**63 - 1``.
#[pyfunction]
fn change_columns<'py>(
    py: Python<'py>,
    batches: Vec<Bound<'py, ChangeBatch>>,
    bases: Vec<u32>,
) -> PyResult<ColumnBytes<'py>> {
    if batches.len() != bases.len() {
        return Err(PyValueError::new_err(format!("{} batches but {} bases", batches.len(), bases.len())));
    }
    let changes: Vec<&Changes> = batches.iter().map(|batch| &*batch.get().changes).collect();
    let built = py.detach(|| {
        let mut columns = Columns::default();
        for (changes, &base) in changes.iter().zip(&bases) {
            columns.extend(changes, base)?;
        }
        Ok::<Columns, ColumnsError>(columns)
    });
    let columns = built.map_err(|error| match error {
        ColumnsError::TimeTooLarge(time) => PyValueError::new_err(format!("time coordinate {time} exceeds 2**63 - 1")),
        ColumnsError::TooLarge => PyValueError::new_err("too many changes for 32-bit offsets"),
    })?;
    Ok((
        raw_bytes(py, &columns.batch_offsets),
        raw_bytes(py, &columns.locations),
        raw_bytes(py, &columns.time_offsets),
        raw_bytes(py, &columns.times),
        raw_bytes(py, &columns.diffs),
    ))
}

/// `split_members(data, keys)`: where the members of the JSON object `data` are, found without
/// the GIL and without building a value (see [`crate::split`]): a list of `(key_start, key_end,
/// value_start, value_end, elements)`, byte offsets, `elements` being for an array value of a
/// key in `keys` (as written between its quotes) the native-endian `uint64` offsets
/// `start, end, start, end, ...` of its elements, else `None`; `None` if `data` is not an
/// object or its structure is broken where the scan looks. The caller decodes the pieces.
#[pyfunction]
fn split_members<'py>(
    py: Python<'py>,
    data: PyBackedBytes,
    keys: Vec<PyBackedBytes>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let found = py.detach(|| {
        let keys: Vec<&[u8]> = keys.iter().map(|key| &key[..]).collect();
        split::members(&data, &keys)
    });
    let Some(found) = found else { return Ok(None) };
    let out = PyList::empty(py);
    for member in found {
        let elements = member.elements.map(|elements| {
            let flat: Vec<u64> = elements.iter().flat_map(|&(start, end)| [start as u64, end as u64]).collect();
            raw_bytes(py, &flat)
        });
        out.append((member.key.0, member.key.1, member.value.0, member.value.1, elements))?;
    }
    Ok(Some(out))
}

#[pymodule]
fn progress_engine(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(change_columns, module)?)?;
    module.add_function(wrap_pyfunction!(split_members, module)?)?;
    module.add_class::<Engine>()?;
    module.add_class::<ChangeBatch>()?;
    module.add_class::<Frontiers>()?;
    module.add_class::<MovedAt>()?;
    module.add_class::<PyBirths>()?;
    module.add_class::<PySelection>()?;
    Ok(())
}
