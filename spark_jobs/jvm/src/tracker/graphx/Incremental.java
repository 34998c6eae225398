package tracker.graphx;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.lit;

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
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.storage.StorageLevel;

/**
 * A batch of count changes applied to many dataflows at once, each dataflow in one task: its
 * {@code Psi} rows, counts, batch and frontiers gathered by one shuffle, then new counts, the
 * frontiers of the locations the batch can move and the exact frontier changes computed there.
 *
 * <p>{@code Psi} may instead be indexed once for many batches ({@link #index}): each partition's
 * rows, per dataflow, as every location's successors and every location's predecessors with
 * their summaries, cached in the executors' memory; a batch then shuffles only its counts,
 * changes and frontiers, and reads only the {@code Psi} entries of the locations it can move.
 */
public final class Incremental {
  private Incremental() {}

  /** Tagged rows: {@code tag} "p" a count ({@code value} the count), "c" a frontier change
   * ({@code value} +1 or -1), "f" a frontier element ({@code value} 0). */
  static final StructType SCHEMA = new StructType()
      .add("dataflow_id", DataTypes.StringType)
      .add("tag", DataTypes.StringType)
      .add("loc", DataTypes.LongType)
      .add("time", DataTypes.createArrayType(DataTypes.LongType))
      .add("value", DataTypes.LongType);

  /** The four inputs as one frame {@code (dataflow_id, kind, a, b, t, v)}: kind 0 a {@code Psi}
   * row (a src, b dst, t summary), 1 a count (a loc, t time, v count), 2 a batch row (v delta),
   * 3 a frontier element. */
  static final StructType TAGGED = new StructType()
      .add("dataflow_id", DataTypes.StringType)
      .add("kind", DataTypes.IntegerType)
      .add("a", DataTypes.LongType)
      .add("b", DataTypes.LongType)
      .add("t", DataTypes.createArrayType(DataTypes.LongType))
      .add("v", DataTypes.LongType);

  /** A location and a time, as a hash key. */
  record Point(long loc, List<Long> time) {
    static Point of(long loc, long[] time) {
      List<Long> boxed = new ArrayList<>(time.length);
      for (long x : time) {
        boxed.add(x);
      }
      return new Point(loc, boxed);
    }

    long[] times() {
      long[] out = new long[time.size()];
      for (int i = 0; i < out.length; i++) {
        out[i] = time.get(i);
      }
      return out;
    }
  }

  /**
   * Apply {@code batch} {@code (dataflow_id, loc, time, delta)} to {@code points}
   * {@code (dataflow_id, loc, time, count)} and update {@code frontiers}
   * {@code (dataflow_id, loc, time)} given {@code psi} {@code (dataflow_id, src, dst, summary)}:
   * only the locations some changed location reaches are recomputed (one pass over the
   * dataflow's {@code Psi}); see {@link #SCHEMA} for the rows returned, materialised. One
   * shuffle gathers each dataflow's rows of all four in one task (Spark SQL's exchange, whose
   * binary rows measured faster than an RDD cogroup's serialised objects).
   */
  public static Dataset<Row> apply(Dataset<Row> psi, Dataset<Row> points, Dataset<Row> batch, Dataset<Row> frontiers) {
    Column zero = lit(0L);
    Dataset<Row> all = psi.select(col("dataflow_id"), lit(0).as("kind"), col("src").as("a"), col("dst").as("b"),
            col("summary").as("t"), zero.as("v"))
        .union(points.select(col("dataflow_id"), lit(1), col("loc"), zero, col("time"), col("count")))
        .union(batch.select(col("dataflow_id"), lit(2), col("loc"), zero, col("time"), col("delta")))
        .union(frontiers.select(col("dataflow_id"), lit(3), col("loc"), zero, col("time"), zero));
    Dataset<Row> out = all.repartition(ProgressGraphs.parts(psi.sparkSession()), col("dataflow_id"))
        .mapPartitions((MapPartitionsFunction<Row, Row>) rows -> partition(null, rows), Encoders.row(SCHEMA));
    return out.localCheckpoint(true);
  }

  /** One location reaching another with a minimal summary (a {@code Psi} entry seen from its end). */
  record Reach(long src, long[] summary) implements Serializable {}

