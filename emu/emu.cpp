/* emu.cpp — runs CUDA kernels on the CPU for tests/cuda/emulate.sh.
 *
 * Each CUDA thread of a block is a fiber on one OS thread; the blocks of a
 * grid run one after another.  A fiber runs until it reaches __syncthreads (block
 * barrier), a warp shuffle (warp barrier) or its end; a barrier opens when every live
 * thread of the block (warp) waits at it.  Threads that wait at different barriers, a
 * __syncthreads after some threads have exited, or a shuffle in a partial warp abort
 * with a message.  Dynamic shared memory starts as NaN, device memory as 0xA5 bytes.
 * The cuBLASLt subset is naive double-precision loops.  Kernels run in the host's address
 * space, on device memory that host code cannot touch outside device work (the guard
 * below), so this checks indexing, tiling, masking, reductions, barriers and that the
 * host reaches device memory only through copies; not speed or races between blocks. */
#include <ucontext.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <map>
#include <cstdint>
#include <cmath>
#include <mutex>
#include <csignal>
#include <execinfo.h>
#include <sys/mman.h>
#include <unistd.h>
#include "cuda_runtime.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cublasLt.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;
float *emu_dyn_smem;

/* The switch between the scheduler and a fiber.  On x86-64 the callee-saved registers
 * are pushed, the stack pointers swapped and the registers popped: swapcontext also saves
 * the FPU environment and makes a sigprocmask system call on every switch, which took
 * most of the emulation's time (the fibers never change the signal mask or the FPU
 * control words).  Elsewhere ucontext. */
#if defined(__x86_64__)
extern "C" void emu_fiber_switch(void **save_sp, void *load_sp);
asm(".text\n.globl emu_fiber_switch\n.hidden emu_fiber_switch\n"
    ".type emu_fiber_switch,@function\nemu_fiber_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size emu_fiber_switch, .-emu_fiber_switch\n");
struct Ctx { void *sp; };
static void ctx_switch(Ctx *from, Ctx *to) { emu_fiber_switch(&from->sp, to->sp); }
/* a stack whose first switch "returns" into fn, aligned as after a call; fn never returns */
static void ctx_start(Ctx *c, char *stack, size_t size, void (*fn)()) {
  void **top = (void **)((uintptr_t)(stack + size) & ~(uintptr_t)15);
  *--top = NULL;          /* fn's return address */
  *--top = (void *)fn;    /* popped by the switch's ret */
  for (int i = 0; i < 6; i++) *--top = NULL; /* rbp, rbx, r12-r15 */
  c->sp = top;
}
#else
struct Ctx { ucontext_t uc; };
static void ctx_switch(Ctx *from, Ctx *to) { swapcontext(&from->uc, &to->uc); }
static void ctx_start(Ctx *c, char *stack, size_t size, void (*fn)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = NULL;
  makecontext(&c->uc, fn, 0);
}
#endif

enum State { RUN, WAIT_BLOCK, WAIT_WARP, DONE };
struct Fiber { Ctx ctx; State st; char *stack; };
static std::vector<Fiber> fibers;
static Ctx sched_ctx;
static int cur;
static std::function<void()> *g_body;
static std::vector<char> xbuf; /* warp exchange: 16 bytes per thread */
static std::vector<char> gbuf; /* warp gather: 32 bytes per thread */
#define STACK (256 * 1024)

static void fiber_main() {
  (*g_body)();
  fibers[cur].st = DONE;
  ctx_switch(&fibers[cur].ctx, &sched_ctx);
}
static void yield_as(State s) {
  fibers[cur].st = s;
  ctx_switch(&fibers[cur].ctx, &sched_ctx);
}
void emu_syncthreads() { yield_as(WAIT_BLOCK); }
void emu_warp_exchange(const void *v, void *out, int partner, size_t size) {
  memcpy(&xbuf[(size_t)cur * 16], v, size);
  yield_as(WAIT_WARP);                      /* every lane has written */
  memcpy(out, &xbuf[(size_t)partner * 16], size);
  yield_as(WAIT_WARP);                      /* every lane has read */
}

void emu_warp_gather(const void *v, void *all, size_t size) {
  if (size > 32) { fprintf(stderr, "emu: warp gather of %zu bytes per lane (32 at most)\n", size); abort(); }
  memcpy(&gbuf[(size_t)cur * 32], v, size);
  yield_as(WAIT_WARP);                      /* every lane has written */
  const int w0 = cur / 32 * 32;
  for (int l = 0; l < 32; l++) memcpy((char *)all + (size_t)l * size, &gbuf[(size_t)(w0 + l) * 32], size);
  yield_as(WAIT_WARP);                      /* every lane has read */
}

