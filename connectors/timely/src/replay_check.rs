//! The check itself: journals and the service's published history in, a verdict out.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use serde_json::Value;

use crate::graph::DataflowGraph;
use crate::mapping::{add_raw, batch_body, split, Counts, Mapper, RawKey, TimeKey};
use crate::replay::{behind_or_equal, loc_key, LocKey, RawUpdate, Replay};

/// What [`check`] found.
#[derive(Debug, Default, Serialize)]
pub struct CheckReport {
    /// The dataflow's service id.
    pub dataflow: String,
    /// Workers whose journals held batches of it.
    pub workers: usize,
    /// Versions compared (0 included).
    pub versions: u64,
    /// Locations compared at each version.
    pub locations: usize,
    /// Versions at which every frontier equalled timely's.
    pub exact: u64,
    /// Versions inside a split batch, checked to be behind or equal to timely's before and
    /// after the whole batch.
    pub intermediate: u64,
    /// Versions at which some frontier differed (or, inside a split batch, was ahead).
    pub mismatches: u64,
    /// Of those, versions at which the service was ahead of timely somewhere.
    pub ahead: u64,
    /// The first few differences, described.
    pub first_mismatches: Vec<String>,
    /// Every frontier empty in timely's trackers after the last batch.
    pub timely_final_empty: bool,
    /// Every frontier empty in the service after its last version.
    pub service_final_empty: bool,
    /// Every pointstamp's count back to zero in timely's trackers (initial capabilities and
    /// every worker's updates): each update counted exactly once.
    pub timely_final_counts_zero: bool,
    /// Some of the counts that are not, if any.
    pub nonzero_counts: Vec<String>,
    /// Why nothing could be checked, if so.
    pub error: Option<String>,
}

impl CheckReport {
    /// Whether everything matched and both ended empty.
    pub fn ok(&self) -> bool {
        self.error.is_none()
            && self.mismatches == 0
            && self.timely_final_empty
            && self.service_final_empty
            && self.timely_final_counts_zero
    }
}

type Frontiers = BTreeMap<LocKey, BTreeSet<Vec<u64>>>;

struct Entry {
    part: (usize, usize),
    raw: Vec<RawUpdate>,
    worker: usize,
}

/// Checks dataflow `id`: `journals` are the workers' journal files (their text), `snapshot` the
/// answer of `GET .../frontier?version=0`, `changes` the data of every SSE `changes` event
/// after version 0, in order.
pub fn check(journals: &[String], id: &str, snapshot: &Value, changes: &[Value]) -> CheckReport {
    let mut report = CheckReport { dataflow: id.to_owned(), ..CheckReport::default() };
    match run(journals, id, snapshot, changes, &mut report) {
        Ok(()) => {}
        Err(error) => report.error = Some(error),
    }
    report
}

fn raw_updates(raw: &Value) -> Result<Vec<RawUpdate>, String> {
    let bad = || format!("malformed raw update list: {raw}");
    raw.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|u| {
            let time = u[4]
                .as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|c| c.as_u64().ok_or_else(bad))
                .collect::<Result<_, _>>()?;
            Ok((
                u[0].as_u64().ok_or_else(bad)? as usize,
                u[1].as_u64().ok_or_else(bad)? as u32,
                u[2].as_u64().ok_or_else(bad)? as u32,
                u[3].as_bool().ok_or_else(bad)?,
                time,
                u[5].as_i64().ok_or_else(bad)?,
            ))
        })
        .collect()
}

/// What the workers' journals say of one dataflow: its graph, every acknowledged batch by the
/// version the service gave it, the raw updates that mapped to nothing after each worker's last
/// batch, and how many workers wrote any.
struct Journals {
    graph: DataflowGraph,
    entries: BTreeMap<u64, Entry>,
    leftover: Vec<RawUpdate>,
    workers: usize,
}

