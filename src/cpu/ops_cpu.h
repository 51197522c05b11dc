/* ops_cpu.h — the CPU kernels of ops_list.h: tsr_cpu_<name> has the arguments and the
 * semantics of tsr_ops_<name> (ops_list.h) on host memory.  They are the reference the
 * CUDA kernels are tested against, so each is deterministic: every output element (or
 * reduction) is owned by one task and summed in a fixed order; everything but the GEMMs
 * gives the same bits for every thread count.
 *
 * 16-bit storage: a kernel widens its bf16 / fp16 inputs to fp32 as it loads them
 * (block by block, into per-thread buffers reserved by tsr_cpu_reserve), computes in
 * fp32 and rounds each output once as it stores it.  fp32 storage runs the fp32 code
 * directly.  The kernels live in src/cpu/, one family per file; tsr_cpu_open installs
 * them as the host backend, which ops.c dispatches to when no device backend is installed. */
#ifndef TSR_OPS_CPU_H
#define TSR_OPS_CPU_H

#include "ops/ops.h"

#define TSR_OP(name, params, args) void tsr_cpu_##name params;
#define TSR_OP_RET(type, name, params, args) type tsr_cpu_##name params;
#include "ops/ops_list.h"
#undef TSR_OP
#undef TSR_OP_RET

/* Threads (OpenMP's pool; OpenBLAS single-threaded under it).  n_threads <= 0: default. */
void tsr_cpu_init(int n_threads);
/* Set up the CPU backend (threads: n_threads <= 0 = the default) and install its table as
 * the host backend of the ops (ops_backend.h); call once before the first op. */
void tsr_cpu_open(int n_threads);
/* The conversion buffers of 16-bit storage for shapes up to *s (allocated once through
 * tsr_calloc, so the run's memory counts them; grown, never shrunk). */
int tsr_cpu_reserve(const tsr_ops_shapes *s);
/* Their bytes for shapes s with `threads` threads (what tessera plan counts), and the
 * threads this process runs the kernels on. */
size_t tsr_cpu_reserve_bytes(const tsr_ops_shapes *s, int threads);
int tsr_cpu_threads(void);

#endif
