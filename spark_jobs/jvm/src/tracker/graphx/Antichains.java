package tracker.graphx;

import java.util.ArrayList;
import java.util.List;

/**
 * Lower antichains of times under the product order ({@code a <= b} iff every coordinate is),
 * as arrays of {@code long[]}: the frontiers the tracker computes. Every method returns a new
 * array and leaves its arguments alone (GraphX may reuse vertex attributes).
 */
final class Antichains {
  private Antichains() {}

  static boolean lessEqual(long[] a, long[] b) {
    for (int i = 0; i < a.length; i++) {
      if (a[i] > b[i]) {
        return false;
      }
    }
    return true;
  }

  /** The minimal elements of {@code a} and {@code b} together. */
  static long[][] union(long[][] a, long[][] b) {
    List<long[]> kept = new ArrayList<>(a.length + b.length);
    for (long[] t : a) {
      insert(kept, t);
    }
    for (long[] t : b) {
      insert(kept, t);
    }
    return kept.toArray(new long[0][]);
  }

  private static void insert(List<long[]> kept, long[] t) {
    for (long[] e : kept) {
      if (lessEqual(e, t)) {
        return; // t is dominated by (or equal to) an element already there
      }
    }
    kept.removeIf(e -> lessEqual(t, e));
    kept.add(t);
  }

  /** Every time of {@code times} advanced by {@code summary} (coordinate-wise sums). */
  static long[][] advance(long[][] times, long[] summary) {
    long[][] out = new long[times.length][];
    for (int i = 0; i < times.length; i++) {
      long[] t = new long[summary.length];
      for (int j = 0; j < t.length; j++) {
        t[j] = times[i][j] + summary[j];
      }
      out[i] = t;
    }
    return out;
  }

  /** The minimal elements of {@code candidates} that no element of {@code frontier} dominates
   * or equals: exactly those that would enter the frontier. */
  static long[][] newcomers(long[][] candidates, long[][] frontier) {
    List<long[]> out = new ArrayList<>();
    for (long[] c : union(candidates, new long[0][])) {
      boolean covered = false;
      for (long[] f : frontier) {
        if (lessEqual(f, c)) {
          covered = true;
          break;
        }
      }
      if (!covered) {
        out.add(c);
      }
    }
    return out.toArray(new long[0][]);
  }
}
