/* nccl.cpp — NCCL's collectives for the CPU emulation (include/nccl.h), between the
 * processes of one machine.
 *
 * A communicator is a POSIX shared-memory segment named by the unique id: a header
 * (a barrier, and what each rank asked for) and one slot of CHUNK bytes per rank.  An
 * operation moves its data in chunks: every rank copies its part into its slot, all
 * meet at the barrier, every rank computes its result from the slots (reductions add
 * in rank order, so every rank gets the same bits; bf16 and fp16 are widened to fp32 and
 * each partial sum rounded to the type, as NCCL's kernels do), and all meet again.  Like
 * the rest of the emulation it runs at once, in call order; a group (ncclGroupStart/End)
 * needs no fusing because every rank issues the same operations in the same order.
 *
 * What real NCCL would refuse is refused here too: two ranks of a communicator on the
 * same device ("Duplicate GPU detected"), ranks that disagree on an operation's kind,
 * count, type or root (real NCCL hangs or corrupts; this aborts with both sides).
 * EMU_NCCL_TRACE=FILE: each communicator appends how many operations of each kind it
 * ran, and how many of them on bf16 and on fp16, when it is destroyed (tests check that
 * NCCL, not MPI, moved the data). */
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "core/dtype.h"
#include "nccl.h"

#define MAX_RANKS 64
#define CHUNK (1u << 20)

struct op_rec { int kind, type, op, root; size_t count; };
struct header {
  std::atomic<int> arrived, phase;
  int device[MAX_RANKS];
  op_rec rec[MAX_RANKS];
};
struct emu_nccl_comm {
  int n, rank;
  char name[NCCL_UNIQUE_ID_BYTES];
  header *h;
  char *slots;
  size_t bytes;
  long ops[6]; /* per kind of operation (agree's kind), for EMU_NCCL_TRACE */
  long ops16[2]; /* operations on bf16, on fp16 */
};

static char last_error[256];