void emu_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> body) {
  const int nt = block.x * block.y * block.z;
  if (nt > 1024 || nt <= 0) { fprintf(stderr, "emu: bad block size %d\n", nt); abort(); }
  if (block.x % 32 && nt > 32) { fprintf(stderr, "emu: block.x %u not a multiple of 32\n", block.x); }
  blockDim = block; gridDim = grid;
  std::vector<float> dyn(smem / 4 + 1);
  for (size_t i = 0; i < dyn.size(); i++) dyn[i] = NAN; /* uninitialised shared memory */
  emu_dyn_smem = dyn.data();
  if (fibers.size() < (size_t)nt) {
    size_t old = fibers.size();
    fibers.resize(nt);
    for (size_t i = old; i < (size_t)nt; i++) fibers[i].stack = (char *)malloc(STACK);
  }
  xbuf.assign((size_t)nt * 16, 0);
  gbuf.assign((size_t)nt * 32, 0);
  g_body = &body;
  emu_device_enter();
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        blockIdx = dim3(bx, by, bz);
        for (int t = 0; t < nt; t++) {
          ctx_start(&fibers[t].ctx, fibers[t].stack, STACK, fiber_main);
          fibers[t].st = RUN;
        }
        for (;;) {
          for (int t = 0; t < nt; t++) {
            if (fibers[t].st != RUN) continue;
            cur = t;
            threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            ctx_switch(&sched_ctx, &fibers[t].ctx);
          }
          int done = 0, wb = 0, runnable = 0;
          for (int t = 0; t < nt; t++) done += fibers[t].st == DONE, wb += fibers[t].st == WAIT_BLOCK;
          if (done == nt) break;
          /* warps: all live lanes at the warp barrier -> release them */
          for (int w = 0; w * 32 < nt; w++) {
            int live = 0, at = 0;
            for (int t = w * 32; t < nt && t < w * 32 + 32; t++)
              live += fibers[t].st != DONE, at += fibers[t].st == WAIT_WARP;
            if (live > 0 && at == live) {
              for (int t = w * 32; t < nt && t < w * 32 + 32; t++) if (fibers[t].st == WAIT_WARP) fibers[t].st = RUN, runnable++;
              if (live != 32) { fprintf(stderr, "emu: warp shuffle with %d of 32 lanes live\n", live); abort(); }
            }
          }
          if (!runnable && wb == nt - done) {
            for (int t = 0; t < nt; t++) if (fibers[t].st == WAIT_BLOCK) fibers[t].st = RUN, runnable++;
            if (done) { fprintf(stderr, "emu: __syncthreads with %d of %d threads exited\n", done, nt); abort(); }
          }
          if (!runnable) { fprintf(stderr, "emu: deadlock (threads at different barriers) in block %u,%u\n", bx, by); abort(); }
        }
      }
  emu_device_leave();
  emu_dyn_smem = NULL;
}

