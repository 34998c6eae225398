package tracker.graphx;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import org.apache.spark.graphx.Edge;
import org.apache.spark.graphx.EdgeTriplet;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;

/**
 * The computations one edge partition does alone. {@link ByKey} puts every edge of a dataflow
 * (or scope) in one edge partition and no edge joins two dataflows, so a partition's edges are
 * whole graphs: what these find within a partition is what the whole graph has.
 */
final class Local {
  private Local() {}

  /**
   * The attributes of the edges of {@code edges} whose two ends share a strongly connected
   * component, by Tarjan's algorithm (iterative: no recursion depth limit).
   */
  static Iterator<Row> onCycles(Iterator<Edge<Row>> edges) {
    List<long[]> ends = new ArrayList<>();
    List<Row> attrs = new ArrayList<>();
    Map<Long, Integer> index = new HashMap<>();
    while (edges.hasNext()) {
      Edge<Row> e = edges.next(); // GraphX reuses the object: copy what it holds now
      ends.add(new long[] {e.srcId(), e.dstId()});
      attrs.add(e.attr());
      index.putIfAbsent(e.srcId(), index.size());
      index.putIfAbsent(e.dstId(), index.size());
    }
    int n = index.size();
    List<List<Integer>> out = new ArrayList<>(n);
    for (int i = 0; i < n; i++) {
      out.add(new ArrayList<>());
    }
    for (long[] e : ends) {
      out.get(index.get(e[0])).add(index.get(e[1]));
    }
    int[] component = components(out);
    List<Row> found = new ArrayList<>();
    for (int i = 0; i < ends.size(); i++) {
      if (component[index.get(ends.get(i)[0])] == component[index.get(ends.get(i)[1])]) {
        found.add(attrs.get(i));
      }
    }
    return found.iterator();
  }

  /** Tarjan's strongly connected components of the graph {@code out} (adjacency lists). */
  static int[] components(List<List<Integer>> out) {
    int n = out.size();
    int[] order = new int[n];
    int[] low = new int[n];
    int[] component = new int[n];
    boolean[] onStack = new boolean[n];
    java.util.Arrays.fill(order, -1);
    int[] next = new int[n]; // per vertex, the next out-edge to look at
    ArrayDeque<Integer> stack = new ArrayDeque<>();
    ArrayDeque<Integer> calls = new ArrayDeque<>();
    int counter = 0;
    int components = 0;
    for (int root = 0; root < n; root++) {
      if (order[root] >= 0) {
        continue;
      }
      calls.push(root);
      order[root] = low[root] = counter++;
      stack.push(root);
      onStack[root] = true;
      while (!calls.isEmpty()) {
        int v = calls.peek();
        if (next[v] < out.get(v).size()) {
          int w = out.get(v).get(next[v]++);
          if (order[w] < 0) {
            order[w] = low[w] = counter++;
            stack.push(w);
            onStack[w] = true;
            calls.push(w);
          } else if (onStack[w]) {
            low[v] = Math.min(low[v], order[w]);
          }
          continue;
        }
        calls.pop();
        if (!calls.isEmpty()) {
          int parent = calls.peek();
          low[parent] = Math.min(low[parent], low[v]);
        }
        if (low[v] == order[v]) {
          int w;
          do {
            w = stack.pop();
            onStack[w] = false;
            component[w] = components;
          } while (w != v);
          components++;
        }
      }
    }
    return component;
  }

