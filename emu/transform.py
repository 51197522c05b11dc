# transform.py — turns a .cu file into C++ for the CPU emulation (tests/cuda/emulate.sh):
#   kernel<<<grid, block, smem, stream>>>(args)  ->  emu_launch(dim3(grid), dim3(block), smem,
#                                                     [&]() { kernel(args); })
#   extern __shared__ [__align__(N)] float smem[]; ->  float *smem = emu_dyn_smem;
# .cu -> emulated C++: kernel<<<g, b, s, st>>>(args) -> emu_launch(g, b, s, [&] { kernel(args); })
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r"extern __shared__ (__align__\(\d+\) )?float smem\[\];", "float *smem = emu_dyn_smem;", src)
out, i = [], 0
while True:
    j = src.find("<<<", i)
    if j < 0: out.append(src[i:]); break
    # kernel name (+ template args) before <<<
    k = j
    if src[k-1] == '>':
        depth = 0
        while True:
            k -= 1
            if src[k] == '>': depth += 1
            elif src[k] == '<':
                depth -= 1
                if depth == 0: break
    m = re.search(r'[A-Za-z_][A-Za-z_0-9]*$', src[:k])
    start = m.start()
    e = src.find(">>>", j)
    cfg = src[j+3:e]
    assert src[e+3] == '('
    depth, p = 0, e+3
    while True:
        if src[p] == '(': depth += 1
        elif src[p] == ')':
            depth -= 1
            if depth == 0: break
        p += 1
    args = src[e+4:p]
    # split cfg: grid, block, smem, stream (top-level commas)
    parts, d, cur = [], 0, ''
    for ch in cfg:
        if ch in '([': d += 1
        if ch in ')]': d -= 1
        if ch == ',' and d == 0: parts.append(cur); cur = ''
        else: cur += ch
    parts.append(cur)
    out.append(src[i:start])
    out.append("emu_launch(dim3(%s), dim3(%s), %s, [&]() { %s(%s); })" % (parts[0], parts[1], parts[2] if len(parts) > 2 else '0', src[start:k] if False else src[start:j], args))
    i = p + 1
print(''.join(out))