/* ---- runtime ---- */
extern "C" {
static int emu_devices() { const char *s = getenv("EMU_DEVICES"); return s ? atoi(s) : 1; }
cudaError_t cudaGetDeviceCount(int *n) {
  *n = emu_devices();
  if (*n > 0) return 0;
  *n = 0;
  return 35; /* cudaErrorInsufficientDriver, as on a machine without a GPU */
}
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int dev) { snprintf(bus, len, "0000:%02x:00.0", dev + 1); return dev < emu_devices() ? 0 : 101; }
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int dev) { *pool = (cudaMemPool_t)0; return dev < emu_devices() ? 0 : 101; }
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, enum cudaMemPoolAttr, void *) { return 0; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int) { strcpy(p->name, "CPU emulation"); p->major = 9; p->minor = 0; p->multiProcessorCount = 1; return 0; }
static int emu_current;
static std::map<uintptr_t, std::pair<size_t, int> > emu_allocs; /* base -> (bytes, 0 device / 1 managed / 2 pinned host) */
static std::mutex dev_mu; /* emu_allocs and the device range below */
cudaError_t cudaSetDevice(int dev) { if (dev < 0 || dev >= emu_devices()) return 101; emu_current = dev; return 0; }
cudaError_t cudaGetDevice(int *dev) { *dev = emu_current; return 0; }
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev) {
  const char *e = getenv("EMU_SMEM_OPTIN");
  if (attr == cudaDevAttrComputeCapabilityMajor) *value = 9; /* as cudaGetDeviceProperties says */
  else *value = e && *e ? atoi(e) : 232448;
  return dev >= 0 && dev < emu_devices() ? 0 : 101;
}
struct emu_stream { int magic; };
struct emu_event { int magic, recorded; };
cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = new emu_stream{0x5e}; return 0; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) { if (!s || s->magic != 0x5e) return 400; s->magic = 0; delete s; return 0; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return s && s->magic != 0x5e ? 400 : 0; }
cudaError_t cudaDeviceSynchronize(void) { return 0; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) { *e = new emu_event{0xe7, 0}; return 0; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { if (!e || e->magic != 0xe7) return 400; e->magic = 0; delete e; return 0; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { if (!e || e->magic != 0xe7 || (s && s->magic != 0x5e)) return 400; e->recorded = 1; return 0; }
cudaError_t cudaEventQuery(cudaEvent_t e) { return !e || e->magic != 0xe7 ? 400 : 0; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaEventQuery(e); }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (!e || e->magic != 0xe7 || (s && s->magic != 0x5e)) return 400;
  if (!e->recorded) { fprintf(stderr, "emu: cudaStreamWaitEvent on an event never recorded\n"); return 400; }
  return 0;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  memset(a, 0, sizeof *a);
  std::lock_guard<std::mutex> lk(dev_mu);
  auto it = emu_allocs.upper_bound((uintptr_t)p);
  if (it != emu_allocs.begin()) {
    --it;
    if ((uintptr_t)p < it->first + it->second.first) {
      const int k = it->second.second;
      a->type = k == 2 ? cudaMemoryTypeHost : k == 1 ? cudaMemoryTypeManaged : cudaMemoryTypeDevice;
      a->device = emu_current;
      a->devicePointer = (void *)p;
    }
  }
  return 0;
}

/* ---- device memory ----
 * cudaMalloc's memory is carved, first fit in whole pages, from one address range
 * reserved at the first allocation.  With the guard on (EMU_DEVICE_GUARD, default 1) the
 * range is inaccessible (PROT_NONE) except while device work runs: a kernel launch, a
 * copy or fill, a cuBLASLt product, a radix sort, an NCCL operation, the cuDNN stand-in
 * (emu_device_enter / emu_device_leave).  Host code that reads or writes device memory
 * anywhere else faults, and the handler names the address, the allocation and the host
 * stack, then aborts: what a GPU build does with a host pointer into cudaMalloc memory
 * (crash), where managed memory would have migrated the page in silence.
 * EMU_DEVICE_MEM: the device's memory in bytes (default 16 GiB); cudaMalloc beyond what
 * is free fails with cudaErrorMemoryAllocation and cudaMemGetInfo reports it. */
static char *dev_base;
static size_t dev_span, dev_top, dev_used; /* the range; its part ever handed out; in use */
static std::map<size_t, size_t> dev_holes; /* offset -> bytes, free pages below dev_top */
static int dev_open, dev_guard;
static struct sigaction dev_old_segv;
static const size_t DEV_PAGE = 4096;

static void dev_protect_locked() {
  if (dev_guard && dev_top)
    mprotect(dev_base, dev_top, dev_open ? PROT_READ | PROT_WRITE : PROT_NONE);
}
void emu_device_enter(void) {
  std::lock_guard<std::mutex> lk(dev_mu);
  if (dev_open++ == 0) dev_protect_locked();
}
void emu_device_leave(void) {
  std::lock_guard<std::mutex> lk(dev_mu);
  if (--dev_open == 0) dev_protect_locked();
}

static void dev_on_segv(int sig, siginfo_t *si, void *ctx) {
  const char *a = (const char *)si->si_addr;
  if (dev_base && a >= dev_base && a < dev_base + dev_span) {
    char msg[512];
    size_t base = 0, bytes = 0;
    /* no lock: the faulting thread may hold it; the table is read to name the allocation */
    auto it = emu_allocs.upper_bound((uintptr_t)a);
    if (it != emu_allocs.begin()) --it, base = it->first, bytes = it->second.first;
    const size_t off = base && (uintptr_t)a >= base ? (size_t)((uintptr_t)a - base) : 0;
    char where[96];
    if (base && off < bytes)
      snprintf(where, sizeof where, "byte %zu of a cudaMalloc allocation of %zu bytes", off, bytes);
    else
      snprintf(where, sizeof where, "in no allocation: out of bounds");
    int n = dev_open > 0 /* device work was running: a kernel or library call went astray */
                ? snprintf(msg, sizeof msg, "emu: device memory at %p (%s) is not mapped: a kernel "
                           "or library call read or wrote out of bounds.  Host stack:\n",
                           (const void *)a, where)
                : snprintf(msg, sizeof msg,
                           "emu: host code touched device memory at %p (%s) outside any kernel, "
                           "copy or library call: on a GPU this is a crash; copy it through the "
                           "backend's copy op instead.  Host stack:\n",
                           (const void *)a, where);
    if (write(2, msg, (size_t)n) < 0) _exit(86);
    void *bt[48];
    backtrace_symbols_fd(bt, backtrace(bt, 48), 2);
    signal(SIGABRT, SIG_DFL);
    abort();
  }
  /* not ours: the handler there was before (or the default) takes the fault again */
  sigaction(SIGSEGV, &dev_old_segv, NULL);
  (void)sig, (void)ctx;
}

static size_t dev_total(void) {
  const char *e = getenv("EMU_DEVICE_MEM");
  return e && *e ? (size_t)strtoull(e, NULL, 0) : (size_t)16 << 30;
}
static int dev_init_locked(void) {
  if (dev_base) return 0;
  const char *g = getenv("EMU_DEVICE_GUARD");
  dev_guard = !g || !*g || atoi(g) != 0;
  dev_span = (dev_total() + DEV_PAGE - 1) / DEV_PAGE * DEV_PAGE;
  void *r = mmap(NULL, dev_span ? dev_span : DEV_PAGE, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) { fprintf(stderr, "emu: cannot reserve %zu bytes of address space for device memory\n", dev_span); return 1; }
  dev_base = (char *)r;
  madvise(r, dev_span ? dev_span : DEV_PAGE, MADV_HUGEPAGE);
  if (dev_guard) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = dev_on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &dev_old_segv);
  }
  return 0;
}

