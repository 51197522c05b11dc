#!/usr/bin/env bash
# gpu_window.sh — the rehearsal of the device plan (tools/gpu/window.sh), here without a
# GPU: tools/gpu/bundle.sh --emu packs tessera and the kernel tests linked with the CPU
# emulation of the CUDA runtime, and window.sh --dry-run runs both calls with every part,
# tiny shapes and PyTorch on the CPU, as the GPU machine will with the real bundle:
#  (a) the bundle is made by one command and is well under the 64 MiB a call can carry
#      (its emulated kernels compiled once for the CUDA tests: tests/lib.sh emu_build);
#  (b) call 1: info, the kernel tests, the trainer against the CPU (fp32, bf16, fp16;
#      mma.sync, cuDNN's stand-in; the bf16 curve), llama at micro-batch 1 for the two
#      attentions and at the largest micro-batch the planner fits, at micro-batch 1 with the
#      optimizer offloaded, at the largest with the activation offload, PyTorch eager, the op
#      profile: each part ends with exit 0 and its result lines, and the summary takes the
#      decisions and results (the cuDNN default, cuDNN against mma.sync, tokens/s against
#      PyTorch);
#  (c) call 2 with call 1's results: compute-sanitizer's stand-in over 2 bf16 steps and
#      over the attention kernel tests (the head_dim 64 ones in a dry run), torch.compile's
#      place; the summary reads both calls;
#  (d) a short budget: a part over its limit is killed, its results so far and the earlier
#      parts' stay in results.txt and the packed logs, the parts with no time left are
#      skipped and say so, and the call exits 1 (TW_LIMIT_kernels=0 leaves a part out).
set -u
. "${top_srcdir:-.}/tests/lib.sh"
mpi_test_setup
export OMP_NUM_THREADS=2
command -v g++ >/dev/null || skip "no g++"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch' 2>/dev/null ||
  skip "no Debian python3-torch (PyTorch's part)"
export PYTHON=/usr/bin/python3
emu_build # exports EMU_KERNELS_FROM for the bundle's links
W="$top_srcdir/tools/gpu/window.sh"
# README.md's two rehearsal commands, run as written in a folder that links the tree's
# tools/ (the build tree is top_builddir)
bcmd=$(grep -o '`tools/gpu/bundle.sh --emu [^`]*`' "$top_srcdir/README.md" | tr -d '`' | head -1)
wcmd=$(grep -o '`tools/gpu/window.sh [^`]*--dry-run`' "$top_srcdir/README.md" | tr -d '`' | head -1)
echo "    README: $bcmd; $wcmd"
check "README.md names the bundle and the rehearsal commands" test -n "$bcmd" -a -n "$wcmd"
mkdir -p "$SCRATCH/rd" && ln -s "$(cd "$top_srcdir" && pwd)/tools" "$SCRATCH/rd/tools"
export top_builddir=$(cd "$top_builddir" && pwd) TMPDIR=$SCRATCH
t0=$(date +%s)
(cd "$SCRATCH/rd" && eval "$bcmd") >"$SCRATCH/bundle.out" 2>&1
check "(a) bundle.sh --emu makes the bundle (exit $?)" test -f "$SCRATCH/rd/b.tar.xz"
cp "$SCRATCH/rd/b.tar.xz" "$SCRATCH/b.tar.xz"
tail -1 "$SCRATCH/bundle.out"
check "(a) ... under 48 MiB" test "$(stat -c %s "$SCRATCH/b.tar.xz")" -lt $((48 << 20))
check "(a) ... its manifest says emulation" sh -c "tar xJOf '$SCRATCH/b.tar.xz' ./MANIFEST | grep -q '^emulation yes'"
echo "    bundle: $(($(date +%s) - t0)) s"

# (b) call 1, README.md's command
t0=$(date +%s)
(cd "$SCRATCH/rd" && eval "$wcmd") >"$SCRATCH/call1.out" 2>&1
check "(b) call 1 ran every part to its end (exit $?)" test $? -eq 0
echo "    call 1: $(($(date +%s) - t0)) s"
mkdir -p "$SCRATCH/o1" && cp -r "$SCRATCH/rd/OUT/." "$SCRATCH/o1/"
R1=$SCRATCH/o1/results.txt
for p in info kernels train llama torch profile; do
  check "(b) part $p: exit 0" grep -q "^part name=$p rc=0 " "$R1"
done
check "(b) the kernel tests ran and passed" grep -q "^kernels passed=[1-9][0-9]* failed=0 rc=0" "$R1"
check "(b) 8 trainer checks against the CPU, all passed" \
  sh -c "test \$(grep -c '^check name=.* ok=1' '$R1') -eq 8 && ! grep -q '^check .* ok=0' '$R1'"
for a in mma cudnn; do
  check "(b) llama at micro-batch 1 with $a: timed" grep -q "^llama attn=$a mb=1 steps=2 step_ms=[0-9.]* .*rc=0" "$R1"
done
check "(b) llama with cuDNN ran cuDNN's (stand-in) attention" grep -q "^llama attn=cudnn mb=1 .*cudnn=1" "$R1"
check "(b) llama at the planner's largest micro-batch (4 here), cuDNN and mma.sync" \
  sh -c "grep -q '^llama attn=cudnn mb=4 .*rc=0' '$R1' && grep -q '^llama attn=mma mb=4 .*rc=0' '$R1'"
