#!/usr/bin/env python3
"""kernel-report.py: the verification kernel's speed, read from its machine code, without a GPU.

Compiles core/kernels/specula_verify.cu (plus the per-pass probe wrappers in
core/kernels/specula_probes.cu) with the crate's own NVRTC options (`specula_cuda::nvrtc_options`,
through `cargo run -p specula-cuda --example kernel_ptx`), assembles it with ptxas for sm_80 and
sm_90, disassembles it with cuobjdump, and reports per pass (argmax, entropy, race, residual
race, acceptance test):

  * instructions per element on the hot path of the pass's main loop (thread instructions);
  * registers (ptxas) of the probe and of the real kernel, spill bytes, local-memory accesses in the
    hot loop;
  * bytes each thread has in flight when the loop waits for its first load, and per SM at the real
    kernel's occupancy.

It also compiles the tree module (core/kernels/specula_tree.cu after the chain's device functions)
and reports its two entries' registers, spills and local-memory instructions in their row loops
(no spill on a row loop's hot path, as for the chain's entries).

Then a small latency/roofline model (documented in `model()` below) turns those into predicted
microseconds and fractions of a device-to-device copy for batch 1, 64, 256 at V = 128256, k = 4 on an
H200. The numbers are PREDICTIONS of that model, not measurements.

Exit status: 0 when the budgets (BUDGET below) hold, 1 when one is exceeded (or any hot loop
spills), 2 when a tool is missing. Python 3 standard library only.

Usage (after `. scripts/cuda-tools.sh`, which also installs cuobjdump/nvdisasm into .tools/sass):
    python3 scripts/kernel-report.py [--arch sm_90 ...] [--markdown]
"""

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------- budgets (CI fails above them)
# Instructions per element on each pass's hot path, sm_90 and sm_80 alike. Issue 17's target
# is ~30 for every pass (the four probability passes' budgets are at most that), issue 30's
# ~40 for the logits and filter passes (not met: see their budgets below). Every budget is
# close to what the kernel does today (a little slack for compiler-version noise), so a change
# that makes a pass slower fails CI. Lower them as the kernel improves.
BUDGET = {
    "argmax": 7.0,
    "entropy": 30.0,
    "race": 28.0,
    "residual": 29.0,
    # Target logits (T > 0) and the logits entries' engine inputs (issue 13): above the 30
    # target, honestly. Every element pays the rules' binary32 quotient l / T (z; since
    # 2026-12-07 about 4-5 instructions, sp_quot / sp_quot2, instead of the IEEE division's ~10) and an
    # exp_p (~22); the sum the fixed-point split; the
    # race the plain race's Philox and skip test; the half paths their widening (f16 needs its
    # exponent cases); race_cut the threshold test; the filters' histogram pass (sp_filter_pass;
    # each probe's call has its mode and level as constants: filter_count0 the count's one shared
    # atomic, filter_mass0 the mass's scaled value and one 32-bit shared atomic with its carry
    # test, and a range test on the key per element, at level 0; filter_count and filter_mass
    # at level 1, where only the bound of each weight and one range test on its key are on the
    # hot path).
    # sm_90 (sm_80), first measured 2026-12-02 -> 2026-12-06 (exp_p without branches, the
    # races without e / S per id on the hot path, the filters' limbs and 32-bit atomics):
    # softmax_max 19.7 (20.8) unchanged; softmax_sum 71.7 (72.8) -> 53.8 (55.0); race_logits
    # 102.6 (105.8) -> 69.1 (69.4); softmax_sum_bf16 72.6 (73.8) -> 54.6 (55.8);
    # race_logits_f16 114.8 (118.2) -> 81.8 (80.9); race_cut 107.8 (110.9) -> 71.8 (72.2);
    # filter_count 85.4 (83.2) -> 62.9 (63.9); filter_mass 176.1 (173.2) -> 98.9 (99.9).
    # 2026-12-07 (the race's skip test on an upper bound of the weight, sp_weight_ub: no division
    # or exp_p per id on the hot path): race_logits 69.1 (69.4) -> 38.1 (37.2); race_logits_f16
    # 81.8 (80.9) -> 39.6 (38.8); race_cut 71.8 (72.2) -> 38.9 (38.8).
    # 2026-12-07 (the filters' pass without bounds tests, one atomic per mass): filter_count
    # 62.9 (63.9) -> 53.8 (54.6); filter_mass 98.9 (99.9) -> 64.8 (65.6).
    # 2026-12-07, softmax_max -> 8.5 (9.1) (binary32 rows in a loop of their own); the
    # quotient l / T without a division per id (a per-row reciprocal and FMAs, proven exact in
    # range; sp_quot, sp_quot2), exp_p's first reduction step fused, the sum's
    # floor(e 2^64) in one conversion: softmax_sum -> 37.1 (37.2), softmax_sum_bf16 -> 38.4
    # (38.6), and every pass reading e through sp_soft_e: race_logits -> 65.6 (65.1),
    # race_logits_f16 -> 77.2 (76.6), race_cut -> 67.6 (67.1), filter_count -> 58.2 (58.2),
    # filter_mass -> 94.2 (94.2).
    # Merged (2026-12-07 20:40 UTC): race_logits 38.9 (39.2), race_logits_f16 40.6 (39.2),
    # race_cut 38.9 (39.2), filter_count 48.9 (48.8), filter_mass 59.9 (59.8).
    # 2026-12-07 (the filters' sparse passes: at a descent level >= 1 or with a floor, each id's
    # bound first, its exact weight only in a cold region, sp_filter_sparse): the probes now
    # measure two loops, filter_count / filter_mass at level 1 (the sparse loop) 48.9 (48.8) ->
    # 11.9 (12.1) and 59.9 (59.8) -> 11.9 (12.1), filter_count0 / filter_mass0 at level 0
    # without a floor (the dense loop: every id's exact weight) 48.6 (48.4) and 59.6 (58.4).
    # 2026-12-07 (half rows' race in its own function, tiles of 4 words of 8 bytes; the probe
    # runs that function's f16 logits loop): race_logits_f16 -> 39.8 (39.5), 16 -> 32 B per
    # thread.
    # Budgets a little above the larger of the two.
    "softmax_max": 9.5,
    "softmax_sum": 38.5,
    "race_logits": 40.0,
    "softmax_sum_bf16": 39.5,
    "race_logits_f16": 40.5,
    "race_cut": 40.0,
    "filter_count": 13.0,
    "filter_mass": 13.0,
    "filter_count0": 49.5,
    "filter_mass0": 60.5,
}
TARGET_INSTR = 30.0  # the issue's target, per element, every pass
TARGET_INSTR_LOGITS = 40.0  # issue 30's target, per element, the logits and filter passes
LOGITS_PASSES = ("softmax_max", "softmax_sum", "race_logits", "softmax_sum_bf16",
                 "race_logits_f16", "race_cut", "filter_count", "filter_mass", "filter_count0",
                 "filter_mass0")
