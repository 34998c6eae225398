package tracker.graphx;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.hash;
import static org.apache.spark.sql.functions.lit;
import static org.apache.spark.sql.functions.max;
import static org.apache.spark.sql.functions.monotonically_increasing_id;
import static org.apache.spark.sql.functions.pmod;
import static org.apache.spark.sql.functions.shiftleft;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.graphx.Edge;
import org.apache.spark.graphx.EdgeDirection;
import org.apache.spark.graphx.EdgeTriplet;
import org.apache.spark.graphx.Graph;
import org.apache.spark.graphx.Pregel;
import org.apache.spark.graphx.lib.StronglyConnectedComponents;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractFunction1;
import scala.runtime.AbstractFunction2;
import scala.runtime.AbstractFunction3;

/**
 * The graph computations of the progress tracker on GraphX, called from PySpark with DataFrames.
 *
 * <p>Locations are the Python side's BIGINT codes, keyed by {@code dataflow_id} (one job covers
 * many dataflows, or scopes); GraphX needs one vertex id per (key, location), which
 * {@link #withIds} assigns. Times and summaries are {@code ARRAY<BIGINT>} of one arity per key;
 * frontiers are lower antichains under the product order ({@link Antichains}).
 */
public final class ProgressGraphs {
  private ProgressGraphs() {}

  static final StructType CYCLE_SCHEMA = new StructType()
      .add("dataflow_id", DataTypes.StringType)
      .add("src", DataTypes.LongType)
      .add("dst", DataTypes.LongType);
  static final StructType TIMES_SCHEMA = new StructType()
      .add("dataflow_id", DataTypes.StringType)
      .add("loc", DataTypes.LongType)
      .add("time", DataTypes.createArrayType(DataTypes.LongType));

  static final StructType PSI_SCHEMA = new StructType()
      .add("dataflow_id", DataTypes.StringType)
      .add("src", DataTypes.LongType)
      .add("dst", DataTypes.LongType)
      .add("summary", DataTypes.createArrayType(DataTypes.LongType));

  /** The helper's version, checked by the Python side against the one it was built for. */
  public static String version() {
    return "1";
  }

  static <T> ClassTag<T> tag(Class<T> cls) {
    return ClassTag$.MODULE$.apply(cls);
  }

  /** How many edge partitions a graph gets: the session's shuffle partitions. */
  static int parts(SparkSession spark) {
    return Integer.parseInt(spark.conf().get("spark.sql.shuffle.partitions"));
  }

  /**
   * {@code (dataflow_id, loc, linked, vid)}: one unique vertex id for each location of
   * {@code locations} {@code (dataflow_id, loc, linked)}; {@code linked} is true where some row
   * said so (the location is an end of a transition). The id's top bits are a hash of the
   * dataflow key modulo {@code parts}, which {@link ByKey} reads; the rest is Spark's
   * monotonically increasing id (unique while there are fewer than 2^17 partitions).
   * Materialised once: those ids come from the partition layout, which must not change between
   * the joins that read them.
   */
  static Dataset<Row> withIds(Dataset<Row> locations, int parts) {
    Column bucket = pmod(hash(col("dataflow_id")), lit(parts)).cast("long");
    return locations.groupBy("dataflow_id", "loc").agg(max("linked").as("linked"))
        .withColumn("vid", shiftleft(bucket, ByKey.SHIFT).bitwiseOR(monotonically_increasing_id()))
        .localCheckpoint(true);
  }

  static Dataset<Row> ends(Dataset<Row> edges) {
    return edges.select(col("dataflow_id"), col("src").as("loc"), lit(true).as("linked"))
        .union(edges.select(col("dataflow_id"), col("dst").as("loc"), lit(true).as("linked")));
  }

