/* main.c — the tessera command: train, eval, --help-deck.
 *
 *   tessera [DECK] [group.key=value ...]        train (no DECK: the embedded input/tiny.nml)
 *   tessera eval DECK [--tokenizer PATH] [group.key=value ...]
 *                                               validation loss of checkpoint.resume
 *   tessera generate DECK [--prompt TEXT ...]   text sampled from checkpoint.resume
 *   tessera plan DECK [--nodes N ...]           the planner: memory, FLOPs, traffic, time,
 *                                               whether it fits, the layout search
 *   tessera --help-deck                         every deck key
 * DECK is a file, or the name of an installed deck (`tessera llama1b`; src/cli/deckpath.h);
 * for eval and generate also a checkpoint file, read with the deck it was written with. 
 *
 * Rank 0 parses the deck and broadcasts the config bytes: no rank ever sees a different
 * configuration.  Exit codes: 0 done, 1 other failure, 2 bad input, 3 stopped on a
 * signal after a checkpoint (requeue me), 4 a stalled or dead rank ended the job (the
 * watchdog, or the heartbeat); `tessera plan --require-fit` exits 3 when the plan does
 * not fit (TSR_PLAN_NO_FIT). */
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_compat.h"
#include "core/config.h"
#include "deck/deck.h"
#include "cli/deckpath.h"
#include "core/fault.h"
#include "run/generate.h"
#include "core/heartbeat.h"
#include "ops/ops.h"
#include "cpu/ops_cpu.h"
#include "plan/plan.h"
#include "core/runctl.h"
#include "core/stop_signals.h"
#include "run/train.h"
#include "core/tsr_build.h" /* before the CUDA part: TSR_HAVE_NCCL */
#ifdef TSR_LINK_CUDA
#include "comm_stage.h" /* MPI on GPU memory through pinned host buffers */
#include "backend.h"    /* the CUDA device backend (run.device) */
#ifdef TSR_HAVE_NCCL
#include "comm_nccl.h" /* NCCL for the collectives of GPU groups */
#endif
#endif
#include "core/util.h"
#include "core/watchdog.h"

extern const char tsr_embedded_deck[];     /* input/tiny.nml, built into the binary */
extern const char tsr_embedded_deck_name[];

static void usage(FILE *out) {
  fprintf(out,
          "usage: tessera [DECK] [group.key=value ...]       train (no DECK: built-in copy of %s)\n"
          "       tessera eval DECK|CHECKPOINT [--tokenizer PATH] [group.key=value ...]\n"
          "                    validation loss of checkpoint.resume (or of CHECKPOINT)\n"
          "       tessera generate DECK|CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T]\n"
          "                    [--top-k K] [--seed S] [--ids] [--tokenizer PATH] [group.key=value ...]\n"
          "                    text from checkpoint.resume (or from CHECKPOINT)\n"
          "       tessera plan DECK [--nodes N] [--gpus-per-node G] [--hardware NAME] [--json]\n"
          "                    [--max-mem-frac F] [--require-fit] [--search [--top K]]\n"
          "                    [group.key=value ...]   plan a run, no training (plan --help)\n"
          "       tessera --help-deck                         list every deck key\n"
          "       tessera --version\n"
          "exit codes: 0 done, 1 failure, 2 bad input, 3 checkpointed on signal (requeue), "
          "4 watchdog or heartbeat\n"
          "            (a rank stalled or died);\n"
          "            tessera plan --require-fit: 3 when it does not fit\n",
          tsr_embedded_deck_name);
  tsr_deck_path_usage(out);
}

/* The device backend's opener and transports, in a build linked with one. */
static void link_device(void) {
#ifdef TSR_LINK_CUDA
  tsr_ops_cuda_open = tsr_cuda_ops_open;
  tsr_comm_staged_transport = &tsr_cuda_staged_transport;
#ifdef TSR_HAVE_NCCL
  tsr_comm_gpu_transport = &tsr_cuda_nccl_transport;
#endif
#endif
}

