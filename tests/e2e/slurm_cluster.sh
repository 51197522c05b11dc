# shellcheck shell=bash
# slurm_cluster.sh — a throw-away Slurm cluster on this machine for the Slurm tests (sourced).
#
#   . tests/e2e/slurm_cluster.sh
#   tsr_slurm_have || skip "..."
#   tsr_slurm_start 2 4          # munged + slurmctld + slurmd n1, n2 (4 CPUs each); exports SLURM_CONF
#   sbatch ...; tsr_slurm_wait JOBID 120
#   (on exit, whatever way the script ends: every daemon it started is stopped by PID and
#    its directory removed)
#
# Everything lives in a fresh `mktemp -d` directory: a private munge key and socket, the
# slurm.conf, state, spool, logs and per-node scratch.  Nothing outside it is touched, no
# system service is started, and daemons are stopped only by the PIDs this script started
# (never by name), so two runs side by side, or one after the other, do not meet.
#
# What a fake two-node cluster on one host needs (worked out on Debian 12, Slurm 22.05):
#  - several slurmd on one host: slurmd -N NAME, a Port per node (Debian builds Slurm
#    with multiple-slurmd support);
#  - a TmpFS per node (TmpFS=DIR/%n): mpi/pmix creates spmix_appdir_<uid>_<job>.<step> in
#    it, and two nodes sharing /tmp collide (EEXIST);
#  - a TaskProlog giving each node its own TMPDIR and Open MPI shared-memory directory:
#    vader segment names carry the hostname, which both fake nodes share;
#  - clients (sbatch, squeue, scontrol, srun) find the cluster only through SLURM_CONF,
#    otherwise they try a DNS SRV lookup and fail;
#  - no cgroups (proctrack/linuxproc, task/none) and no accounting daemon: sacct is not
#    available, so job states and exit codes are read with `scontrol show job`, which
#    keeps finished jobs for MinJobAge seconds.

# tsr_slurm_test_setup — a Slurm test's start (after tests/lib.sh): skips (77) without
# Slurm and munge or when not root (the test cluster's slurmd runs as root), then
# mpi_test_setup.
tsr_slurm_test_setup() {
  tsr_slurm_have || skip "Slurm not installed (apt-get install slurm-wlm munge)"
  [ "$(id -u)" -eq 0 ] || skip "the test cluster runs slurmd as root"
  mpi_test_setup
}

# tsr_slurm_have — are the Slurm and munge programs installed?
tsr_slurm_have() {
  local p
  for p in munged munge slurmctld slurmd sbatch srun scontrol squeue sinfo scancel; do
    command -v "$p" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$p" >/dev/null 2>&1 ||
      return 1
  done
}

# A free TCP port range: BASE .. BASE+COUNT-1 with nothing listening, from a random start.
tsr_slurm_ports() { # tsr_slurm_ports COUNT
  local count=$1 base i busy
  for _ in $(seq 50); do
    base=$((20000 + (RANDOM % 1200) * 10)) # below the ephemeral range
    busy=0
    for i in $(seq 0 $((count - 1))); do
      if ss -Hltn "sport = :$((base + i))" 2>/dev/null | grep -q .; then busy=1; fi
    done
    [ "$busy" -eq 0 ] && { echo "$base"; return 0; }
  done
  return 1
}

tsr_slurm_log() { echo "slurm-cluster: $*"; }