  /** {@code (dataflow_id, src, dst, svid, dvid, ...)}: {@code edges} with both ends' vertex ids. */
  static Dataset<Row> idEdges(Dataset<Row> edges, Dataset<Row> ids) {
    Dataset<Row> s = ids.select(col("dataflow_id"), col("loc").as("src"), col("vid").as("svid"));
    Dataset<Row> d = ids.select(col("dataflow_id"), col("loc").as("dst"), col("vid").as("dvid"));
    return edges.join(s, new String[] {"dataflow_id", "src"}).join(d, new String[] {"dataflow_id", "dst"});
  }

  static void require(boolean ok, String what) {
    if (!ok) {
      throw new IllegalArgumentException(what);
    }
  }

  // ---- the cycle check ---------------------------------------------------------------------

  /**
   * The transitions {@code (dataflow_id, src, dst)} of {@code zero} (transitions whose summary
   * does not advance time) that lie on a cycle: those whose two ends share a strongly
   * connected component of the graph {@code zero} makes (a self-loop is one, alone).
   *
   * <p>{@code method}: {@code "local"} partitions GraphX's graph by dataflow ({@link ByKey}) and
   * finds each edge partition's components by Tarjan's algorithm, in one stage;
   * {@code "pregel"} runs GraphX's {@link StronglyConnectedComponents} (what GraphFrames runs:
   * trimming then colouring by Pregel, a few Spark jobs per trimmed layer).
   */
  public static Dataset<Row> cycles(Dataset<Row> zero, String method) {
    require(method.equals("local") || method.equals("pregel"), "cycles: method is local or pregel, not " + method);
    SparkSession spark = zero.sparkSession();
    int parts = parts(spark);
    Dataset<Row> edges = zero.select("dataflow_id", "src", "dst").distinct();
    Dataset<Row> ids = withIds(ends(edges), parts);
    JavaRDD<Edge<Row>> graphEdges = idEdges(edges, ids).toJavaRDD().map(r -> new Edge<>(
        r.<Long>getAs("svid"), r.<Long>getAs("dvid"),
        RowFactory.create(r.<String>getAs("dataflow_id"), r.<Long>getAs("src"), r.<Long>getAs("dst"))));
    Graph<Integer, Row> graph = Graph.fromEdges(graphEdges.rdd(), 0, StorageLevel.MEMORY_ONLY(),
        StorageLevel.MEMORY_ONLY(), tag(Integer.class), tag(Row.class));
    JavaRDD<Row> onCycles;
    Graph<Object, Row> components = null;
    if (method.equals("local")) {
      graph = graph.partitionBy(new ByKey(), parts);
      onCycles = graph.edges().toJavaRDD().mapPartitions(Local::onCycles);
    } else {
      components = StronglyConnectedComponents.run(graph, Integer.MAX_VALUE, tag(Integer.class), tag(Row.class));
      onCycles = components.triplets().toJavaRDD()
          .filter(t -> ((Long) t.srcAttr()).longValue() == ((Long) t.dstAttr()).longValue())
          .map(EdgeTriplet::attr);
    }
    Dataset<Row> found = spark.createDataFrame(onCycles, CYCLE_SCHEMA).localCheckpoint(true);
    if (components != null) {
      components.unpersist(false);
    }
    graph.unpersist(false);
    return found;
  }

  // ---- frontier propagation ----------------------------------------------------------------

  /** A vertex of the propagation: its key and location, and its frontier so far. */
  public static final class Located implements Serializable {
    private static final long serialVersionUID = 1L;
    final String key;
    final long loc;
    final long[][] frontier;
    final boolean linked;

    Located(String key, long loc, long[][] frontier, boolean linked) {
      this.key = key;
      this.loc = loc;
      this.frontier = frontier;
      this.linked = linked;
    }
  }

  static final class Absorb extends AbstractFunction3<Object, Located, long[][], Located> implements Serializable {
    private static final long serialVersionUID = 1L;