cudaError_t cudaMalloc(void **p, size_t b) {
  *p = NULL;
  const size_t want = ((b ? b : 1) + DEV_PAGE - 1) / DEV_PAGE * DEV_PAGE;
  {
    std::lock_guard<std::mutex> lk(dev_mu);
    if (dev_init_locked()) return 2;
    size_t at = SIZE_MAX;
    for (auto it = dev_holes.begin(); it != dev_holes.end(); ++it)
      if (it->second >= want) {
        at = it->first;
        if (it->second > want) dev_holes[at + want] = it->second - want;
        dev_holes.erase(it);
        break;
      }
    if (at == SIZE_MAX) {
      if (want > dev_span - dev_top) return 2; /* cudaErrorMemoryAllocation */
      at = dev_top;
      dev_top += want;
      if (dev_guard && !dev_open) mprotect(dev_base + at, want, PROT_NONE);
      else mprotect(dev_base + at, want, PROT_READ | PROT_WRITE);
    }
    dev_used += want;
    *p = dev_base + at;
    emu_allocs[(uintptr_t)*p] = std::make_pair(want, 0);
  }
  emu_device_enter();
  memset(*p, 0xA5, want); /* what a fresh allocation holds: not zeros */
  emu_device_leave();
  return 0;
}
cudaError_t cudaFree(void *p) {
  if (!p) return 0;
  std::lock_guard<std::mutex> lk(dev_mu);
  auto it = emu_allocs.find((uintptr_t)p);
  if (it != emu_allocs.end() && it->second.second == 1) { emu_allocs.erase(it); free(p); return 0; } /* managed */
  if (it == emu_allocs.end() || it->second.second != 0) { fprintf(stderr, "emu: cudaFree of %p, which cudaMalloc did not give\n", p); return 1; }
  const size_t at = (size_t)((char *)p - dev_base), bytes = it->second.first;
  emu_allocs.erase(it);
  madvise(dev_base + at, bytes, MADV_DONTNEED);
  dev_used -= bytes;
  auto h = dev_holes.emplace(at, bytes).first; /* merged with the holes beside it */
  auto nx = std::next(h);
  if (nx != dev_holes.end() && h->first + h->second == nx->first) h->second += nx->second, dev_holes.erase(nx);
  if (h != dev_holes.begin()) {
    auto pv = std::prev(h);
    if (pv->first + pv->second == h->first) pv->second += h->second, dev_holes.erase(h);
  }
  return 0;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  std::lock_guard<std::mutex> lk(dev_mu);
  if (dev_init_locked()) return 2;
  *free_bytes = dev_span - dev_used;
  *total_bytes = dev_span;
  return 0;
}
cudaError_t cudaMallocAsync(void **p, size_t b, cudaStream_t) { return cudaMalloc(p, b); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t) { return cudaFree(p); }
cudaError_t cudaMemcpy(void *d, const void *s, size_t b, enum cudaMemcpyKind) {
  emu_device_enter();
  memmove(d, s, b);
  emu_device_leave();
  return 0;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t b, enum cudaMemcpyKind k, cudaStream_t) { return cudaMemcpy(d, s, b, k); }
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                              enum cudaMemcpyKind, cudaStream_t) {
  emu_device_enter();
  for (size_t r = 0; r < h; r++) memmove((char *)d + r * dp, (const char *)s + r * sp, w);
  emu_device_leave();
  return 0;
}
cudaError_t cudaMemset(void *p, int v, size_t b) {
  emu_device_enter();
  memset(p, v, b);
  emu_device_leave();
  return 0;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t b, cudaStream_t) { return cudaMemset(p, v, b); }
