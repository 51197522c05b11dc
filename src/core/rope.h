/* rope.h — RoPE's inverse frequencies, one definition for the CPU kernels and the CUDA
 * kernels (docs/model.md "RoPE").
 *
 * Without scaling, pair i of a head of head_dim elements turns at theta^(-2i/head_dim)
 * radians per position.  model.rope_scaling = 'llama3' rescales them as Llama 3.1 does,
 * by the wavelength 2 pi / f of each frequency f, with L = rope_original_context:
 *   wavelength <  L / high_freq_factor:  f                  (short waves: unchanged)
 *   wavelength >  L / low_freq_factor:   f / factor         (long waves: stretched)
 *   otherwise:                           (1 - s) f / factor + s f,
 *                                        s = (L / wavelength - low) / (high - low)
 * All in double; the angle pos * f is formed by the caller, in double too. */
#ifndef TSR_ROPE_H
#define TSR_ROPE_H

#include <math.h>

#if defined(__CUDACC__)
#define TSR_ROPE_FN static inline __host__ __device__
#else
#define TSR_ROPE_FN static inline
#endif

typedef enum { TSR_ROPE_SCALING_NONE, TSR_ROPE_SCALING_LLAMA3 } tsr_rope_scaling;

/* What an op needs to know of RoPE; passed by value (to the device as a kernel argument). */
typedef struct {
  float theta;                    /* model.rope_theta, as fp32 */
  int scaling;                    /* tsr_rope_scaling */
  double factor;                  /* model.rope_factor */
  double low_freq_factor;         /* model.rope_low_freq_factor */
  double high_freq_factor;        /* model.rope_high_freq_factor */
  double original_context;        /* model.rope_original_context */
} tsr_rope;

/* Plain RoPE of base theta (no scaling). */
TSR_ROPE_FN tsr_rope tsr_rope_plain(float theta) {
  tsr_rope r = {theta, TSR_ROPE_SCALING_NONE, 1.0, 1.0, 1.0, 1.0};
  return r;
}

/* The inverse frequency (radians per position) of pair i of a head. */
TSR_ROPE_FN double tsr_rope_inv_freq(tsr_rope r, int i, int head_dim) {
  const double f = pow((double)r.theta, -2.0 * i / head_dim);
  if (r.scaling != TSR_ROPE_SCALING_LLAMA3) return f;
  const double wavelength = 6.283185307179586 / f; /* 2 pi / f */
  if (wavelength < r.original_context / r.high_freq_factor) return f;
  if (wavelength > r.original_context / r.low_freq_factor) return f / r.factor;
  const double s = (r.original_context / wavelength - r.low_freq_factor) /
                   (r.high_freq_factor - r.low_freq_factor);
  return (1.0 - s) * f / r.factor + s * f;
}

#endif