check "(b) llama at micro-batch 1 with the optimizer offloaded: timed" \
  grep -q "^llama attn=cudnn mb=1 offload=optimizer steps=2 step_ms=[0-9.]* .*rc=0" "$R1"
check "(b) llama at micro-batch 4 with the activation offload: timed" \
  grep -q "^llama attn=cudnn mb=4 act_offload=1 steps=[0-9]* step_ms=[0-9.]* .*rc=0" "$R1"
check "(b) PyTorch eager at micro-batch 1 and 4" \
  sh -c "grep -q '^torch mode=eager mb=1 rc=0 step_ms=' '$R1' && grep -q '^torch mode=eager mb=4 rc=0 step_ms=' '$R1'"
check "(b) the FLOPs of a token from the planner" grep -q "^model name=llama1b flops_per_token=[0-9]" "$R1"
check "(b) the profile printed its op table" grep -q "^profile what=llama1b_mb1 attn=cudnn steps=2 rc=0 table=1" "$R1"
S1=$SCRATCH/o1/summary.txt
check "(b) summary: the gate passed" grep -q "^gate .*: PASS" "$S1"
check "(b) summary: cuDNN the default, its decision held" grep -q "^DECISION cudnn_default: yes" "$S1"
check "(b) summary: cuDNN against mma.sync at both micro-batches, no family decision" \
  sh -c "test \$(grep -c '^RESULT cudnn/mma step time mb [14]: [0-9.]* (cuDNN ' '$S1') -eq 2 &&
    ! grep -q '^DECISION delete_family' '$S1'"
check "(b) summary: Tessera against PyTorch eager at both micro-batches" \
  sh -c "test \$(grep -c '^RESULT tessera/torch_eager mb' '$S1') -eq 2"
check "(b) summary: the offloaded run against the same run without it" \
  grep -q "^RESULT offload=optimizer llama1b cudnn mb 1: [0-9.]* ms/step, [0-9.]* GiB; without it " "$S1"
check "(b) summary: the activation offload's run against the same run without it" \
  grep -q "^RESULT act_offload=1 llama1b cudnn mb 4: [0-9.]* ms/step, [0-9.]* GiB; without it " "$S1"
check "(b) the logs came back packed" sh -c "tar tzf '$SCRATCH/o1/logs-call1.tgz' | grep -q 'logs/llama.log'"

# (c) call 2, with call 1's results
t0=$(date +%s)
bash "$W" "$SCRATCH/b.tar.xz" "$SCRATCH/o2" 2 600 --previous "$R1" --dry-run \
  >"$SCRATCH/call2.out" 2>&1
check "(c) call 2 ran every part to its end (exit $?)" test $? -eq 0
echo "    call 2: $(($(date +%s) - t0)) s"
R2=$SCRATCH/o2/results.txt
check "(c) memcheck's place over 2 bf16 steps: 0 errors, finished" \
  grep -q "^sanitizer tool=memcheck what=2_bf16_steps errors=0 rc=0 finished=1" "$R2"
check "(c) racecheck's place over the attention kernel tests: 0 hazards" \
  grep -q "^sanitizer tool=racecheck what=attention_kernel_tests errors=0 rc=0 finished=1" "$R2"
check "(c) torch.compile's place" grep -q "^torch mode=compile mb=1 rc=0 step_ms=" "$R2"
check "(c) the summary reads both calls" sh -c "grep -q '^DECISION cudnn_default: yes' '$SCRATCH/o2/summary.txt' && grep -q 'RESULT tessera/torch_compile mb 1' '$SCRATCH/o2/summary.txt'"

# (d) a budget too short for the plan: info, then (the kernel tests left out) the trainer
# part killed at its 12 s, which leaves less than the 20 s a part needs of the 40 s budget
# for the rest (held by steps, not by the machine's speed: info takes a few seconds, the
# part's first check, one step on each device, about two, and its bf16 curve of 100000
# steps cannot end in 12 s)
TW_LIMIT_kernels=0 TW_LIMIT_train=12 TW_CURVE_STEPS=100000 bash "$W" "$SCRATCH/b.tar.xz" \
  "$SCRATCH/o3" 1 40 --dry-run >"$SCRATCH/call3.out" 2>&1
check "(d) a call cut short exits 1" test $? -eq 1
R3=$SCRATCH/o3/results.txt
check "(d) the earlier parts' results stay" grep -q "^part name=info rc=0 " "$R3"
check "(d) a part left out says so" grep -q "^part name=kernels skipped=left_out_by_TW_LIMIT_kernels" "$R3"
check "(d) the part over its limit was killed (timeout's 124)" grep -q "^part name=train rc=124 " "$R3"
check "(d) ... and what it measured before stays" grep -q "^check name=1step_fp32 ok=1" "$R3"
check "(d) parts with no time left are skipped, saying so" \
  grep -q "^part name=torch skipped=[0-9-]*s_of_the_budget_left" "$R3"
check "(d) the summary says the gate did not pass" grep -q "^gate .*: FAIL" "$SCRATCH/o3/summary.txt"
check "(d) the killed part's log came back" sh -c "tar tzf '$SCRATCH/o3/logs-call1.tgz' | grep -q 'logs/train.log'"
finish