cudaError_t cudaGetLastError(void) { return 0; }
/* managed memory (tests/mpi/test_comm.c only): host memory the host may touch at any time */
cudaError_t cudaMallocManaged(void **p, size_t b, unsigned int) {
  *p = malloc(b ? b : 1);
  if (!*p) return 2;
  memset(*p, 0xA5, b);
  std::lock_guard<std::mutex> lk(dev_mu);
  emu_allocs[(uintptr_t)*p] = std::make_pair(b ? b : 1, 1);
  return 0;
}
/* page-locked host memory: host memory, tracked so that cudaPointerGetAttributes knows it */
cudaError_t cudaMallocHost(void **p, size_t b) {
  *p = malloc(b ? b : 1);
  if (!*p) return 2;
  memset(*p, 0xA5, b);
  std::lock_guard<std::mutex> lk(dev_mu);
  emu_allocs[(uintptr_t)*p] = std::make_pair(b ? b : 1, 2);
  return 0;
}
cudaError_t cudaFreeHost(void *p) {
  std::lock_guard<std::mutex> lk(dev_mu);
  auto it = emu_allocs.find((uintptr_t)p);
  if (!p || it == emu_allocs.end() || it->second.second != 2) { fprintf(stderr, "emu: cudaFreeHost of memory cudaMallocHost did not give\n"); return 1; }
  emu_allocs.erase(it);
  free(p);
  return 0;
}
const char *cudaGetErrorString(cudaError_t e) { return e == 2 ? "out of memory" : "emu error"; }
const char *cudaGetErrorName(cudaError_t) { return "emuError"; }
}

/* ---- cuBLASLt ---- */
struct emu_desc { int compute = CUBLAS_COMPUTE_32F, ta = 0, tb = 0, epi = CUBLASLT_EPILOGUE_DEFAULT; const void *bias = 0; void *aux = 0; int64_t aux_ld = 0; int bias_type = -1, aux_type = -1; };
struct emu_layout { int type; uint64_t rows, cols; int64_t ld; };
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = (cublasLtHandle_t)malloc(1); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c, cudaDataType_t) { *d = new emu_desc; (*d)->compute = c; return CUBLAS_STATUS_SUCCESS; }
/* the FAST_16BF / _16F compute types: inputs rounded to 16 bits (bf16: round to nearest
 * even; fp16: the compiler's _Float16), as tensor cores see them; products summed in double */