  /** One partition's {@code Psi}, per dataflow key: each location's successors, and each
   * location's predecessors with the summaries. */
  public static final class PsiIndex implements Serializable {
    private static final long serialVersionUID = 1L;
    final Map<String, Map<Long, List<Long>>> successors = new HashMap<>();
    final Map<String, Map<Long, List<Reach>>> predecessors = new HashMap<>();

    void add(String key, long src, long dst, long[] summary) {
      successors.computeIfAbsent(key, k -> new HashMap<>()).computeIfAbsent(src, k -> new ArrayList<>()).add(dst);
      predecessors.computeIfAbsent(key, k -> new HashMap<>()).computeIfAbsent(dst, k -> new ArrayList<>())
          .add(new Reach(src, summary));
    }
  }

  /**
   * {@code psi} {@code (dataflow_id, src, dst, summary)} hash-partitioned by {@code dataflow_id}
   * into the session's shuffle partitions (one shuffle, here) and indexed per partition
   * ({@link PsiIndex}), kept in memory (cached, computed now); partition {@code i} holds the
   * dataflows whose key hashes to {@code i}, as Spark SQL's {@code repartition} places them.
   * Pass it to {@link #applyIndexed} batch after batch.
   */
  public static JavaRDD<PsiIndex> index(Dataset<Row> psi) {
    JavaRDD<PsiIndex> index = psi.select("dataflow_id", "src", "dst", "summary")
        .repartition(ProgressGraphs.parts(psi.sparkSession()), col("dataflow_id")).javaRDD()
        .mapPartitions(rows -> {
          PsiIndex built = new PsiIndex();
          rows.forEachRemaining(r -> built.add(r.getString(0), r.getLong(1), r.getLong(2), ProgressGraphs.times(r, 3)));
          return List.of(built).iterator();
        })
        .persist(StorageLevel.MEMORY_AND_DISK());
    index.count();
    return index;
  }

  /**
   * {@link #apply} with {@code Psi} from {@link #index}: the counts, the batch and the frontiers
   * are shuffled by the same hash into as many partitions, and each is zipped with the same
   * partition of the index, so each dataflow meets all its rows in one task. One Spark job.
   */
  public static Dataset<Row> applyIndexed(JavaRDD<PsiIndex> index, Dataset<Row> points, Dataset<Row> batch,
      Dataset<Row> frontiers) {
    Column zero = lit(0L);
    Dataset<Row> rest = points.select(col("dataflow_id"), lit(1).as("kind"), col("loc").as("a"), zero.as("b"),
            col("time").as("t"), col("count").as("v"))
        .union(batch.select(col("dataflow_id"), lit(2), col("loc"), zero, col("time"), col("delta")))
        .union(frontiers.select(col("dataflow_id"), lit(3), col("loc"), zero, col("time"), zero));
    JavaRDD<Row> rows = rest.repartition(index.getNumPartitions(), col("dataflow_id")).javaRDD();
    JavaRDD<Row> out = index.zipPartitions(rows,
        (FlatMapFunction2<Iterator<PsiIndex>, Iterator<Row>, Row>) (built, r) -> partition(built.next(), r));
    return points.sparkSession().createDataFrame(out, SCHEMA).localCheckpoint(true);
  }

  /** One partition's rows (of {@link #TAGGED}'s shape) computed dataflow by dataflow; {@code Psi}
   * from {@code index} if given, else from the rows of kind 0. */
  static Iterator<Row> partition(PsiIndex index, Iterator<Row> rows) {
    PsiIndex psi = index == null ? new PsiIndex() : index;
    Map<String, List<List<Row>>> byKey = new HashMap<>();
    while (rows.hasNext()) {
      Row r = rows.next();
      int kind = r.getInt(1);
      if (kind == 0) {
        psi.add(r.getString(0), r.getLong(2), r.getLong(3), ProgressGraphs.times(r, 4));
        continue;
      }
      byKey.computeIfAbsent(r.getString(0), k -> List.of(new ArrayList<>(), new ArrayList<>(), new ArrayList<>()))
          .get(kind - 1).add(r);
    }
    List<Row> out = new ArrayList<>();
    for (Map.Entry<String, List<List<Row>>> e : byKey.entrySet()) {
      List<List<Row>> l = e.getValue();
      String key = e.getKey();
      one(key, psi.successors.getOrDefault(key, Map.of()), psi.predecessors.getOrDefault(key, Map.of()),
          l.get(0), l.get(1), l.get(2)).forEachRemaining(out::add);
    }
    return out.iterator();
  }