/* Threads per rank: the cores of this node shared among its ranks, unless the user set
 * OMP_NUM_THREADS / OPENBLAS_NUM_THREADS. */
static int threads_per_rank(void) {
  if (getenv("OMP_NUM_THREADS") || getenv("OPENBLAS_NUM_THREADS")) return 0;
  MPI_Comm node;
  int local = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int n = (int)(cores / local);
  return n < 1 ? 1 : n;
}

/* `tessera plan` under mpirun on two or more ranks: ranks 0 and 1 time a ping-pong of 8
 * bytes and of 64 KiB (the size of a small model's activations), the link a plan of this
 * host ('cpu') prices its messages with (plan_profile.h). */
static void plan_link_probe(int rank, int world) {
  if (world < 2 || rank > 1) return;
  enum { BIG = 65536 };
  char *buf = calloc(1, BIG);
  double one_way[2] = {0, 0};
  const int sizes[2] = {8, BIG}, reps[2] = {200, 50};
  for (int k = 0; k < 2 && buf; k++) {
    MPI_Request rq;
    for (int r = -5; r < reps[k]; r++) { /* 5 rounds to warm up */
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Isend(buf, sizes[k], MPI_CHAR, 1, k, MPI_COMM_WORLD, &rq);
        MPI_Wait(&rq, MPI_STATUS_IGNORE);
        MPI_Recv(buf, sizes[k], MPI_CHAR, 1, k, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buf, sizes[k], MPI_CHAR, 0, k, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Isend(buf, sizes[k], MPI_CHAR, 0, k, MPI_COMM_WORLD, &rq);
        MPI_Wait(&rq, MPI_STATUS_IGNORE);
      }
      if (r >= 0) one_way[k] += (MPI_Wtime() - t0) / 2 / reps[k];
    }
  }
  free(buf);
  if (rank == 0 && one_way[1] > one_way[0])
    tsr_plan_set_cpu_link(one_way[0], BIG / (one_way[1] - one_way[0]));
}

/* After "no deck 'WORD'" for the first argument: a word that reads as a subcommand says
 * what was meant (`tessera train DECK`, `tessera evl DECK`). */
static void subcommand_hint(const char *word) {
  if (strchr(word, '/') || strchr(word, '.')) return;
  if (!strcmp(word, "train") || !strcmp(word, "pretrain")) {
    fprintf(stderr, "note: training takes no subcommand: tessera DECK [group.key=value ...]\n");
    return;
  }
  static const char *const sub[] = {"eval", "plan", "generate"};
  for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++)
    if (tsr_deck_word_distance(word, sub[i]) <= (strlen(sub[i]) <= 4 ? 1 : 2) ||
        (strlen(word) >= 3 && !strncmp(word, sub[i], strlen(word)))) { /* gen, gener */
      fprintf(stderr, "note: did you mean the subcommand '%s'? tessera %s DECK ...\n", sub[i],
              sub[i]);
      return;
    }
}

/* Rank 0 parses; everyone gets the outcome and the config.  checkpoint_deck (eval): a
 * checkpoint file in place of the deck brings the deck it was written with. */
static int load_config(tsr_config *cfg, const char *deck, int n_over, char **over, int world,
                       int checkpoint_deck) {
  int rc = 0, rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    if (deck) {
      char path[PATH_MAX];
      rc = tsr_deck_path(deck, path, sizeof path);
      if (rc && !checkpoint_deck) subcommand_hint(deck);
      if (!rc && checkpoint_deck && tsr_ckpt_is_checkpoint(path)) /* with its deck */
        rc = tsr_ckpt_deck_load(cfg, path, n_over, over, world);
      else if (!rc)
        rc = tsr_deck_load(cfg, path, n_over, over, world);
    } else {
      char err[8192];
      rc = tsr_deck_parse(cfg, tsr_embedded_deck, strlen(tsr_embedded_deck),
                          tsr_embedded_deck_name, n_over, over, world, err, sizeof err);
      if (rc) fputs(err, stderr);
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rc) return rc;
  MPI_Bcast(cfg, (int)sizeof *cfg, MPI_BYTE, 0, MPI_COMM_WORLD);
  return 0;
}