# tsr_slurm_start NNODES CPUS_PER_NODE — start the cluster; sets TSR_SLURM_DIR and
# TSR_SLURM_NODES (n1..nN) and exports SLURM_CONF.  Returns 1 (after printing the logs)
# when the nodes do not come up.
tsr_slurm_start() {
  local nn=${1:-2} cpus=${2:-4} d m base host i t idle prev=''
  PATH="$PATH:/usr/sbin:/sbin"
  # Chain the stop in front of whatever EXIT trap the caller has (tests/lib.sh's scratch
  # removal), and turn the usual termination signals into an exit so that it runs.
  # shellcheck disable=SC2046 # `trap -p` prints a quoted command: re-split it as words
  eval "set -- $(trap -p EXIT)"
  [ $# -ge 3 ] && prev=$3
  TSR_SLURM_PREV_TRAP=$prev
  trap 'tsr_slurm_stop; eval "$TSR_SLURM_PREV_TRAP"' EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  trap 'exit 129' HUP

  TSR_SLURM_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tsr-slurm.XXXXXX") || return 1
  d=$TSR_SLURM_DIR
  m=$d/munge
  chmod 755 "$d"
  mkdir -p "$m/etc" "$m/run" "$m/log" "$m/lib" "$d/etc" "$d/state" "$d/log" "$d/run"
  chmod 755 "$m" "$m/run"
  chmod 700 "$m/etc" "$m/log" "$m/lib"
  # munge: a private key and socket, so a system munged (if any) is neither used nor needed
  dd if=/dev/urandom of="$m/etc/munge.key" bs=1024 count=1 2>/dev/null
  chmod 400 "$m/etc/munge.key"
  TSR_SLURM_MUNGE_SOCKET=$m/run/munge.socket
  # munged forks into the background and writes its PID file before the parent returns
  if ! munged --key-file="$m/etc/munge.key" --socket="$TSR_SLURM_MUNGE_SOCKET" \
    --pid-file="$m/run/munged.pid" --log-file="$m/log/munged.log" --seed-file="$m/lib/munged.seed"; then
    tsr_slurm_log "munged did not start"
    cat "$m/log/munged.log" 2>/dev/null
    return 1
  fi
  if ! munge -S "$TSR_SLURM_MUNGE_SOCKET" -n </dev/null | unmunge -S "$TSR_SLURM_MUNGE_SOCKET" >/dev/null; then
    tsr_slurm_log "munge does not answer on $TSR_SLURM_MUNGE_SOCKET"
    return 1
  fi

  base=$(tsr_slurm_ports $((nn + 1))) || { tsr_slurm_log "no free ports"; return 1; }
  host=$(hostname -s)
  export SLURM_CONF=$d/etc/slurm.conf
  # The TaskProlog prints "export K=V" lines into each task's environment.
  cat >"$d/etc/task_prolog.sh" <<EOF
#!/bin/sh
# per-node TMPDIR and Open MPI shared-memory directory: the fake nodes share one host
dir=$d/tmp/\${SLURMD_NODENAME:-none}
mkdir -p "\$dir/shm"
echo "export TMPDIR=\$dir"
echo "export OMPI_MCA_btl_vader_backing_directory=\$dir/shm"
EOF
  chmod 755 "$d/etc/task_prolog.sh"
  {
    cat <<EOF
# generated by tests/e2e/slurm_cluster.sh: $nn fake node(s) on host $host
ClusterName=tsrtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$TSR_SLURM_MUNGE_SOCKET
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
TmpFS=$d/tmp/%n
TaskProlog=$d/etc/task_prolog.sh
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
Waittime=0
EOF
    for i in $(seq 1 "$nn"); do
      echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((base + i)) CPUs=$cpus RealMemory=1000 State=UNKNOWN"
      mkdir -p "$d/spool/n$i" "$d/tmp/n$i"
    done
    echo "PartitionName=debug Nodes=n[1-$nn] Default=YES MaxTime=INFINITE State=UP"
  } >"$SLURM_CONF"

  # Foreground daemons (-D) in the background: $! is the daemon itself.
  slurmctld -D -i -f "$SLURM_CONF" >"$d/log/slurmctld.out" 2>&1 &
  echo $! >"$d/run/slurmctld.fgpid"
  for t in $(seq 100); do
    scontrol ping 2>/dev/null | grep -q 'is UP' && break
    sleep 0.1
  done
  TSR_SLURM_NODES=()
  for i in $(seq 1 "$nn"); do
    slurmd -D -N "n$i" -f "$SLURM_CONF" >"$d/log/slurmd-n$i.out" 2>&1 &
    echo $! >"$d/run/slurmd-n$i.fgpid"
    TSR_SLURM_NODES+=("n$i")
  done
  for t in $(seq 300); do
    idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [ "$idle" -ge "$nn" ] && break
    sleep 0.2
  done
  if [ "$idle" -lt "$nn" ]; then
    tsr_slurm_log "only $idle of $nn nodes idle after 60 s"
    sinfo -N -o '%N %T %E' 2>&1
    tail -n 20 "$d"/log/*.log "$d"/log/*.out 2>/dev/null
    return 1
  fi
  tsr_slurm_log "$nn nodes idle (ports $base-$((base + nn)), dir $d, $((t / 5)) s)"
}

# Stop one daemon by PID: TERM, up to 10 s, then KILL.
tsr_slurm_stop_pid() { # tsr_slurm_stop_pid PID NAME
  local pid=$1 t
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for t in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  tsr_slurm_log "$2 (pid $pid) did not stop on TERM: KILL"
  kill -KILL "$pid" 2>/dev/null
  return 0
}

# tsr_slurm_procs — PIDs of the processes with a file open in this cluster's directory:
# its daemons, and step daemons (slurmstepd) and tasks of its jobs, which detach from
# slurmd and so are not its children.
tsr_slurm_procs() {
  local d=$TSR_SLURM_DIR fd pid
  for fd in /proc/[0-9]*/fd/*; do
    case $(readlink "$fd" 2>/dev/null) in
      "$d"/*)
        pid=${fd#/proc/}
        pid=${pid%%/*}
        [ "$pid" != $$ ] && [ "$pid" != "$BASHPID" ] && echo "$pid" ;;
    esac
  done | sort -u
}

# tsr_slurm_stop — cancel what still runs, stop the daemons this script started (by their
# PIDs), then any process left with a file open in the directory (a step daemon that
# outlived slurmd), and remove the directory.  TSR_SLURM_KEEP=1 keeps the directory
# (logs) for a look.
tsr_slurm_stop() {
  local d=${TSR_SLURM_DIR:-} f pid
  [ -n "$d" ] && [ -d "$d" ] || return 0
  # jobs first, so that slurmd ends their processes through its own tracking
  if [ -f "$d/run/slurmctld.fgpid" ] && kill -0 "$(cat "$d/run/slurmctld.fgpid")" 2>/dev/null; then
    scancel --quiet --partition=debug 2>/dev/null
    for _ in $(seq 100); do
      [ -z "$(squeue -h -t running,completing 2>/dev/null)" ] && [ -z "$(tsr_slurm_step_files)" ] && break
      sleep 0.2
    done
  fi
  for f in "$d"/run/slurmd-*.fgpid; do
    [ -f "$f" ] && tsr_slurm_stop_pid "$(cat "$f")" "$(basename "$f" .fgpid)"
  done
  [ -f "$d/run/slurmctld.fgpid" ] && tsr_slurm_stop_pid "$(cat "$d/run/slurmctld.fgpid")" slurmctld
  [ -f "$d/munge/run/munged.pid" ] && tsr_slurm_stop_pid "$(cat "$d/munge/run/munged.pid")" munged
  for pid in $(tsr_slurm_procs); do
    tsr_slurm_log "stopping left-over pid $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null))"
    tsr_slurm_stop_pid "$pid" "pid $pid"
  done
  if [ "${TSR_SLURM_KEEP:-0}" = 1 ]; then
    tsr_slurm_log "kept $d"
  else
    rm -rf "$d"
  fi
  TSR_SLURM_DIR=
}

# tsr_slurm_step_files [JOBID] — what the step daemons of a job (of any job) have left in
# the spool and TmpFS directories while they run: their sockets and PMIx directories.
tsr_slurm_step_files() {
  local d=$TSR_SLURM_DIR j=${1:-[0-9]*}
  compgen -G "$d/spool/*/n*_$j.*" || compgen -G "$d/spool/*/stepd.slurm.pmix.$j.*" ||
    compgen -G "$d/tmp/*/spmix_appdir_*_$j.*"
}

# tsr_slurm_field JOBID FIELD — one field of `scontrol show job` (JobState, ExitCode,
# Restarts, NodeList, Reason, ExcNodeList, ...).
tsr_slurm_field() {
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# tsr_slurm_wait JOBID SECONDS — wait for the job to end (COMPLETED, FAILED, CANCELLED,
# ...).  A job that requeued itself waits about two minutes for its BeginTime; it is
# started as soon as its last attempt has cleaned up instead (`scontrol update
# StartTime=now`), as an operator would.
# Returns 1 on a timeout.
tsr_slurm_wait() {
  local job=$1 limit=$2 t0 state reason pending_since=
  t0=$(date +%s)
  while [ $(($(date +%s) - t0)) -lt "$limit" ]; do
    state=$(tsr_slurm_field "$job" JobState)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        return 0 ;;
      PENDING)
        # Not at once: the requeue revoked the job's credential as of that second, and an
        # attempt started within it is killed ("Job credential revoked": the job ends
        # FAILED).  And only once the last attempt's step daemons are gone: PMIx names
        # its sockets by job and step, and a new attempt's step 0 cannot start beside the
        # old one's (srun: "task launch failed").  Slurm's own two minutes cover both.
        reason=$(tsr_slurm_field "$job" Reason)
        if [ "$reason" = BeginTime ]; then
          [ -n "$pending_since" ] || pending_since=$(date +%s)
          if [ $(($(date +%s) - pending_since)) -ge 3 ] && [ -z "$(tsr_slurm_step_files "$job")" ]; then
            scontrol update JobId="$job" StartTime=now 2>/dev/null
            pending_since=
          fi
        fi ;;
      *) pending_since= ;;
    esac
    sleep 0.5
  done
  tsr_slurm_log "job $job still $state after $limit s"
  return 1
}