fn read_journals(journals: &[String], id: &str) -> Result<Journals, String> {
    let mut graph: Option<Value> = None;
    let mut entries: BTreeMap<u64, Entry> = BTreeMap::new();
    let mut leftover: Vec<RawUpdate> = Vec::new();
    let mut workers = 0;
    for text in journals {
        let mut carry: Vec<RawUpdate> = Vec::new();
        let mut mine = false;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let record: Value = serde_json::from_str(line).map_err(|e| format!("journal line {line:.80}: {e}"))?;
            if let Some(r) = record.get("registered").filter(|r| r["id"] == id) {
                match &graph {
                    Some(g) if *g != r["graph"] => return Err("workers registered different graphs".into()),
                    _ => graph = Some(r["graph"].clone()),
                }
            }
            let Some(b) = record.get("batch").filter(|b| b["id"] == id) else { continue };
            mine = true;
            let mut raw = raw_updates(&b["raw"])?;
            match (b["seq"].as_u64(), b["version"].as_u64()) {
                (None, _) => carry.append(&mut raw),
                (Some(seq), None) => {
                    return Err(format!(
                        "worker {} batch {seq} was acknowledged as a duplicate: its version is unknown",
                        b["worker"]
                    ))
                }
                (Some(_), Some(version)) => {
                    let part =
                        (b["part"][0].as_u64().unwrap_or(0) as usize, b["part"][1].as_u64().unwrap_or(1) as usize);
                    if part.0 + 1 == part.1 {
                        carry.append(&mut raw);
                        raw = std::mem::take(&mut carry);
                    }
                    let worker = b["worker"].as_u64().unwrap_or(0) as usize;
                    if entries.insert(version, Entry { part, raw, worker }).is_some() {
                        return Err(format!("two batches claim version {version}"));
                    }
                }
            }
        }
        workers += usize::from(mine);
        leftover.append(&mut carry);
    }
    let graph: DataflowGraph =
        serde_json::from_value(graph.ok_or("no worker registered this dataflow")?).map_err(|e| e.to_string())?;
    let last = entries.keys().next_back().copied().unwrap_or(0);
    if let Some(missing) = (1..=last).find(|v| !entries.contains_key(v)) {
        return Err(format!("version {missing} is in no journal: another client wrote to the dataflow"));
    }
    Ok(Journals { graph, entries, leftover, workers })
}

/// One worker's batch of a journal, for posting again: the service's version it had, the worker
/// (`w<index>`) and its body, numbered afresh (`seq` 0, 1, ... per worker, in version order).
#[derive(Debug, Serialize)]
pub struct Replayed {
    /// The version the service gave the batch (its last part's, for a split one).
    pub version: u64,
    /// The worker, as the service calls it.
    pub worker: String,
    /// The progress body, `{"worker", "seq", "updates"}` (a split batch whole).
    pub body: Value,
}

/// The registration of dataflow `id` as its workers' journals hold it, and every batch they sent,
/// mapped to the service's locations as the connector maps them, in the service's version order:
/// what posting the same program's progress to another dataflow takes (a journal edited first,
/// say one update more, shows what the service makes of a program that sent it). A split batch
/// is posted whole, at its last part's version; raw updates that mapped to nothing ride on the
/// worker's next batch, as they did.
pub fn service_batches(journals: &[String], id: &str) -> Result<(Value, Vec<Replayed>), String> {
    let read = read_journals(journals, id)?;
    let mut mapper = Mapper::new(&read.graph);
    let mut seqs: HashMap<usize, u64> = HashMap::new();
    let mut batches = Vec::new();
    for (version, entry) in &read.entries {
        if entry.part.0 + 1 < entry.part.1 {
            continue;
        }
        let mut raw: Counts<RawKey> = Counts::default();
        for (identifier, node, port, source, time, delta) in &entry.raw {
            let key =
                RawKey { identifier: *identifier, node: *node, port: *port, source: *source, time: TimeKey::new(time) };
            add_raw(&mut raw, key, *delta);
        }
        let mut mapped = Counts::default();
        mapper.map(&raw, &mut mapped);
        let updates: Vec<_> = split(mapped, usize::MAX).into_iter().flatten().collect();
        let seq = seqs.entry(entry.worker).or_insert(0);
        let worker = format!("w{}", entry.worker);
        let body = batch_body(&read.graph, &worker, *seq, &updates);
        *seq += 1;
        batches.push(Replayed {
            version: *version,
            worker,
            body: serde_json::from_str(&body).map_err(|e| e.to_string())?,
        });
    }
    Ok((read.graph.registration(), batches))
}