    @Override
    public Located apply(Object vid, Located state, long[][] message) {
      return message.length == 0 ? state : new Located(state.key, state.loc, Antichains.union(state.frontier, message), state.linked);
    }
  }

  /** Along a transition, the source's frontier advanced by the summary, minus what the
   * destination has already: a message only when something would enter its frontier. */
  static final class Advance extends AbstractFunction1<EdgeTriplet<Located, long[]>,
      scala.collection.Iterator<Tuple2<Object, long[][]>>> implements Serializable {
    private static final long serialVersionUID = 1L;

    @Override
    public scala.collection.Iterator<Tuple2<Object, long[][]>> apply(EdgeTriplet<Located, long[]> t) {
      long[][] news = Antichains.newcomers(Antichains.advance(t.srcAttr().frontier, t.attr()), t.dstAttr().frontier);
      if (news.length == 0) {
        return scala.jdk.javaapi.CollectionConverters.asScala(Collections.<Tuple2<Object, long[][]>>emptyIterator());
      }
      return scala.jdk.javaapi.CollectionConverters.asScala(
          Collections.singletonList(new Tuple2<Object, long[][]>(t.dstId(), news)).iterator());
    }
  }

  static final class Merge extends AbstractFunction2<long[][], long[][], long[][]> implements Serializable {
    private static final long serialVersionUID = 1L;

    @Override
    public long[][] apply(long[][] a, long[][] b) {
      return Antichains.union(a, b);
    }
  }

  static long[] times(Row row, int index) {
    List<Object> values = row.getList(index);
    long[] out = new long[values.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = ((Number) values.get(i)).longValue();
    }
    return out;
  }

  /**
   * Every location's frontier {@code (dataflow_id, loc, time)}: the lower envelope of the times
   * reachable from the active {@code times} {@code (dataflow_id, loc, time)} along
   * {@code transitions} {@code (dataflow_id, src, dst, summary)}. Locations reached by nothing
   * are absent.
   *
   * <p>{@code method}: {@code "local"} partitions GraphX's graph by dataflow ({@link ByKey}) and
   * runs each edge partition's triplets to their fixed point by a worklist, in one stage;
   * {@code "pregel"} runs GraphX's Pregel (each superstep moves what newly entered a frontier
   * one transition on, so supersteps follow the depth; at most {@code maxSupersteps}, and the
   * transitions must then have no cycle that does not advance time).
   */
  public static Dataset<Row> propagate(Dataset<Row> transitions, Dataset<Row> times, String method,
      int maxSupersteps) {
    require(method.equals("local") || method.equals("pregel"), "propagate: method is local or pregel, not " + method);
    SparkSession spark = transitions.sparkSession();
    int parts = parts(spark);
    Dataset<Row> ids = withIds(ends(transitions)
        .union(times.select(col("dataflow_id"), col("loc"), lit(false).as("linked"))), parts);
    JavaRDD<Edge<long[]>> edges = idEdges(transitions, ids).toJavaRDD()
        .map(r -> new Edge<>(r.<Long>getAs("svid"), r.<Long>getAs("dvid"), times(r, r.fieldIndex("summary"))));
    JavaRDD<Tuple2<Object, Located>> vertices = ids.join(times, new String[] {"dataflow_id", "loc"}, "left")
        .toJavaRDD()
        .mapToPair(r -> new Tuple2<>(r.<Long>getAs("vid"), r))
        .groupByKey()
        .map(group -> {
          String key = null;
          long loc = 0;
          boolean linked = false;
          long[][] frontier = new long[0][];
          for (Row r : group._2()) {
            key = r.getAs("dataflow_id");
            loc = r.<Long>getAs("loc");
            linked = r.<Boolean>getAs("linked");
            if (!r.isNullAt(r.fieldIndex("time"))) {
              frontier = Antichains.union(frontier, new long[][] {times(r, r.fieldIndex("time"))});
            }
          }
          return new Tuple2<Object, Located>(group._1(), new Located(key, loc, frontier, linked));
        });
    Graph<Located, long[]> graph = Graph.apply(vertices.rdd(), edges.rdd(), new Located(null, 0, new long[0][], false),
        StorageLevel.MEMORY_ONLY(), StorageLevel.MEMORY_ONLY(), tag(Located.class), tag(long[].class));
    JavaRDD<Located> located;
    Graph<Located, long[]> done = null;
    if (method.equals("local")) {
      graph = graph.partitionBy(new ByKey(), parts);
      // Locations no transition touches keep their own times; the others are their partition's.
      located = graph.triplets().toJavaRDD().mapPartitions(Local::propagate)
          .union(graph.vertices().toJavaRDD().map(Tuple2::_2).filter(s -> !s.linked));
    } else {
      done = Pregel.apply(graph, new long[0][], maxSupersteps, EdgeDirection.Out(), new Absorb(), new Advance(),
          new Merge(), tag(Located.class), tag(long[].class), tag(long[][].class));
      located = done.vertices().toJavaRDD().map(Tuple2::_2);
    }
    Dataset<Row> frontier = spark.createDataFrame(located.flatMap(Local::rows), TIMES_SCHEMA).localCheckpoint(true);
    if (done != null) {
      done.unpersist(false);
    }
    graph.unpersist(false);
    return frontier;
  }

