/* fault.h — fault injection for the tests: one environment variable, read once.
 *
 *   TSR_FAULT="key=value,key=value,..."
 *
 * with the keys (unknown keys are refused with a message naming the known ones):
 *   nan_grad_step=N   rank 0 poisons one reduced gradient with NaN at step N (train.c)
 *   hang_step=N       one rank stops responding at step N (train.c) ...
 *   hang_rank=R       ... rank R (default 0)
 *   ckpt_sleep=S      every rank sleeps S seconds while saving a checkpoint (ckpt.c) ...
 *   ckpt_step=N       ... of step N (default: every step) ...
 *   ckpt_where=W      ... half-way through the write ('half', the default) or before
 *                     anything is checked ('start')
 *   start_sleep=S     every rank pauses S seconds during start-up, or until a stop signal
 *                     arrives (main.c, train.c) ...
 *   start_where=W     ... before MPI_Init ('mpi_init'), after the deck is read and before
 *                     the run is set up ('setup', the default), or before the resume reads
 *                     a checkpoint ('resume'); it prints its process id first
 *   ckpt_fail_step=N  the checkpoint write of step N fails half-way (ckpt.c) on ...
 *   ckpt_fail_rank=R  ... rank R (default 0), as a failing dataset write would
 *   ckpt_host_mb=M    a node has M MB of memory available for the asynchronous
 *                     checkpoint's snapshot (ckpt_async.c)
 *   ckpt_cost=S       checkpoint.every_steps = 'auto' takes S seconds as the time a
 *                     checkpoint holds training up, instead of measuring it ...
 *   ckpt_step_time=S  ... and S seconds as the step time (session_ckpt.c)
 *   ckpt_overlap_s=S  'auto' counts every step a background write overlaps S seconds
 *                     longer, as a writer sharing the training's cores would make it
 *                     (session_ckpt.c)
 *   host_read_step=N  rank 0 reads one gradient of op memory straight from the host at
 *                     step N, as a bug would (train.c): harmless on the CPU, a crash on
 *                     a GPU and in the emulation's guarded device memory
 *   offload_host_mb=M a node has M MB of memory available for the optimizer offload's
 *                     page-locked state (session.c)
 *   offload_piece=N   the offloaded update runs in pieces of N elements (a multiple of 64)
 *                     instead of TSR_ZERO_OFFLOAD_PIECE, so that small test models are
 *                     cut into several (zero.c)
 * Nothing here runs unless TSR_FAULT is set; a production run never sets it. */
#ifndef TSR_FAULT_H
#define TSR_FAULT_H

#include <stdint.h>

/* Reads and checks TSR_FAULT (once; later calls return the first answer).  0, or
 * TSR_ERR_INPUT after reporting an unknown key or a malformed list. */
int tsr_fault_init(void);
/* The value of a key as an integer (dflt when the key is absent). */
long long tsr_fault_int(const char *key, long long dflt);
/* The value of a key as text (dflt when the key is absent). */
const char *tsr_fault_str(const char *key, const char *dflt);
/* start_sleep at the start-up point `where` ('mpi_init', 'setup', 'resume'). */
void tsr_fault_start_pause(const char *where);
/* hang_step: rank `rank` at step `step` stops responding (its other threads go on). */
void tsr_fault_hang(int64_t step, int rank);
/* host_read_step: rank 0 at step `step` reads the first float of op memory `op` straight
 * from the host, as a bug would (on a device: stopped by a GPU and by the emulation). */
void tsr_fault_host_read(int64_t step, int rank, const void *op);

#endif