fn run(
    journals: &[String],
    id: &str,
    snapshot: &Value,
    changes: &[Value],
    report: &mut CheckReport,
) -> Result<(), String> {
    let Journals { graph, entries, leftover, workers } = read_journals(journals, id)?;
    report.workers = workers;
    let last = entries.keys().next_back().copied().unwrap_or(0);
    if snapshot["version"].as_u64() != Some(0) {
        return Err(format!("the snapshot is not of version 0: {}", snapshot["version"]));
    }
    let mut service: BTreeMap<LocKey, BTreeMap<Vec<u64>, i64>> = BTreeMap::new();
    for entry in snapshot["locations"].as_array().ok_or("snapshot without locations")? {
        let key = loc_key(&entry["location"]).ok_or("snapshot location malformed")?;
        let set = service.entry(key).or_default();
        for time in entry["frontier"].as_array().into_iter().flatten() {
            set.insert(coords(time)?, 1);
        }
    }
    let mut by_version: HashMap<u64, &Value> = HashMap::new();
    for event in changes {
        let version = event["version"].as_u64().ok_or("changes event without version")?;
        if version > last {
            return Err(format!("the service published version {version}, beyond the journals' {last}"));
        }
        by_version.insert(version, event);
    }

    let mut replay = Replay::new(&graph);
    let mut timely = replay.frontiers();
    report.locations = timely.len();
    compare(0, &timely, &view(&service), report);
    let mut inside: Vec<(u64, Frontiers)> = Vec::new();
    for (version, entry) in &entries {
        if let Some(event) = by_version.get(version) {
            for change in event["changes"].as_array().into_iter().flatten() {
                let key = loc_key(&change["location"]).ok_or("change location malformed")?;
                let count = service.entry(key).or_default().entry(coords(&change["time"])?).or_insert(0);
                *count += change["diff"].as_i64().ok_or("change without diff")?;
            }
        }
        let published = view(&service);
        if entry.part.0 + 1 < entry.part.1 {
            inside.push((*version, published));
            continue;
        }
        let before = std::mem::take(&mut timely);
        replay.apply(&entry.raw);
        timely = replay.frontiers();
        for (v, mid) in inside.drain(..) {
            report.versions += 1;
            report.intermediate += 1;
            for (key, f) in &mid {
                let (b, a) =
                    (before.get(key).cloned().unwrap_or_default(), timely.get(key).cloned().unwrap_or_default());
                if !behind_or_equal(f, &b) || !behind_or_equal(f, &a) {
                    mismatch(
                        report,
                        true,
                        format!("version {v} (inside a split batch): {key:?} at {f:?}, timely {b:?} then {a:?}"),
                    );
                    break;
                }
            }
        }
        compare(*version, &timely, &published, report);
    }
    if !leftover.is_empty() {
        // Updates that mapped to nothing after each worker's last batch: no service version.
        replay.apply(&leftover);
        timely = replay.frontiers();
    }
    report.timely_final_empty = timely.values().all(BTreeSet::is_empty);
    report.nonzero_counts = replay.nonzero(10);
    report.timely_final_counts_zero = report.nonzero_counts.is_empty();
    report.service_final_empty = view(&service).values().all(BTreeSet::is_empty);
    Ok(())
}

fn coords(time: &Value) -> Result<Vec<u64>, String> {
    time.as_array()
        .ok_or_else(|| format!("time {time} is not a list"))?
        .iter()
        .map(|c| c.as_u64().ok_or_else(|| format!("time {time} is not integers")))
        .collect()
}

fn view(service: &BTreeMap<LocKey, BTreeMap<Vec<u64>, i64>>) -> Frontiers {
    service
        .iter()
        .map(|(k, counts)| (k.clone(), counts.iter().filter(|(_, c)| **c > 0).map(|(t, _)| t.clone()).collect()))
        .collect()
}

fn compare(version: u64, timely: &Frontiers, service: &Frontiers, report: &mut CheckReport) {
    report.versions += 1;
    let empty = BTreeSet::new();
    let mut first: Option<String> = None;
    let mut ahead = false;
    for (key, expected) in timely {
        let got = service.get(key).unwrap_or(&empty);
        if got != expected {
            ahead |= !behind_or_equal(got, expected);
            first.get_or_insert_with(|| format!("version {version}: {key:?} service {got:?}, timely {expected:?}"));
        }
    }
    for (key, got) in service {
        if key.1 != 0 && !got.is_empty() && !timely.contains_key(key) {
            first.get_or_insert_with(|| format!("version {version}: {key:?} service {got:?}, unknown to timely"));
        }
    }
    match first {
        None => report.exact += 1,
        Some(what) => mismatch(report, ahead, what),
    }
}

fn mismatch(report: &mut CheckReport, ahead: bool, what: String) {
    report.mismatches += 1;
    report.ahead += u64::from(ahead);
    if report.first_mismatches.len() < 10 {
        report.first_mismatches.push(what);
    }
}