/* The subcommand argv names: "train" unless it is one of the others. */
static const char *mode_of(int argc, char **argv) {
  static const char *const other[] = {"--help", "-h", "--version", "--help-deck", "eval", "plan",
                                      "generate"};
  for (size_t i = 0; argc > 1 && i < sizeof other / sizeof other[0]; i++)
    if (!strcmp(argv[1], other[i])) return other[i];
  return "train";
}

/* The stop signals' handlers, before any library's initialiser runs: the executable's
 * .preinit_array is called by the dynamic loader once every library is mapped and
 * relocated and before their constructors (OpenBLAS starts its threads, CUDA's and MPI's
 * libraries initialise: tens of milliseconds in which a SIGUSR1 or SIGTERM would
 * otherwise take its default action and kill the rank).  Training only, as in main.  The
 * loader's mapping itself is covered by the launcher, which blocks the signals before it
 * executes this program. */
static void early_signals(int argc, char **argv, char **envp) {
  (void)envp;
  /* the process keeps the name users know it by (ps, top, pgrep -x tessera), not the
   * name of the file the launcher executed; the threads started later inherit it */
  prctl(PR_SET_NAME, "tessera", 0, 0, 0);
  if (!strcmp(mode_of(argc, argv), "train")) tsr_run_install_signals();
  /* `tessera` (src/cli/launcher.c) ran this program with the stop signals blocked, so that
   * none could kill it while the loader mapped the libraries: one that came meanwhile is
   * delivered now, to the handler (or, for the other commands, with its default action) */
  tsr_stop_signals_mask(SIG_UNBLOCK);
}
__attribute__((section(".preinit_array"), used)) static void (*const tsr_preinit)(
    int, char **, char **) = early_signals;