static double fast_input(double v, int compute) {
  if (compute == CUBLAS_COMPUTE_32F_FAST_16F) return (double)(_Float16)(float)v;
  if (compute != CUBLAS_COMPUTE_32F_FAST_16BF) return v;
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t n) {
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: d->ta = *(const int *)v; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: d->tb = *(const int *)v; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: d->epi = *(const int *)v; break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: d->bias = *(const void *const *)v; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: d->aux = *(void *const *)v; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: d->aux_ld = *(const int64_t *)v; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: d->aux_type = *(const int32_t *)v; break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: d->bias_type = *(const int32_t *)v; break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
  }
  (void)n;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t r, uint64_t c, int64_t ld) {
  if (ld < (int64_t)r) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new emu_layout{(int)t, r, c, ld}; return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) { *p = (cublasLtMatmulPreference_t)malloc(1); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { free(p); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *, size_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *res, int *count) {
  if (d->aux && d->aux_ld % 8) return CUBLAS_STATUS_INVALID_VALUE;
  if (d->aux && d->aux_ld < (int64_t)c->rows) return CUBLAS_STATUS_INVALID_VALUE;
  memset(res, 0, sizeof *res); *count = 1; return CUBLAS_STATUS_SUCCESS;
}
static double ld_elem(const void *p, int type, size_t i) {
  if (type == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  if (type == CUDA_R_16F) return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}
/* the result rounded once to the output's type (through fp32, as cuBLASLt's epilogue) */
static void st_elem(void *p, int type, size_t i, double v) {
  if (type == CUDA_R_16BF) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v);
  else if (type == CUDA_R_16F) ((__half *)p)[i] = __float2half_rn((float)v);
  else ((float *)p)[i] = (float)v;
}
static double gelu(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_grad(double x) {
  const double th = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * x * x);
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t ad, const void *B, cublasLtMatrixLayout_t bd, const void *beta, const void *C, cublasLtMatrixLayout_t cd, void *D, cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t) {
  struct open_device { open_device() { emu_device_enter(); } ~open_device() { emu_device_leave(); } } open_;
  const uint64_t m = cd->rows, n = cd->cols;
  const uint64_t k = d->ta ? ad->rows : ad->cols;
  if ((d->ta ? ad->cols : ad->rows) != m || (d->tb ? bd->rows : bd->cols) != n || (d->tb ? bd->cols : bd->rows) != k) {
    fprintf(stderr, "emu cublasLt: shape mismatch m=%lu n=%lu k=%lu A %lux%lu B %lux%lu\n", m, n, k, ad->rows, ad->cols, bd->rows, bd->cols);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const float a = *(const float *)alpha, b = *(const float *)beta;
  const bool has_bias = d->epi == CUBLASLT_EPILOGUE_BIAS || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || d->epi == CUBLASLT_EPILOGUE_GELU_BIAS;
  const bool is_gelu = d->epi == CUBLASLT_EPILOGUE_GELU_AUX || d->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || d->epi == CUBLASLT_EPILOGUE_GELU || d->epi == CUBLASLT_EPILOGUE_GELU_BIAS;
  if (has_bias && (!d->bias || d->bias_type != cd->type)) { fprintf(stderr, "emu cublasLt: bias\n"); return CUBLAS_STATUS_INVALID_VALUE; }
  std::vector<double> out(m * n);
  /* the operands read and rounded once, row i of op(A) and column j of op(B) each
   * contiguous in p; the sums below take the same products in the same order */
  std::vector<double> av(m * k), bv(n * k);
  for (uint64_t i = 0; i < m; i++)
    for (uint64_t p = 0; p < k; p++)
      av[i * k + p] = fast_input(ld_elem(A, ad->type, d->ta ? p + i * ad->ld : i + p * ad->ld), d->compute);
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t p = 0; p < k; p++)
      bv[j * k + p] = fast_input(ld_elem(B, bd->type, d->tb ? j + p * bd->ld : p + j * bd->ld), d->compute);
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t i = 0; i < m; i++) {
      double s = 0;
      const double *ar = av.data() + i * k, *bc = bv.data() + j * k;
      for (uint64_t p = 0; p < k; p++) s += ar[p] * bc[p];
      double v = a * s + (b != 0 ? b * ld_elem(C, cd->type, i + j * cd->ld) : 0.0);
      if (has_bias) v += ld_elem(d->bias, d->bias_type, i);
      out[i + j * m] = v;
    }
  const bool is_dgelu = d->epi == CUBLASLT_EPILOGUE_DGELU;
  if (is_dgelu && !d->aux) { fprintf(stderr, "emu cublasLt: DGELU without its aux input\n"); return CUBLAS_STATUS_INVALID_VALUE; }
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t i = 0; i < m; i++) {
      double v = out[i + j * m];
      if (is_dgelu) v *= gelu_grad(ld_elem(d->aux, d->aux_type < 0 ? dd->type : d->aux_type, i + j * d->aux_ld));
      if (is_gelu) {
        if (d->aux) st_elem(d->aux, d->aux_type < 0 ? dd->type : d->aux_type, i + j * d->aux_ld, v);
        v = gelu(v);
      }
      st_elem(D, dd->type, i + j * dd->ld, v);
    }
  return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t) { return "emu cublas status"; }

