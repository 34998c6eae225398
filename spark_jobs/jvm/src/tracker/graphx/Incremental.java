package tracker.graphx;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.lit;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * A batch of count changes applied to many dataflows at once, each dataflow in one task: its
 * {@code Psi} rows, counts, batch and frontiers gathered by one shuffle, then new counts, the
 * frontiers of the locations the batch can move and the exact frontier changes computed there.
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
        .mapPartitions((MapPartitionsFunction<Row, Row>) Incremental::partition, Encoders.row(SCHEMA));
    return out.localCheckpoint(true);
  }

  static Iterator<Row> partition(Iterator<Row> rows) {
    Map<String, List<List<Row>>> byKey = new HashMap<>();
    while (rows.hasNext()) {
      Row r = rows.next();
      List<List<Row>> lists = byKey.computeIfAbsent(r.getString(0),
          k -> List.of(new ArrayList<>(), new ArrayList<>(), new ArrayList<>(), new ArrayList<>()));
      lists.get(r.getInt(1)).add(r);
    }
    List<Row> out = new ArrayList<>();
    for (Map.Entry<String, List<List<Row>>> e : byKey.entrySet()) {
      List<List<Row>> l = e.getValue();
      one(e.getKey(), l.get(0), l.get(1), l.get(2), l.get(3)).forEachRemaining(out::add);
    }
    return out.iterator();
  }

  static Iterator<Row> one(String key, Iterable<Row> psi, Iterable<Row> points, Iterable<Row> batch,
      Iterable<Row> frontiers) {
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
    Map<Long, List<long[]>> active = new HashMap<>();
    for (Map.Entry<Point, Long> e : counts.entrySet()) {
      if (e.getValue() != 0) {
        out.add(RowFactory.create(key, "p", e.getKey().loc(), e.getKey().times(), e.getValue()));
      }
      if (e.getValue() > 0) {
        active.computeIfAbsent(e.getKey().loc(), k -> new ArrayList<>()).add(e.getKey().times());
      }
    }
    Set<Long> affected = new HashSet<>();
    if (!changed.isEmpty()) {
      for (Row r : psi) {
        if (changed.contains(r.getLong(2))) {
          affected.add(r.getLong(3));
        }
      }
    }
    Map<Long, long[][]> recomputed = new HashMap<>();
    for (long loc : affected) {
      recomputed.put(loc, new long[0][]);
    }
    if (!affected.isEmpty()) {
      for (Row r : psi) {
        List<long[]> times = active.get(r.getLong(2));
        if (times != null && affected.contains(r.getLong(3))) {
          long[][] reached = Antichains.advance(times.toArray(new long[0][]), ProgressGraphs.times(r, 4));
          recomputed.merge(r.getLong(3), reached, Antichains::union);
        }
      }
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
    for (Map.Entry<Long, long[][]> e : recomputed.entrySet()) {
      long loc = e.getKey();
      List<long[]> old = before.getOrDefault(loc, List.of());
      for (long[] t : e.getValue()) {
        out.add(RowFactory.create(key, "f", loc, t, 0L));
        if (old.stream().noneMatch(o -> Arrays.equals(o, t))) {
          out.add(RowFactory.create(key, "c", loc, t, 1L));
        }
      }
      for (long[] t : old) {
        if (Arrays.stream(e.getValue()).noneMatch(n -> Arrays.equals(n, t))) {
          out.add(RowFactory.create(key, "c", loc, t, -1L));
        }
      }
    }
    return out.iterator();
  }
}