TARGET_INFLIGHT = 32 * 1024  # bytes in flight per SM (issue 17)

# ---------------------------------------------------------------- the machine model (H200 SXM)
HBM_BW = 4.8e12  # bytes/s
SMS = 132
ISSUE = 33.5e12  # thread instructions per second, whole GPU (4 x 32 lanes x ~1.98 GHz x 132)
LATENCY = 700e-9  # DRAM load latency (600-800 ns), seconds
L2_LATENCY = 300e-9  # an L2 hit (rows resident in the 50 MB L2 at small batch)
SM_CAP = 200e9  # the most one SM can stream (L1/LSU), bytes/s
LAUNCH = 3e-6  # launch + block start + final memory writes (graph replay)
REDUCE = 0.6e-6  # one block-wide reduction (shuffles, two barriers, shared memory)
REGS_PER_SM = 65536
MAX_WARPS_SM = 64
MAX_BLOCKS_SM = 32
SCHEDULERS = 4
ILP = 2.0  # independent instructions a warp offers per issue slot in the hot loops (assumed)
ALU_LAT = 4.0  # cycles of a dependent integer/float operation
CLOCK = 1.98e9  # SM clock, Hz

VOCAB = 128256  # "128k": Llama 3's vocabulary
MAX_SLICES = 64  # core/src/gpu/verifier.rs
K = 4
BATCHES = (1, 64, 256)

PASSES = {
    # name: (probe entry, loads per 4-element group, bytes per element)
    "argmax": ("specula_probe_argmax", 1, 4),
    "entropy": ("specula_probe_entropy", 1, 4),
    "race": ("specula_probe_race", 1, 4),
    "residual": ("specula_probe_residual", 2, 8),
    # Target logits (T > 0): the softmax's two pre-passes and the race reading p on the fly.
    "softmax_max": ("specula_probe_softmax_max", 1, 4),
    "softmax_sum": ("specula_probe_softmax_sum", 1, 4),
    "race_logits": ("specula_probe_race_logits", 1, 4),
    # Half rows: one 8-byte load per 4-element group (half a 16-byte one), 2 bytes per element.
    "softmax_sum_bf16": ("specula_probe_softmax_sum_bf16", 0.5, 2),
    "race_logits_f16": ("specula_probe_race_logits_f16", 0.5, 2),
    "race_cut": ("specula_probe_race_cut", 1, 4),
    "filter_count": ("specula_probe_filter_count", 1, 4),
    "filter_mass": ("specula_probe_filter_mass", 1, 4),
    "filter_count0": ("specula_probe_filter_count0", 1, 4),
    "filter_mass0": ("specula_probe_filter_mass0", 1, 4),
}


def die(msg, code=2):
    print(f"kernel-report: {msg}", file=sys.stderr)
    sys.exit(code)


def tool(name, env_var=None):
    if env_var and os.environ.get(env_var):
        return os.environ[env_var]
    found = shutil.which(name)
    if found:
        return found
    for sub in (".tools/sass/nvidia/cu13/bin", ".tools/cuda/nvidia/cuda_nvcc/bin"):
        p = os.path.join(ROOT, sub, name)
        if os.access(p, os.X_OK):
            return p
    die(f"{name} not found (run `. scripts/cuda-tools.sh` first)")


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        die(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}", 2 if r.returncode == 2 else 1)
    return r


