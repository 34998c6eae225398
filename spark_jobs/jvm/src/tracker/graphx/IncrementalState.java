package tracker.graphx;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.lit;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.function.FlatMapFunction2;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;

/**
 * Counts and frontiers kept in the executors beside the {@code Psi} index they are read with,
 * partitioned like it ({@link Incremental#index}): one {@link Part} per partition, each dataflow
 * of the partition a {@link Flow}. A batch is applied without a shuffle: its few rows are placed
 * on the driver (every dataflow's partition is known since the state was built) and go to the
 * tasks inside the closure, so one batch is one Spark stage over the cached state, whose result
 * is the next state (cached, lineage cut) and the exact frontier changes (collected).
 *
 * <p>A state is never changed: {@link #apply} returns a new one sharing the dataflows the batch
 * does not touch, so a failed batch leaves the previous state as it was.
 */
public final class IncrementalState implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final ObjectMapper JSON = new ObjectMapper();

  private final transient SparkSession spark;
  private final transient JavaRDD<Part> parts;
  private final Map<String, Integer> placement;

  private IncrementalState(SparkSession spark, JavaRDD<Part> parts, Map<String, Integer> placement) {
    this.spark = spark;
    this.parts = parts;
    this.placement = placement;
  }

  /** One dataflow's state: its {@code Psi} (shared with the index, read-only), non-zero counts
   * and every location's frontier (absent: empty). */
  static final class Flow implements Serializable {
    private static final long serialVersionUID = 1L;
    final Map<Long, List<Long>> successors;
    final Map<Long, List<Incremental.Reach>> predecessors;
    final Map<Incremental.Point, Long> counts;
    final Map<Long, long[][]> frontiers;

    Flow(Map<Long, List<Long>> successors, Map<Long, List<Incremental.Reach>> predecessors,
        Map<Incremental.Point, Long> counts, Map<Long, long[][]> frontiers) {
      this.successors = successors;
      this.predecessors = predecessors;
      this.counts = counts;
      this.frontiers = frontiers;
    }

    /** The state after {@code batch} ({@code loc, time, delta} each), and its frontier changes
     * appended to {@code changes} as {@code [loc, time, diff]}. */
    Flow apply(List<Object[]> batch, List<Object[]> changes) {
      Map<Incremental.Point, Long> next = new HashMap<>(counts);
      Set<Long> changed = new HashSet<>();
      for (Object[] row : batch) {
        long loc = (Long) row[0];
        if ((Long) row[2] == 0) {
          continue;
        }
        changed.add(loc);
        next.merge(Incremental.Point.of(loc, (long[]) row[1]), (Long) row[2], (a, b) -> a + b == 0 ? null : a + b);
      }
      Set<Long> affected = new HashSet<>();
      for (long loc : changed) {
        affected.addAll(successors.getOrDefault(loc, List.of()));
      }
      if (affected.isEmpty()) {
        return new Flow(successors, predecessors, next, frontiers);
      }
      Map<Long, List<long[]>> active = Incremental.active(next);
      Map<Long, long[][]> frontier = new HashMap<>(frontiers);
      for (long loc : affected) {
        long[][] now = Incremental.frontierOf(predecessors.getOrDefault(loc, List.of()), active);
        long[][] old = frontiers.getOrDefault(loc, new long[0][]);
        Incremental.diff(old, now, (t, diff) -> changes.add(new Object[] {loc, t, diff}));
        if (now.length == 0) {
          frontier.remove(loc);
        } else {
          frontier.put(loc, now);
        }
      }
      return new Flow(successors, predecessors, next, frontier);
    }
  }

  /** One partition's dataflows, and the frontier changes of the batch that made it
   * ({@code [dataflow_id, loc, time, diff]} each; empty for the first state). */
  static final class Part implements Serializable {
    private static final long serialVersionUID = 1L;
    final Map<String, Flow> flows;
    final List<Object[]> changes;

    Part(Map<String, Flow> flows, List<Object[]> changes) {
      this.flows = flows;
      this.changes = changes;
    }
  }

  /**
   * The state of {@code points} {@code (dataflow_id, loc, time, count)} and {@code frontiers}
   * {@code (dataflow_id, loc, time)} beside {@code index}: both shuffled once by the same hash
   * as the index, zipped with it, cached; one Spark job, which also collects every dataflow's
   * partition for {@link #apply}.
   */
  public static IncrementalState of(JavaRDD<Incremental.PsiIndex> index, Dataset<Row> points, Dataset<Row> frontiers) {
    Column zero = lit(0L);
    Dataset<Row> rows = points.select(col("dataflow_id"), lit(1).as("kind"), col("loc"), col("time"), col("count"))
        .union(frontiers.select(col("dataflow_id"), lit(3), col("loc"), col("time"), zero));
    JavaRDD<Row> placed = rows.repartition(index.getNumPartitions(), col("dataflow_id")).javaRDD();
    JavaRDD<Part> parts = index.zipPartitions(placed,
        (FlatMapFunction2<Iterator<Incremental.PsiIndex>, Iterator<Row>, Part>) (built, r) -> List.of(
            build(built.next(), r)).iterator());
    return cached(points.sparkSession(), parts, new HashMap<>());
  }

  private static Part build(Incremental.PsiIndex psi, Iterator<Row> rows) {
    Map<String, Map<Incremental.Point, Long>> counts = new HashMap<>();
    Map<String, Map<Long, List<long[]>>> frontiers = new HashMap<>();
    while (rows.hasNext()) {
      Row r = rows.next();
      String key = r.getString(0);
      long[] time = ProgressGraphs.times(r, 3);
      if (r.getInt(1) == 1) {
        counts.computeIfAbsent(key, k -> new HashMap<>())
            .merge(Incremental.Point.of(r.getLong(2), time), r.getLong(4), (a, b) -> a + b == 0 ? null : a + b);
      } else {
        frontiers.computeIfAbsent(key, k -> new HashMap<>()).computeIfAbsent(r.getLong(2), k -> new ArrayList<>())
            .add(time);
      }
    }
    Set<String> keys = new HashSet<>(psi.successors.keySet());
    keys.addAll(counts.keySet());
    keys.addAll(frontiers.keySet());
    Map<String, Flow> flows = new HashMap<>();
    for (String key : keys) {
      Map<Long, long[][]> frontier = new HashMap<>();
      frontiers.getOrDefault(key, Map.of()).forEach((loc, ts) -> frontier.put(loc, ts.toArray(new long[0][])));
      flows.put(key, new Flow(psi.successors.getOrDefault(key, Map.of()), psi.predecessors.getOrDefault(key, Map.of()),
          counts.getOrDefault(key, new HashMap<>()), frontier));
    }
    return new Part(flows, List.of());
  }

  /** {@code parts} cached with its lineage cut, computed now; the changes collected (as JSON)
   * in the same job, with every dataflow's partition (added to {@code placement}). */
  private static IncrementalState cached(SparkSession spark, JavaRDD<Part> parts, Map<String, Integer> placement) {
    parts.persist(StorageLevel.MEMORY_AND_DISK());
    parts.rdd().localCheckpoint();
    List<Tuple2<Integer, Part>> collected = parts.mapPartitionsWithIndex((i, it) -> {
      List<Tuple2<Integer, Part>> out = new ArrayList<>();
      while (it.hasNext()) {
        Part p = it.next();
        // Only what the driver needs: the dataflows' keys (placement) and the changes.
        Map<String, Flow> keys = new HashMap<>();
        p.flows.keySet().forEach(k -> keys.put(k, null));
        out.add(new Tuple2<>(i, new Part(keys, p.changes)));
      }
      return out.iterator();
    }, true).collect();
    Map<String, Integer> where = new HashMap<>(placement);
    List<Object[]> changes = new ArrayList<>();
    for (Tuple2<Integer, Part> t : collected) {
      t._2().flows.keySet().forEach(k -> where.put(k, t._1()));
      changes.addAll(t._2().changes);
    }
    IncrementalState state = new IncrementalState(spark, parts, where);
    state.lastChanges = changes;
    return state;
  }

  private transient List<Object[]> lastChanges = List.of();

  /**
   * The state after {@code batchJson}, a JSON array of {@code [dataflow_id, loc, [time...],
   * delta]}: one Spark stage (no shuffle), computed and cached now. Its exact frontier changes
   * are {@link #changesJson} of the returned state. This state is left as it was.
   */
  public IncrementalState apply(String batchJson) throws JsonProcessingException {
    int n = parts.getNumPartitions();
    Map<Integer, Map<String, List<Object[]>>> byPart = new HashMap<>();
    for (JsonNode row : JSON.readTree(batchJson)) {
      String key = row.get(0).asText();
      // A dataflow the state has never seen (no Psi, no counts) goes where the hash puts it.
      int part = placement.getOrDefault(key, Math.floorMod(key.hashCode(), n));
      long[] time = new long[row.get(2).size()];
      for (int i = 0; i < time.length; i++) {
        time[i] = row.get(2).get(i).asLong();
      }
      byPart.computeIfAbsent(part, k -> new HashMap<>()).computeIfAbsent(key, k -> new ArrayList<>())
          .add(new Object[] {row.get(1).asLong(), time, row.get(3).asLong()});
    }
    JavaRDD<Part> next = parts.mapPartitionsWithIndex((i, it) -> {
      Part p = it.next();
      Map<String, List<Object[]>> mine = byPart.getOrDefault(i, Map.of());
      if (mine.isEmpty()) {
        return List.of(new Part(p.flows, List.of())).iterator();
      }
      Map<String, Flow> flows = new HashMap<>(p.flows);
      List<Object[]> changes = new ArrayList<>();
      for (Map.Entry<String, List<Object[]>> e : mine.entrySet()) {
        Flow before = flows.getOrDefault(e.getKey(), new Flow(Map.of(), Map.of(), Map.of(), Map.of()));
        List<Object[]> local = new ArrayList<>();
        flows.put(e.getKey(), before.apply(e.getValue(), local));
        for (Object[] c : local) {
          changes.add(new Object[] {e.getKey(), c[0], c[1], c[2]});
        }
      }
      return List.of(new Part(flows, changes)).iterator();
    }, true);
    return cached(spark, next, placement);
  }

  /** The frontier changes of the batch that made this state, as a JSON array of
   * {@code [dataflow_id, loc, [time...], diff]} ({@code []} for the first state). */
  public String changesJson() throws JsonProcessingException {
    return JSON.writeValueAsString(lastChanges);
  }

  /** The state's rows in {@link Incremental#SCHEMA}'s shape: tag "p" the counts, "f" the
   * frontiers (lazy: a Spark job when read). */
  public Dataset<Row> rows() {
    JavaRDD<Row> rows = parts.flatMap(p -> {
      List<Row> out = new ArrayList<>();
      p.flows.forEach((key, flow) -> {
        flow.counts.forEach((pt, c) -> out.add(RowFactory.create(key, "p", pt.loc(), pt.times(), c)));
        flow.frontiers.forEach((loc, ts) -> Arrays.stream(ts).forEach(
            t -> out.add(RowFactory.create(key, "f", loc, t, 0L))));
      });
      return out.iterator();
    });
    return spark.createDataFrame(rows, Incremental.SCHEMA);
  }

  /** Drop the cached partitions (the state must not be used afterwards). */
  public void unpersist() {
    parts.unpersist(false);
  }
}
