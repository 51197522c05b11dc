/* gemm_probe.h — the GEMM rate of this rank, the denominator of MFU where no peak is
 * stated (on the CPU; on a GPU it is the rate reached, next to the datasheet's peak). */
#ifndef TSR_GEMM_PROBE_H
#define TSR_GEMM_PROBE_H

#include "core/dtype.h"

/* FLOP/s of the best of many products y = x w^T in storage type dt on the installed
 * backend: 256 x 512 x 512 on the CPU, 4096^3 on a device (TSR_GEMM_PROBE_N=n shrinks it,
 * for emulated devices).  The probe's buffers are a transient outside the run's counted
 * memory (tsr_ops_mem_reset_peak afterwards). */
double tsr_gemm_probe_rate(tsr_dtype dt);

#endif