# ---------------------------------------------------------------- compile and disassemble
def build(arch, work, kernel_cache=None):
    """PTX (kernel_ptx example), cubin + ptxas -v log, SASS text of every function."""
    ptx = os.path.join(work, f"{arch}.ptx")
    cubin = os.path.join(work, f"{arch}.cubin")
    exe = os.environ.get("SPECULA_KERNEL_PTX")
    if exe:
        cmd = [exe]
    else:
        cmd = ["cargo", "run", "-q", "-p", "specula-cuda", "--example", "kernel_ptx", "--"]
    cmd += [
        "compute_" + arch.split("_")[1],
        ptx,
        "--pre",
        os.path.join(ROOT, "core/kernels/specula_probes_pre.cuh"),
        os.path.join(ROOT, "core/kernels/specula_probes.cu"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        die(f"kernel_ptx {arch}: {r.stderr.strip()}", 2 if r.returncode == 2 else 1)
    log = run([tool("ptxas", "SPECULA_PTXAS"), f"-arch={arch}", "-v", ptx, "-o", cubin]).stderr
    cuobjdump = tool("cuobjdump", "SPECULA_CUOBJDUMP")
    env = dict(os.environ)
    # cuobjdump runs nvdisasm, which the wheel puts beside it.
    env["PATH"] = os.path.dirname(cuobjdump) + os.pathsep + env.get("PATH", "")
    sass = run([cuobjdump, "-sass", cubin], env=env).stdout
    # The shipped kernel alone (no probes, no marks): its registers set the occupancy. With
    # --kernel-cache, the NVRTC test's compile of it (the crate's `compile_ptx`: the same
    # options as the example's), when its key matches this kernel text and this ptxas.
    log0 = cached_log(kernel_cache, arch) if kernel_cache else None
    if log0 is None:
        ptx0 = os.path.join(work, f"{arch}-kernel.ptx")
        cmd0 = cmd[: cmd.index("compute_" + arch.split("_")[1])] + ["compute_" + arch.split("_")[1], ptx0]
        r = subprocess.run(cmd0, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            die(f"kernel_ptx {arch}: {r.stderr.strip()}")
        log0 = run([tool("ptxas", "SPECULA_PTXAS"), f"-arch={arch}", "-v", ptx0, "-o", ptx0 + ".cubin"]).stderr
    return parse_ptxas(log), parse_ptxas(log0), parse_sass(sass)


def build_tree(arch, work):
    """The tree module (core/src/gpu/kernels.rs TREE_SOURCE: the chain's device functions, its
    entries left out, then core/kernels/specula_tree.cu) with the cold-region marks: ptxas -v
    report and SASS of its entries."""
    ptx = os.path.join(work, f"{arch}-tree.ptx")
    pre = os.path.join(work, "tree_pre.cuh")
    with open(pre, "w") as f:
        f.write("#define SPECULA_TREE_MODULE 1\n")
    exe = os.environ.get("SPECULA_KERNEL_PTX")
    cmd = [exe] if exe else ["cargo", "run", "-q", "-p", "specula-cuda", "--example", "kernel_ptx", "--"]
    cmd += ["compute_" + arch.split("_")[1], ptx, "--pre", pre, "--pre",
            os.path.join(ROOT, "core/kernels/specula_probes_pre.cuh"),
            os.path.join(ROOT, "core/kernels/specula_tree.cu")]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        die(f"kernel_ptx {arch} (tree): {r.stderr.strip()}", 2 if r.returncode == 2 else 1)
    cubin = ptx + ".cubin"
    log = run([tool("ptxas", "SPECULA_PTXAS"), f"-arch={arch}", "-v", ptx, "-o", cubin]).stderr
    cuobjdump = tool("cuobjdump", "SPECULA_CUOBJDUMP")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(cuobjdump) + os.pathsep + env.get("PATH", "")
    return parse_ptxas(log), parse_sass(run([cuobjdump, "-sass", cubin], env=env).stdout)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def cached_log(folder, arch):
    """The NVRTC test's ptxas report of the shipped kernel for `arch`, or None (and why) when
    it is missing or was made from another kernel text or another ptxas."""
    log, key = (os.path.join(folder, f"{arch}.{ext}") for ext in ("ptxas-log", "key"))
    if not (os.path.exists(log) and os.path.exists(key)):
        print(f"kernel-report: {arch}: no cached compile in {folder}; compiling the kernel")
        return None
    with open(os.path.join(ROOT, "core/kernels/specula_verify.cu"), "rb") as f:
        want = f"fnv1a64={fnv1a64(f.read()):016x} ptxas={tool('ptxas', 'SPECULA_PTXAS')}"
    with open(key) as f:
        got = f.read().strip()
    if got != want:
        print(f"kernel-report: {arch}: the cached compile is of another kernel or ptxas "
              f"({got} vs {want}); compiling the kernel")
        return None
    print(f"kernel-report: {arch}: the kernel's ptxas report from the NVRTC test ({log})")
    with open(log) as f:
        return f.read()


def parse_ptxas(log):
    """{function: {regs, spill_st, spill_ld, stack}} from `ptxas -v`."""
    out, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = map(int, m.groups())
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = out.setdefault(m.group(1), {})
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["regs"] = int(m.group(1))
    return out


INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def parse_sass(text):
    """{function: [(addr, pred, opcode, operands)]}."""
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = INSN.search(line)
        if m and cur is not None:
            addr, pred, op, args = m.groups()
            cur.append((int(addr, 16), (pred or "").strip(), op, args.strip()))
    return funcs


# ---------------------------------------------------------------- control flow
def branch_target(op, args, pred=""):
    base = op.split(".")[0]
    # sm_80 leaves a divergent loop with a predicated CALL.REL.NOINC past its back branch: a
    # conditional jump. An unpredicated CALL is a real subroutine call (a slow path).
    if base not in ("BRA", "JMP") and not (base == "CALL" and pred not in ("", "@PT")):
        return None
    m = re.findall(r"0x([0-9a-f]+)", args)
    return int(m[-1], 16) if m else None


def blocks_of(insns):
    """Basic blocks: list of dicts {start, insns, succ}."""
    leaders = {insns[0][0]}
    for i, (a, pred, op, args) in enumerate(insns):
        t = branch_target(op, args, pred)
        base = op.split(".")[0]
        if t is not None:
            leaders.add(t)
        if base in ("BRA", "JMP", "EXIT", "RET", "BRX", "JMX", "CALL") and i + 1 < len(insns):
            leaders.add(insns[i + 1][0])
    order = sorted(leaders)
    index = {a: i for i, (a, *_rest) in enumerate(insns)}
    blocks = []
    for n, start in enumerate(order):
        if start not in index:
            continue
        end = order[n + 1] if n + 1 < len(order) else None
        body = [x for x in insns[index[start]:] if end is None or x[0] < end]
        blocks.append({"start": start, "insns": body, "succ": []})
    starts = {b["start"] for b in blocks}
    for n, b in enumerate(blocks):
        a, pred, op, args = b["insns"][-1]
        base = op.split(".")[0]
        t = branch_target(op, args, pred)
        uncond = pred in ("", "@PT")
        if t is not None and t in starts and t != a:
            b["succ"].append(t)
        falls = not (uncond and base in ("BRA", "JMP", "EXIT", "RET", "BRX", "JMX"))
        if falls and n + 1 < len(blocks):
            b["succ"].append(blocks[n + 1]["start"])
    return {b["start"]: b for b in blocks}


def loops_of(bmap):
    """Natural loops of layout back edges: [(header, set of block starts, latches)]."""
    preds = {s: [] for s in bmap}
    for s, b in bmap.items():
        for t in b["succ"]:
            preds[t].append(s)
    loops = {}
    for s, b in bmap.items():
        for t in b["succ"]:
            if t <= s:  # back edge s -> t
                body, stack = {t, s}, ([s] if s != t else [])
                while stack:
                    x = stack.pop()
                    for p in preds[x]:
                        if p not in body:
                            body.add(p)
                            stack.append(p)
                h = loops.setdefault(t, [set(), set()])
                h[0] |= body
                h[1].add(s)
    return [(h, body, latches) for h, (body, latches) in loops.items()]


def is_load(op):
    return op.startswith("LDG") or op.startswith("LD.")


def load_bytes(op):
    for w, n in ((".128", 16), (".64", 8), (".U8", 1), (".S8", 1), (".U16", 2), (".S16", 2)):
        if w in op:
            return n
    return 4


def counted(insn):
    return insn[2] != "NOP"


def hot_path(bmap, header, body, latches):
    """Longest path (in instructions, NOPs aside) from the header to a latch through the loop
    body, leaving out the cold region: blocks with a PMTRIG mark, blocks with a CALL (the
    compiler's out-of-line slow paths, e.g. of an IEEE division whose operands need scaling),
    blocks only reachable through those, and, when the loop has 128-bit loads, blocks with
    narrower loads (a row's scalar tail).
    Returns the block starts of the path, in order."""
    has128 = any(
        is_load(i[2]) and load_bytes(i[2]) == 16 for s in body for i in bmap[s]["insns"]
    )
    cold = set()
    for s in body:
        ins = bmap[s]["insns"]
        if any(i[2].startswith("PMTRIG") or (i[2].startswith("CALL") and i[1] in ("", "@PT")) for i in ins):
            cold.add(s)
        if has128 and any(is_load(i[2]) and load_bytes(i[2]) < 16 for i in ins):
            cold.add(s)
    reach, stack = {header}, [header]
    while stack:
        x = stack.pop()
        for t in bmap[x]["succ"]:
            if t in body and t not in reach and t not in cold and t != header:
                reach.add(t)
                stack.append(t)
    memo = {}

    def longest(x, seen):
        if x in memo:
            return memo[x]
        cost = sum(1 for i in bmap[x]["insns"] if counted(i))
        best = None
        for t in bmap[x]["succ"]:
            if t == header and x in latches:
                cand = (0, [])
            elif t in reach and t not in seen and t != header:
                cand = longest(t, seen | {t})
            else:
                continue
            if cand is not None and (best is None or cand[0] > best[0]):
                best = cand
        memo[x] = None if best is None else (cost + best[0], [x] + best[1])
        return memo[x]

    r = longest(header, {header})
    return r[1] if r else []


REG = re.compile(r"\bR(\d+)\b")


def inflight_bytes(path_insns):
    """Bytes of loads issued before the first instruction that reads a loaded register."""
    loaded, total = set(), 0
    for a, pred, op, args in path_insns:
        ops = [x.strip() for x in args.split(",")]
        srcs = ops[1:] if ops else []
        # Stores read their first operand too (the address); loads and ALU ops write it.
        if op.startswith("ST") or op.startswith("BRA") or op.startswith("ISETP") or op.startswith("FSETP"):
            srcs = ops
        used = {int(r) for s in srcs for r in REG.findall(s)}
        if loaded & used:
            break
        if is_load(op):
            n = load_bytes(op)
            first = REG.findall(ops[0]) if ops else []
            if first:
                r0 = int(first[0])
                loaded |= set(range(r0, r0 + max(1, n // 4)))
            total += n
    return total


def analyse_pass(insns, loads_per_group):
    bmap = blocks_of(insns)
    loops = loops_of(bmap)
    best = None
    for h, body, latches in loops:
        n128 = sum(1 for s in body for i in bmap[s]["insns"] if is_load(i[2]) and load_bytes(i[2]) == 16)
        nld = sum(1 for s in body for i in bmap[s]["insns"] if is_load(i[2]))
        key = (n128, nld, len(body))
        if best is None or key > best[0]:
            best = (key, h, body, latches)
    if best is None:
        return None
    _, h, body, latches = best
    path = hot_path(bmap, h, body, latches)
    path_insns = [i for s in path for i in bmap[s]["insns"]]
    n = sum(1 for i in path_insns if counted(i))
    loads = [i for i in path_insns if is_load(i[2])]
    groups = sum(load_bytes(i[2]) for i in loads) / 16.0 / loads_per_group
    elements = max(groups * 4.0, 1.0)
    local = sum(1 for s in body for i in bmap[s]["insns"] if i[2].startswith(("STL", "LDL")))
    static = sum(1 for s in body for i in bmap[s]["insns"] if counted(i))
    return {
        "instr": n,
        "elements": elements,
        "per_elem": n / elements,
        "static": static,
        "local": local,
        "thread_bytes": inflight_bytes(path_insns),
        "load_bytes": sum(load_bytes(i[2]) for i in loads),
    }


def acceptance_chain(insns):
    """Instructions of one acceptance test (probe specula_probe_accept: its Philox block, the
    two probability loads and the binary64 comparison; straight-line code)."""
    return sum(1 for i in insns if counted(i))


def row_loops(insns):
    """The innermost loops with 128-bit loads (the row loops) of a function: how many, and the
    local-memory (spill) instructions on their hot paths and in their cold regions.

    Not checked: the half rows' loops (8-byte loads) and the half-row blocks inside the binary32
    loops (cold to `hot_path`). Taking every loop with 8-byte loads, tried 2026-12-07, also takes
    loops that read no row (the split entries' 41 and the tree entries' 14-16 "row loops" on
    sm_90, among them the tree's 622-block node loop), so a sound check needs the row loops
    named, not guessed from their loads (docs/PERFORMANCE.md, "A gap in the report")."""
    bmap = blocks_of(insns)
    loops = [
        (h, body, latches)
        for h, body, latches in loops_of(bmap)
        if any(is_load(i[2]) and load_bytes(i[2]) == 16 for s in body for i in bmap[s]["insns"])
    ]
    inner = [(h, b, l) for h, b, l in loops if not any(b2 < b for _h2, b2, _l2 in loops)]
    hot = cold = 0
    for h, body, latches in inner:
        path = set(hot_path(bmap, h, body, latches))
        for s in body:
            n = sum(1 for i in bmap[s]["insns"] if i[2].startswith(("STL", "LDL")))
            if s in path:
                hot += n
            else:
                cold += n
    return len(inner), hot, cold


# ---------------------------------------------------------------- the model
def occupancy(regs, threads=256):
    """Blocks of `threads` per SM that the registers allow (allocation: 8 registers per thread
    granule, whole warps)."""
    per_warp = math.ceil(regs * 32 / 256) * 256
    warps = threads // 32
    by_regs = REGS_PER_SM // (per_warp * warps)
    return max(0, min(by_regs, MAX_WARPS_SM // warps, MAX_BLOCKS_SM))


def model(method, scenario, batch, figs, kregs, split=1, latency=LATENCY):
    """Predicted kernel time (s) for `batch` requests, k = K, V = VOCAB.

    One block of 256 threads per request and row slice (`split` slices, 1 today). Per request
    the passes run one after another (each starts with one memory latency and ends with its
    block reductions). The rows of all requests stream at the rate

        min(HBM_BW, active SMs x per-SM rate),
        per-SM rate = min(SM_CAP, bytes in flight per SM / latency,
                          issue rate per SM x issue efficiency x bytes per element / instr per element)

    where bytes in flight per SM = per-thread bytes in flight x 256 x resident blocks (occupancy of
    the real kernel's registers, and no more blocks than the batch gives that SM), an iteration's
    compute time = its instructions x ALU_LAT / ILP cycles (a warp does not overlap its own loads
    with its compute unless the code issues them ahead), and issue efficiency =
    min(1, warps per scheduler x ILP / ALU_LAT). The acceptance tests of rejection
    sampling each cost two dependent loads and a Philox chain, one after another (k of them)."""
    passes = []  # (pass name, rows)
    serial = 0.0
    if method == "greedy":
        passes = [("argmax", K + 1)]
    elif method == "typical":
        passes = [("entropy", K), ("race", 1)]
    elif scenario == "all accepted":
        passes = [("race", 1)]
        serial += K * (2 * latency + figs["accept_chain"] * ALU_LAT / CLOCK)
    else:  # rejected at the first position: residual race over target and draft rows
        passes = [("residual", 1)]
        serial += 2 * latency + figs["accept_chain"] * ALU_LAT / CLOCK
    occ = occupancy(kregs)
    blocks = batch * split
    active = min(blocks, SMS)
    resident = min(occ, math.ceil(blocks / SMS))
    t = LAUNCH + serial
    total_bytes = 0
    for name, rows in passes:
        f = figs[name]
        nbytes = batch * rows * VOCAB * PASSES[name][2]
        total_bytes += nbytes
        inflight = f["thread_bytes"] * 256 * resident
        warps_sched = 8 * resident / SCHEDULERS
        eff = min(1.0, warps_sched * ILP / ALU_LAT)
        issue = ISSUE / SMS * eff * PASSES[name][2] / f["per_elem"]
        # A warp waits for its loads, then computes its iteration (loads not issued ahead of
        # that compute wait a full latency again): one iteration = latency + compute time.
        compute = f["instr"] * ALU_LAT / ILP / CLOCK
        per_sm = min(SM_CAP, inflight / (latency + compute), issue)
        rate = min(HBM_BW, active * per_sm)
        waves = math.ceil(blocks / (SMS * occ)) if occ else 1
        reductions = 2 if name in ("race", "residual") else 1
        t += nbytes / rate + rows * (latency + reductions * REDUCE) * waves
    copy = LAUNCH + 2 * total_bytes / HBM_BW  # device-to-device copy of the same bytes
    return t, copy / t, total_bytes


def slices_for(batch):
    """Blocks per request as specula-cuda launches (CudaVerifier::slices_for)."""
    return 1 if batch >= SMS else min(math.ceil(2 * SMS / batch), MAX_SLICES)


def model_split(method, scenario, batch, figs, kregs, latency=LATENCY):
    """The same model for the split entry (specula_verify_split, core/src/gpu/kernels.rs "Rows
    split across blocks"): S = slices_for(batch) blocks per request, each
    streaming its slice of every row the request may need, all rows of a request at once (no
    chain of passes): greedy reads rows 0..k (argmax), typical rows 0..k (entropy of 0..k-1 and,
    speculatively, the race of every row), rejection the acceptance tests in parallel (two
    latencies), then the bonus row or the residual row pair and the plain race of its target
    row (the fallback, in the same launch). A
    block's partial results combine with atomics; the last block by ticket finishes the request:
    about three more latencies."""
    split = slices_for(batch)
    if method == "greedy":
        work = [("argmax", K + 1, figs["argmax"]["per_elem"])]
    elif method == "typical":
        both = figs["entropy"]["per_elem"] + figs["race"]["per_elem"]
        work = [("entropy", K, both), ("race", 1, figs["race"]["per_elem"])]
    elif scenario == "all accepted":
        work = [("race", 1, figs["race"]["per_elem"])]
    else:
        # The residual race and, in the same launch, the plain race over the target row (the
        # fallback; its row is read again, counted here as if from HBM).
        work = [("residual", 1, figs["residual"]["per_elem"]), ("race", 1, figs["race"]["per_elem"])]
    serial = 2 * latency + figs["accept_chain"] * ALU_LAT / CLOCK if method == "rejection" else 0.0
    occ = occupancy(kregs)
    blocks = batch * split
    active = min(blocks, SMS)
    resident = min(occ, math.ceil(blocks / SMS))
    t = LAUNCH + serial + latency + 3 * latency + 2 * REDUCE
    total_bytes = 0
    for name, rows, per_elem in work:
        f = figs[name]
        nbytes = batch * rows * VOCAB * PASSES[name][2]
        total_bytes += nbytes
        inflight = f["thread_bytes"] * 256 * resident
        eff = min(1.0, 8 * resident / SCHEDULERS * ILP / ALU_LAT)
        issue = ISSUE / SMS * eff * PASSES[name][2] / per_elem
        compute = f["instr"] * ALU_LAT / ILP / CLOCK
        per_sm = min(SM_CAP, inflight / (latency + compute), issue)
        t += nbytes / min(HBM_BW, active * per_sm)
    copy = LAUNCH + 2 * total_bytes / HBM_BW
    return t, copy / t, split


# ---------------------------------------------------------------- report
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", action="append", help="sm_80, sm_90 (default both)")
    ap.add_argument("--markdown", action="store_true", help="print the prediction table as markdown")
    ap.add_argument("--kernel-cache", help="read the shipped kernel's ptxas report from this folder "
                    "(SPECULA_KERNEL_CACHE of the NVRTC test) instead of compiling it again")
    args = ap.parse_args()
    archs = args.arch or ["sm_80", "sm_90"]
    failures = []
    with tempfile.TemporaryDirectory() as work:
        results = {}
        for arch in archs:
            probe_log, kernel_log, sass = build(arch, work, args.kernel_cache)
            figs = {}
            for name, (entry, lpg, _b) in PASSES.items():
                if entry not in sass:
                    die(f"{arch}: probe {entry} missing from the SASS", 1)
                a = analyse_pass(sass[entry], lpg)
                if a is None:
                    die(f"{arch}: no loop found in {entry}", 1)
                a.update(probe_log.get(entry, {}))
                figs[name] = a
            figs["accept_chain"] = acceptance_chain(sass.get("specula_probe_accept", []))
            kern = dict(kernel_log.get("specula_verify", {}))
            kern["row_loops"], kern["row_local"], kern["row_local_cold"] = row_loops(
                sass.get("specula_verify", []))
            split = dict(kernel_log.get("specula_verify_split", {}))
            split["row_loops"], split["row_local"], split["row_local_cold"] = row_loops(
                sass.get("specula_verify_split", []))
            kern["split"] = split
            # The logits entries (the engine inputs), reported beside the plain ones.
            kern["ex"] = {}
            for entry in ("specula_verify_logits", "specula_verify_split_logits"):
                e = dict(kernel_log.get(entry, {}))
                e["row_loops"], e["row_local"], e["row_local_cold"] = row_loops(sass.get(entry, []))
                kern["ex"][entry] = e
            # The tree entries, held to no spill on a row loop's hot path as the chain's are.
            tree_log, tree_sass = build_tree(arch, work)
            kern["tree"] = {}
            for entry in ("specula_verify_tree", "specula_verify_tree_half"):
                e = dict(tree_log.get(entry, {}))
                e["row_loops"], e["row_local"], e["row_local_cold"] = row_loops(tree_sass.get(entry, []))
                kern["tree"][entry] = e
            results[arch] = (figs, kern)

        for arch, (figs, kern) in results.items():
            occ = occupancy(kern.get("regs", 255))
            print(f"\n== {arch}: specula_verify: {kern.get('regs')} registers, "
                  f"{kern.get('spill_st', 0)}+{kern.get('spill_ld', 0)} spill bytes, "
                  f"{kern.get('stack', 0)} B stack; {occ} blocks of 256 per SM "
                  f"({occ * 8} of {MAX_WARPS_SM} warps); {kern['row_loops']} row loops, "
                  f"{kern['row_local']} local-memory instructions on their hot paths, "
                  f"{kern['row_local_cold']} in their cold regions")
            if kern["row_local"]:
                failures.append(f"{arch}: specula_verify spills on a row loop's hot path")
            sp = kern["split"]
            print(f"   {arch}: specula_verify_split: {sp.get('regs')} registers, "
                  f"{sp.get('spill_st', 0)}+{sp.get('spill_ld', 0)} spill bytes; "
                  f"{sp['row_loops']} row loops, {sp['row_local']} local-memory instructions on "
                  f"their hot paths, {sp['row_local_cold']} in their cold regions")
            if sp["row_local"]:
                failures.append(f"{arch}: specula_verify_split spills on a row loop's hot path")
            for entry, e in kern["ex"].items():
                print(f"   {arch}: {entry}: {e.get('regs')} registers, "
                      f"{e.get('spill_st', 0)}+{e.get('spill_ld', 0)} spill bytes; "
                      f"{e['row_loops']} row loops, {e['row_local']} local-memory instructions on "
                      f"their hot paths, {e['row_local_cold']} in their cold regions")
                if not e["row_loops"]:
                    failures.append(f"{arch}: {entry} missing or without row loops")
                if e["row_local"]:
                    failures.append(f"{arch}: {entry} spills on a row loop's hot path")
            for entry, e in kern["tree"].items():
                print(f"   {arch}: {entry}: {e.get('regs')} registers, "
                      f"{e.get('spill_st', 0)}+{e.get('spill_ld', 0)} spill bytes; "
                      f"{e['row_loops']} row loops, {e['row_local']} local-memory instructions on "
                      f"their hot paths, {e['row_local_cold']} in their cold regions")
                if not e["row_loops"]:
                    failures.append(f"{arch}: {entry} missing or without row loops")
                if e["row_local"]:
                    failures.append(f"{arch}: {entry} spills on a row loop's hot path")
            # The logits and filter passes run in the one-block logits entry, at its own
            # occupancy (its launch bounds allow fewer blocks per SM than specula_verify's).
            lg = kern["ex"].get("specula_verify_logits", {})
            occ_lg = occupancy(lg.get("regs", 255))

            def blocks_of(name):
                return occ_lg if name in LOGITS_PASSES else occ

            print(f"   {arch}: bytes in flight per SM at {occ} blocks (specula_verify's passes), "
                  f"{occ_lg} (the logits and filter passes: specula_verify_logits)")
            print(f"{'pass':<10}{'instr/elt':>10}{'(path/elts)':>14}{'loop insns':>11}{'regs':>6}"
                  f"{'spill':>7}{'local':>7}{'B/thread':>10}{'KB/SM':>8}  budget")
            for name in PASSES:
                f = figs[name]
                per_sm = f["thread_bytes"] * 256 * blocks_of(name)
                spill = f.get("spill_st", 0) + f.get("spill_ld", 0)
                budget = BUDGET[name]
                ok = budget is None or f["per_elem"] <= budget
                verdict = "(no budget yet)" if budget is None else (
                    f"<= {budget:.0f} {'ok' if ok else 'EXCEEDED'}")
                print(f"{name:<10}{f['per_elem']:>10.1f}{f['instr']:>8}/{f['elements']:<5.0f}"
                      f"{f['static']:>11}{f.get('regs', 0):>6}{spill:>7}{f['local']:>7}"
                      f"{f['thread_bytes']:>10}{per_sm / 1024:>8.1f}  {verdict}")
                if not ok:
                    failures.append(f"{arch}: {name} {f['per_elem']:.1f} instr/element > {BUDGET[name]}")
                if spill or f["local"]:
                    failures.append(f"{arch}: {name} spills / local memory in the hot loop")
            print(f"acceptance test: Philox chain of {figs['accept_chain']} instructions per test, "
                  f"{K} tests one after another in specula_verify, at once in specula_verify_split")
            worst = max(figs[n]["per_elem"] for n in PASSES if BUDGET[n] is not None)
            kb = min(figs[n]["thread_bytes"] * 256 * blocks_of(n) for n in PASSES)
            print(f"issue 17 targets: <= {TARGET_INSTR:.0f} instr/element in every pass: "
                  f"{'MET' if worst <= TARGET_INSTR else 'NOT MET'} (worst {worst:.1f}); "
                  f">= {TARGET_INFLIGHT // 1024} KB in flight per SM: "
                  f"{'MET' if kb >= TARGET_INFLIGHT else 'NOT MET'} (least {kb / 1024:.1f} KB)")
            worst_lg = max(figs[n]["per_elem"] for n in LOGITS_PASSES)
            hot_local = sum(e["row_local"] for e in kern["ex"].values())
            print(f"issue 30 targets: <= {TARGET_INSTR_LOGITS:.0f} instr/element in the logits and "
                  f"filter passes: {'MET' if worst_lg <= TARGET_INSTR_LOGITS else 'NOT MET'} "
                  f"(worst {worst_lg:.1f}); no spill in a row loop's hot path of the logits "
                  f"entries: {'MET' if hot_local == 0 else 'NOT MET'} ({hot_local} local-memory "
                  f"instructions; checked: the loops with 128-bit loads, not the half rows' "
                  f"8-byte ones, docs/PERFORMANCE.md)")

        arch = "sm_90" if "sm_90" in results else archs[-1]
        figs, kern = results[arch]
        print(f"\n== PREDICTIONS of the model (not measurements), one block per request "
              f"(specula_verify): H200, {arch} code, V = {VOCAB}, "
              f"k = {K}, rows in HBM ({LATENCY * 1e9:.0f} ns); batch 1 also with rows in L2 "
              f"({L2_LATENCY * 1e9:.0f} ns)")
        rows = []
        for method, scenario in (("greedy", "all accepted"), ("typical", "all accepted"),
                                 ("rejection", "all accepted"), ("rejection", "rejected at j=0")):
            cells = []
            for b in BATCHES:
                t, frac, _ = model(method, scenario, b, figs, kern.get("regs", 255))
                cells.append(f"{t * 1e6:.0f} µs, {frac:.2f}× copy")
            t1, _, _ = model(method, scenario, 1, figs, kern.get("regs", 255), latency=L2_LATENCY)
            rows.append((f"{method} ({scenario})", cells, f"{t1 * 1e6:.0f} µs"))
        if args.markdown:
            print("| method | " + " | ".join(f"batch {b}" for b in BATCHES) + " | batch 1, L2 |")
            print("|---|" + "---|" * (len(BATCHES) + 1))
            for name, cells, l2 in rows:
                print(f"| {name} | " + " | ".join(cells) + f" | {l2} |")
        else:
            for name, cells, l2 in rows:
                print(f"{name:<32}" + "".join(f"{c:>22}" for c in cells) + f"   L2: {l2}")
        print("\n== PREDICTIONS as specula-cuda launches (rows split over S blocks per request "
              "below one request per SM: specula_verify_split, its own registers):")
        sregs = kern["split"].get("regs", 255)
        for method, scenario in (("greedy", "all accepted"), ("typical", "all accepted"),
                                 ("rejection", "all accepted"), ("rejection", "rejected at j=0")):
            cells = []
            for b in BATCHES:
                if slices_for(b) > 1:
                    t, frac, split = model_split(method, scenario, b, figs, sregs)
                else:
                    (t, frac, _), split = model(method, scenario, b, figs, kern.get("regs", 255)), 1
                cells.append(f"{t * 1e6:.0f} µs, {frac:.2f}× (S={split})")
            name = f"{method} ({scenario})"
            if args.markdown:
                print(f"| {name} | " + " | ".join(cells) + " |")
            else:
                print(f"{name:<32}" + "".join(f"{c:>26}" for c in cells))

    if failures:
        print("\nFAIL:\n  " + "\n  ".join(failures))
        return 1
    print("\nbudgets hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
