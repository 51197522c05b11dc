/* cuda_runtime.h (CPU emulation, tests/cuda/emulate.sh): the runtime API plus the
 * device-side emulation for the .cu files. */
#include "cuda_runtime_api.h"
#include "emu_kernel.h"
