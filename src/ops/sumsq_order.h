/* sumsq_order.h — the one order in which every backend sums the squares of a range of fp32
 * values (the op sumsq_ranges, ops_list.h), so that the gradient norm is bitwise the same
 * on the CPU, on a device and on host memory (the optimizer offload's gradient, zero.c):
 *
 *   a chunk of k <= TSR_SUMSQ_CHUNK values is summed in TSR_SUMSQ_LANES lanes of double:
 *   lane t adds its values t, t + LANES, t + 2 LANES, ... in that order from 0 (the square
 *   of a float is exact in double, so a fused multiply-add gives the same bits); then the
 *   lanes are combined by a fixed tree: for h = LANES/2, LANES/4, ..., 1, lane t < h
 *   adds lane t + h; the chunk's sum is lane 0.
 *   a range of n values is cut into chunks of TSR_SUMSQ_CHUNK from its start (the last
 *   one shorter); their sums, in order, form a range of doubles summed again the same way
 *   (the values themselves, not squared), until one value is left: that is the range's
 *   sum (0 for an empty range).
 *   ranges are added in their order, from 0.
 *
 * Written once for C and CUDA: the constants, and the chunk's sum for the host. */
#ifndef TSR_SUMSQ_ORDER_H
#define TSR_SUMSQ_ORDER_H

#define TSR_SUMSQ_CHUNK 8192
#define TSR_SUMSQ_LANES 256

#endif