static void barrier(emu_nccl_comm *c) {
  const int ph = c->h->phase.load();
  if (c->h->arrived.fetch_add(1) == c->n - 1) {
    c->h->arrived.store(0);
    c->h->phase.fetch_add(1);
    return;
  }
  const time_t start = time(NULL);
  for (unsigned spin = 0; c->h->phase.load() == ph; spin++) {
    if (spin < 64) {
      sched_yield();
      continue;
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
    if (time(NULL) - start > 600) {
      fprintf(stderr, "emu nccl %s: rank %d waited 600 s for the others: abort\n", c->name,
              c->rank);
      abort();
    }
  }
}

static char *slot(emu_nccl_comm *c, int r) { return c->slots + (size_t)r * CHUNK; }

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

/* Every rank states what it runs; all must agree (root and op where they matter). */
static void agree(emu_nccl_comm *c, int kind, ncclDataType_t type, int op, int root,
                  size_t count) {
  c->ops[kind]++;
  if (type == ncclBfloat16 || type == ncclFloat16) c->ops16[type == ncclFloat16]++;
  c->h->rec[c->rank] = op_rec{kind, (int)type, op, root, count};
  barrier(c);
  const op_rec &a = c->h->rec[0], &b = c->h->rec[c->rank];
  if (memcmp(&a, &b, sizeof a) != 0) {
    fprintf(stderr,
            "emu nccl %s: rank 0 runs op %d (type %d, red %d, root %d, count %zu) but rank %d "
            "runs op %d (type %d, red %d, root %d, count %zu)\n",
            c->name, a.kind, a.type, a.op, a.root, a.count, c->rank, b.kind, b.type, b.op,
            b.root, b.count);
    abort();
  }
  barrier(c);
}

template <class T>
static void reduce_t(T *out, emu_nccl_comm *c, size_t first, size_t len, int op) {
  for (size_t i = 0; i < len; i++) {
    T acc = ((const T *)slot(c, 0))[first + i];
    for (int r = 1; r < c->n; r++) {
      const T v = ((const T *)slot(c, r))[first + i];
      acc = op == ncclMax ? (v > acc ? v : acc) : op == ncclMin ? (v < acc ? v : acc) : acc + v;
    }
    out[i] = acc;
  }
}

/* 16-bit elements: each combining step works on fp32 values and rounds its result to the
 * type (a max or min of two stored values is one of them: exact). */
static void reduce_16(void *out, emu_nccl_comm *c, tsr_dtype t, size_t first, size_t len,
                      int op) {
  for (size_t i = 0; i < len; i++) {
    float acc = tsr_load(t, slot(c, 0), first + i);
    for (int r = 1; r < c->n; r++) {
      const float v = tsr_load(t, slot(c, r), first + i);
      acc = op == ncclMax ? (v > acc ? v : acc)
            : op == ncclMin ? (v < acc ? v : acc)
                            : tsr_round_to(t, acc + v);
    }
    tsr_store(t, out, i, acc);
  }
}

/* out[0..len) = the reduction over ranks of slot elements [first, first+len); the type
 * is one that check() admits for reductions. */
static void reduce_slots(void *out, emu_nccl_comm *c, ncclDataType_t t, size_t first, size_t len,
                         int op) {
  switch (t) {
    case ncclBfloat16: reduce_16(out, c, TSR_BF16, first, len, op); return;
    case ncclFloat16: reduce_16(out, c, TSR_F16, first, len, op); return;
    case ncclFloat32: reduce_t((float *)out, c, first, len, op); return;
    case ncclFloat64: reduce_t((double *)out, c, first, len, op); return;
    case ncclInt32: reduce_t((int32_t *)out, c, first, len, op); return;
    default: reduce_t((int64_t *)out, c, first, len, op); return;
  }
}

/* Arguments every rank can refuse on its own, before any of them waits for the others:
 * reductions take 32/64-bit types, bf16 and fp16 and sum, max or min; copies also bytes. */
static ncclResult_t check(emu_nccl_comm *c, ncclDataType_t t, int op, bool reduces) {
  if (!c || !c->h) return ncclInvalidArgument;
  if (op != ncclSum && op != ncclMax && op != ncclMin) return ncclInvalidArgument;
  const bool arith = t == ncclFloat32 || t == ncclFloat64 || t == ncclInt32 || t == ncclInt64 ||
                     t == ncclBfloat16 || t == ncclFloat16;
  if (!arith && (reduces || (t != ncclUint8 && t != ncclInt8))) return ncclInvalidArgument;
  return ncclSuccess;
}

/* count elements of es bytes in chunks of the slot size: each chunk, the ranks that
 * deposit copy their part of src into their slot, all meet, take(i0, len) reads the
 * slots, and all meet again before the slots are reused. */
template <class F>
static void chunked(emu_nccl_comm *c, const void *src, size_t count, size_t es, bool deposit,
                    F take) {
  const size_t per = CHUNK / es;
  emu_device_enter(); /* src and the results are device memory */
  for (size_t i0 = 0; i0 < count; i0 += per) {
    const size_t len = count - i0 < per ? count - i0 : per;
    if (deposit) memcpy(slot(c, c->rank), (const char *)src + i0 * es, len * es);
    barrier(c);
    take(i0, len);
    barrier(c);
  }
  emu_device_leave();
}

extern "C" {

ncclResult_t ncclGetVersion(int *v) { *v = NCCL_MAJOR * 10000 + NCCL_MINOR * 100; return ncclSuccess; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static int counter;
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "/tsr-emu-nccl-%d-%d-%ld", (int)getpid(),
           counter++, (long)time(NULL));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int n, ncclUniqueId id, int rank) {
  *out = NULL;
  if (n < 1 || n > MAX_RANKS || rank < 0 || rank >= n) return ncclInvalidArgument;
  emu_nccl_comm *c = new emu_nccl_comm();
  c->n = n;
  c->rank = rank;
  snprintf(c->name, sizeof c->name, "%s", id.internal);
  c->bytes = sizeof(header) + 4096 + (size_t)n * CHUNK;
  const int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)c->bytes) != 0) {
    snprintf(last_error, sizeof last_error, "shm_open/ftruncate %s: %s", c->name, strerror(errno));
    if (fd >= 0) close(fd);
    delete c;
    return ncclSystemError;
  }
  void *p = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    snprintf(last_error, sizeof last_error, "mmap %s: %s", c->name, strerror(errno));
    delete c;
    return ncclSystemError;
  }
  c->h = (header *)p;
  c->slots = (char *)p + ((sizeof(header) + 4095) / 4096) * 4096;
  int dev = 0;
  cudaGetDevice(&dev);
  c->h->device[rank] = dev; /* one emulated process = one device (EMU_DEVICES) */
  barrier(c); /* all have mapped it: the name can go */
  if (rank == 0) shm_unlink(c->name);
  for (int r = 0; r < n; r++) /* every rank reaches the same verdict */
    for (int q = r + 1; q < n; q++)
      if (c->h->device[r] == c->h->device[q]) {
        snprintf(last_error, sizeof last_error,
                 "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", r, q,
                 c->h->device[r]);
        barrier(c);
        munmap(p, c->bytes);
        delete c;
        return ncclInvalidUsage;
      }
  barrier(c);
  *out = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  const char *trace = getenv("EMU_NCCL_TRACE"); /* a file: one line per communicator */
  FILE *f = trace && *trace ? fopen(trace, "a") : NULL;
  if (f) {
    fprintf(f, "rank %d of %d: all_reduce %ld reduce_scatter %ld all_gather %ld broadcast %ld "
            "reduce %ld bf16 %ld fp16 %ld\n", c->rank, c->n, c->ops[1], c->ops[2], c->ops[3],
            c->ops[4], c->ops[5], c->ops16[0], c->ops16[1]);
    fclose(f);
  }
  munmap(c->h, c->bytes);
  delete c;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "emulated NCCL error";
  }
}
const char *ncclGetLastError(ncclComm_t) { return last_error; }
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
  ncclResult_t rc = check(c, t, op, true);
  if (rc) return rc;
  agree(c, 1, t, op, -1, count);
  const size_t es = type_size(t);
  chunked(c, send, count, es, true, [&](size_t i0, size_t len) {
    reduce_slots((char *)recv + i0 * es, c, t, 0, len, op);
  });
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t rc_count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
  ncclResult_t rc = check(c, t, op, true);
  if (rc) return rc;
  agree(c, 2, t, op, -1, rc_count);
  const size_t es = type_size(t), mine0 = (size_t)c->rank * rc_count, mine1 = mine0 + rc_count;
  chunked(c, send, rc_count * c->n, es, true, [&](size_t i0, size_t len) {
    const size_t a = i0 > mine0 ? i0 : mine0, b = i0 + len < mine1 ? i0 + len : mine1;
    if (a < b) reduce_slots((char *)recv + (a - mine0) * es, c, t, a - i0, b - a, op);
  });
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sc, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t) {
  ncclResult_t rc = check(c, t, ncclSum, false);
  if (rc) return rc;
  agree(c, 3, t, 0, -1, sc);
  const size_t es = type_size(t);
  chunked(c, send, sc, es, true, [&](size_t i0, size_t len) {
    for (int r = 0; r < c->n; r++)
      memcpy((char *)recv + ((size_t)r * sc + i0) * es, slot(c, r), len * es);
  });
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t,
                           int root, ncclComm_t c, cudaStream_t) {
  ncclResult_t rc = check(c, t, ncclSum, false);
  if (rc) return rc;
  if (root < 0 || root >= c->n) return ncclInvalidArgument;
  agree(c, 4, t, 0, root, count);
  const size_t es = type_size(t);
  chunked(c, send, count, es, c->rank == root, [&](size_t i0, size_t len) {
    memmove((char *)recv + i0 * es, slot(c, root), len * es);
  });
  return ncclSuccess;
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t) {
  ncclResult_t rc = check(c, t, op, true);
  if (rc) return rc;
  if (root < 0 || root >= c->n) return ncclInvalidArgument;
  agree(c, 5, t, op, root, count);
  const size_t es = type_size(t);
  chunked(c, send, count, es, true, [&](size_t i0, size_t len) {
    if (c->rank == root) reduce_slots((char *)recv + i0 * es, c, t, 0, len, op);
  });
  return ncclSuccess;
}

} /* extern "C" */
