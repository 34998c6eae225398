package tracker.graphx;

import org.apache.spark.graphx.PartitionStrategy;

/**
 * Edges by the partition their vertex ids carry in their top bits ({@link ProgressGraphs#withIds}
 * puts a hash of the dataflow key there): every edge of one dataflow, or scope, lands in the same
 * edge partition, whole.
 */
final class ByKey implements PartitionStrategy {
  private static final long serialVersionUID = 1L;
  static final int SHIFT = 50;

  @Override
  public int getPartition(long src, long dst, int numParts) {
    return (int) ((src >>> SHIFT) % numParts);
  }
}