  static Iterator<Row> one(String key, Map<Long, List<Long>> successors, Map<Long, List<Reach>> predecessors,
      Iterable<Row> points, Iterable<Row> batch, Iterable<Row> frontiers) {
    Map<Point, Long> counts = new HashMap<>();
    for (Row r : points) {
      counts.merge(Point.of(r.getLong(2), ProgressGraphs.times(r, 4)), r.getLong(5), Long::sum);
    }
    Set<Long> changed = new HashSet<>();
    for (Row r : batch) {
      changed.add(r.getLong(2));
      counts.merge(Point.of(r.getLong(2), ProgressGraphs.times(r, 4)), r.getLong(5), Long::sum);
    }
    List<Row> out = new ArrayList<>();
    for (Map.Entry<Point, Long> e : counts.entrySet()) {
      if (e.getValue() != 0) {
        out.add(RowFactory.create(key, "p", e.getKey().loc(), e.getKey().times(), e.getValue()));
      }
    }
    Map<Long, List<long[]>> active = active(counts);
    Set<Long> affected = new HashSet<>();
    for (long loc : changed) {
      affected.addAll(successors.getOrDefault(loc, List.of()));
    }
    Map<Long, List<long[]>> before = new HashMap<>();
    for (Row r : frontiers) {
      long loc = r.getLong(2);
      if (affected.contains(loc)) {
        before.computeIfAbsent(loc, k -> new ArrayList<>()).add(ProgressGraphs.times(r, 4));
      } else {
        out.add(RowFactory.create(key, "f", loc, ProgressGraphs.times(r, 4), 0L));
      }
    }
    for (long loc : affected) {
      long[][] now = frontierOf(predecessors.getOrDefault(loc, List.of()), active);
      for (long[] t : now) {
        out.add(RowFactory.create(key, "f", loc, t, 0L));
      }
      diff(before.getOrDefault(loc, List.of()).toArray(new long[0][]), now,
          (t, d) -> out.add(RowFactory.create(key, "c", loc, t, d)));
    }
    return out.iterator();
  }

  /** Each location's times with a positive count. */
  static Map<Long, List<long[]>> active(Map<Point, Long> counts) {
    Map<Long, List<long[]>> active = new HashMap<>();
    counts.forEach((point, count) -> {
      if (count > 0) {
        active.computeIfAbsent(point.loc(), k -> new ArrayList<>()).add(point.times());
      }
    });
    return active;
  }

  /** A location's frontier: the lower envelope of the active times of its {@code Psi}
   * predecessors, each advanced by its summaries. */
  static long[][] frontierOf(List<Reach> predecessors, Map<Long, List<long[]>> active) {
    long[][] frontier = new long[0][];
    for (Reach from : predecessors) {
      List<long[]> times = active.get(from.src());
      if (times != null) {
        frontier = Antichains.union(frontier, Antichains.advance(times.toArray(new long[0][]), from.summary()));
      }
    }
    return frontier;
  }

  /** Receives one frontier change: a time and +1 (it entered) or -1 (it left). */
  interface Change {
    void accept(long[] time, long diff);
  }

  /** The changes from frontier {@code old} to {@code now}: +1 for each time of {@code now} not in
   * {@code old}, -1 for each time of {@code old} not in {@code now}. */
  static void diff(long[][] old, long[][] now, Change out) {
    for (long[] t : now) {
      if (Arrays.stream(old).noneMatch(o -> Arrays.equals(o, t))) {
        out.accept(t, 1L);
      }
    }
    for (long[] t : old) {
      if (Arrays.stream(now).noneMatch(n -> Arrays.equals(n, t))) {
        out.accept(t, -1L);
      }
    }
  }
}