  /**
   * Every vertex of {@code triplets} with its frontier: the lower envelope of the times reachable
   * from the vertices' initial frontiers along the edges (each edge adds its summary), by a
   * worklist to the fixed point. It always ends: a time pushed round a cycle comes back no
   * smaller (summaries are non-negative), so it enters no frontier twice.
   */
  static Iterator<ProgressGraphs.Located> propagate(Iterator<EdgeTriplet<ProgressGraphs.Located, long[]>> triplets) {
    Map<Long, ProgressGraphs.Located> state = new HashMap<>();
    Map<Long, List<Object[]>> out = new HashMap<>();
    while (triplets.hasNext()) {
      EdgeTriplet<ProgressGraphs.Located, long[]> t = triplets.next();
      state.putIfAbsent(t.srcId(), t.srcAttr());
      state.putIfAbsent(t.dstId(), t.dstAttr());
      out.computeIfAbsent(t.srcId(), k -> new ArrayList<>()).add(new Object[] {t.dstId(), t.attr()});
    }
    Map<Long, long[][]> frontier = new HashMap<>();
    ArrayDeque<Long> work = new ArrayDeque<>();
    java.util.Set<Long> queued = new java.util.HashSet<>();
    for (Map.Entry<Long, ProgressGraphs.Located> e : state.entrySet()) {
      frontier.put(e.getKey(), e.getValue().frontier);
      if (e.getValue().frontier.length > 0) {
        work.add(e.getKey());
        queued.add(e.getKey());
      }
    }
    while (!work.isEmpty()) {
      long v = work.poll();
      queued.remove(v);
      long[][] from = frontier.get(v);
      for (Object[] edge : out.getOrDefault(v, List.of())) {
        long dst = (Long) edge[0];
        long[][] there = frontier.get(dst);
        long[][] news = Antichains.newcomers(Antichains.advance(from, (long[]) edge[1]), there);
        if (news.length > 0) {
          frontier.put(dst, Antichains.union(there, news));
          if (queued.add(dst)) {
            work.add(dst);
          }
        }
      }
    }
    List<ProgressGraphs.Located> result = new ArrayList<>(state.size());
    for (Map.Entry<Long, ProgressGraphs.Located> e : state.entrySet()) {
      ProgressGraphs.Located s = e.getValue();
      result.add(new ProgressGraphs.Located(s.key, s.loc, frontier.get(e.getKey()), true));
    }
    return result.iterator();
  }

  /**
   * {@code Psi} of the graphs of {@code triplets}: rows {@code (key, src, dst, summary)}, for every
   * vertex {@code src} and every vertex it reaches (itself included, with the zero summary, which
   * each vertex's attribute holds as its one-element frontier), the minimal path summaries. One
   * worklist fixed point per source, as {@link #propagate}.
   */
  static Iterator<Row> psi(Iterator<EdgeTriplet<ProgressGraphs.Located, long[]>> triplets) {
    Map<Long, ProgressGraphs.Located> state = new HashMap<>();
    Map<Long, List<Object[]>> out = new HashMap<>();
    while (triplets.hasNext()) {
      EdgeTriplet<ProgressGraphs.Located, long[]> t = triplets.next();
      state.putIfAbsent(t.srcId(), t.srcAttr());
      state.putIfAbsent(t.dstId(), t.dstAttr());
      out.computeIfAbsent(t.srcId(), k -> new ArrayList<>()).add(new Object[] {t.dstId(), t.attr()});
    }
    List<Row> rows = new ArrayList<>();
    for (Map.Entry<Long, ProgressGraphs.Located> source : state.entrySet()) {
      Map<Long, long[][]> reached = new HashMap<>();
      reached.put(source.getKey(), source.getValue().frontier);
      ArrayDeque<Long> work = new ArrayDeque<>();
      java.util.Set<Long> queued = new java.util.HashSet<>();
      work.add(source.getKey());
      queued.add(source.getKey());
      while (!work.isEmpty()) {
        long v = work.poll();
        queued.remove(v);
        long[][] from = reached.get(v);
        for (Object[] edge : out.getOrDefault(v, List.of())) {
          long dst = (Long) edge[0];
          long[][] there = reached.getOrDefault(dst, new long[0][]);
          long[][] news = Antichains.newcomers(Antichains.advance(from, (long[]) edge[1]), there);
          if (news.length > 0) {
            reached.put(dst, Antichains.union(there, news));
            if (queued.add(dst)) {
              work.add(dst);
            }
          }
        }
      }
      ProgressGraphs.Located src = source.getValue();
      for (Map.Entry<Long, long[][]> end : reached.entrySet()) {
        long dstLoc = state.get(end.getKey()).loc;
        for (long[] summary : end.getValue()) {
          rows.add(RowFactory.create(src.key, src.loc, dstLoc, summary));
        }
      }
    }
    return rows.iterator();
  }

  /** Rows {@code (key, loc, time)} of a vertex's frontier, one per element. */
  static Iterator<Row> rows(ProgressGraphs.Located s) {
    List<Row> out = new ArrayList<>(s.frontier.length);
    for (long[] t : s.frontier) {
      out.add(RowFactory.create(s.key, s.loc, t));
    }
    return out.iterator();
  }
}