int main(int argc, char **argv) {
  /* Training: the stop signals are recorded from the very start, before MPI_Init, the
   * deck, the backend, the data and the resume, so that a SIGUSR1 or SIGTERM at any
   * moment of the start-up is a clean stop (exit 3 at the next agreement point), never
   * the default action.  The other commands keep the default actions (Ctrl-C ends them
   * at once). */
  const int training = !strcmp(mode_of(argc, argv), "train");
  if (training) {
    tsr_run_install_signals();
    tsr_fault_start_pause("mpi_init");
  }
  /* MPI_THREAD_MULTIPLE lets the watchdog and heartbeat threads call MPI (MPI_Abort, the
   * heartbeat's messages) while the main thread is blocked in a collective; where the
   * library cannot, the watchdog falls back to _exit and there is no heartbeat. */
  int threads = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &threads);
  /* ours again, whatever the MPI library installed for them (a signal meanwhile is kept:
   * the handlers only set a flag, and setting them again leaves it) */
  if (training) tsr_run_install_signals();
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  tsr_set_rank(rank);
  tsr_run_set_command(argc, argv);

  int rc = 0;
  const char *mode = "train";
  int a = 1;
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    if (rank == 0) usage(stdout);
    goto out;
  }
  if (argc > 1 && !strcmp(argv[1], "--version")) {
    if (rank == 0) printf("tessera %s\n", PACKAGE_VERSION);
    goto out;
  }
  if (argc > 1 && !strcmp(argv[1], "--help-deck")) {
    if (rank == 0) tsr_deck_help(stdout);
    goto out;
  }
  if (argc > 1 && (!strcmp(argv[1], "eval") || !strcmp(argv[1], "plan") ||
                   !strcmp(argv[1], "generate"))) {
    mode = argv[1];
    a = 2;
  }
  if (!strcmp(mode, "generate")) { /* generate.c: its own options; rank 0 generates */
    link_device();
    rc = tsr_generate_main(argc - a, argv + a, MPI_COMM_WORLD, tsr_deck_path);
    goto out;
  }
  if (!strcmp(mode, "plan")) { /* serial: rank 0 plans, every rank exits with its code */
    char path[PATH_MAX]; /* the deck found by name replaces it in argv */
    plan_link_probe(rank, world);
    if (rank == 0) rc = tsr_deck_path_args(argc - a, argv + a, path, sizeof path);
    if (rank == 0 && !rc) rc = tsr_plan_main(argc - a, argv + a);
    /* the others wait without spinning: a plan of this host measures its kernels meanwhile */
    MPI_Request rq;
    MPI_Ibcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq);
    for (int done = 0; !done;) {
      MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
      if (!done) usleep(1000);
    }
    goto out;
  }
  /* eval's one option: --tokenizer PATH (or =PATH), taken out of the arguments */
  const char *tokenizer = NULL;
  for (int i = a; !strcmp(mode, "eval") && i < argc; i++) {
    const int joined = !strncmp(argv[i], "--tokenizer=", 12);
    if (!joined && strcmp(argv[i], "--tokenizer")) continue;
    if (!joined && i + 1 >= argc) {
      if (rank == 0) fprintf(stderr, "error: --tokenizer needs a value\n");
      rc = TSR_ERR_INPUT;
      goto out;
    }
    tokenizer = joined ? argv[i] + 12 : argv[i + 1];
    const int take = joined ? 1 : 2;
    for (int j = i; j + take < argc; j++) argv[j] = argv[j + take];
    argc -= take;
    i--;
  }
  /* the options left: --help anywhere (`tessera eval --help`), or a mistake, before the deck
   * is looked for (it named '--bogus' a deck that was not there) */
  for (int i = a; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      if (rank == 0) usage(stdout);
      goto out;
    }
  }
  for (int i = a; i < argc; i++) {
    if (argv[i][0] == '-') {
      if (rank == 0) {
        fprintf(stderr, "error: unknown option '%s'%s\n", argv[i],
                strcmp(mode, "eval") ? "" : " of tessera eval (its one option is --tokenizer)");
        usage(stderr);
      }
      rc = TSR_ERR_INPUT;
      goto out;
    }
  }
  /* A first argument without '=' is the deck; otherwise the embedded default. */
  const char *deck = NULL;
  if (a < argc && !strchr(argv[a], '=')) deck = argv[a++];
  if (!deck && !strcmp(mode, "eval")) {
    if (rank == 0) {
      fprintf(stderr, "error: tessera eval needs a deck or a checkpoint file\n");
      usage(stderr);
    }
    rc = TSR_ERR_INPUT;
    goto out;
  }

  tsr_config cfg;
  rc = load_config(&cfg, deck, argc - a, argv + a, world, !strcmp(mode, "eval"));
  if (rc) goto out;
  static char deck_text[1 << 16];
  tsr_deck_write(&cfg, deck_text, sizeof deck_text);
  tsr_cpu_open(threads_per_rank());
  link_device();
  if ((rc = tsr_watchdog_start(cfg.run.step_timeout_s, threads == MPI_THREAD_MULTIPLE)) != 0) goto out;
  if ((rc = tsr_heartbeat_start(cfg.run.heartbeat_s, threads == MPI_THREAD_MULTIPLE,
                                MPI_COMM_WORLD)) != 0)
    goto out;
  if (training) tsr_fault_start_pause("setup");
  rc = !strcmp(mode, "eval") ? tsr_eval(&cfg, tokenizer, MPI_COMM_WORLD)
                             : tsr_train(&cfg, deck_text, MPI_COMM_WORLD);
  /* tsr_train / tsr_eval return only outcomes every rank shares (a failure of one rank
   * alone aborts the job there); this makes the exit code the same everywhere. */
  if (world > 1) {
    int any = 0;
    MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    rc = any;
  }
out:
  tsr_heartbeat_stop(); /* every rank is past the last collective */
  tsr_watchdog_stop();
  MPI_Finalize();
  return rc;
}