  // ---- path summaries ----------------------------------------------------------------------

  /**
   * {@code Psi} {@code (dataflow_id, src, dst, summary)}: for every location of
   * {@code locations} {@code (dataflow_id, loc, arity)} and every location it reaches along
   * {@code transitions} {@code (dataflow_id, src, dst, summary)}, itself included (the zero
   * summary), the minimal path summaries. GraphX's graph partitioned by dataflow ({@link ByKey}),
   * each edge partition's sources run to their fixed point in one stage. The transitions must
   * have no cycle that does not advance time (the cycle check says so first).
   */
  public static Dataset<Row> psi(Dataset<Row> transitions, Dataset<Row> locations) {
    SparkSession spark = transitions.sparkSession();
    int parts = parts(spark);
    Dataset<Row> ids = withIds(ends(transitions)
        .union(locations.select(col("dataflow_id"), col("loc"), lit(false).as("linked"))), parts)
        .join(locations.select("dataflow_id", "loc", "arity"), new String[] {"dataflow_id", "loc"});
    JavaRDD<Edge<long[]>> edges = idEdges(transitions, ids).toJavaRDD()
        .map(r -> new Edge<>(r.<Long>getAs("svid"), r.<Long>getAs("dvid"), times(r, r.fieldIndex("summary"))));
    JavaRDD<Tuple2<Object, Located>> vertices = ids.toJavaRDD().map(r -> new Tuple2<Object, Located>(
        r.<Long>getAs("vid"), new Located(r.getAs("dataflow_id"), r.<Long>getAs("loc"),
            new long[][] {new long[r.<Integer>getAs("arity")]}, r.<Boolean>getAs("linked"))));
    Graph<Located, long[]> graph = Graph.apply(vertices.rdd(), edges.rdd(), new Located(null, 0, new long[0][], false),
        StorageLevel.MEMORY_ONLY(), StorageLevel.MEMORY_ONLY(), tag(Located.class), tag(long[].class))
        .partitionBy(new ByKey(), parts);
    // Locations no transition touches reach only themselves.
    JavaRDD<Row> rows = graph.triplets().toJavaRDD().mapPartitions(Local::psi)
        .union(graph.vertices().toJavaRDD().map(Tuple2::_2).filter(s -> !s.linked)
            .map(s -> RowFactory.create(s.key, s.loc, s.loc, s.frontier[0])));
    Dataset<Row> psi = spark.createDataFrame(rows, PSI_SCHEMA).localCheckpoint(true);
    graph.unpersist(false);
    return psi;
  }
}
