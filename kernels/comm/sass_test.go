package comm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// The SASS audit reads what ptxas (inside NVRTC) made of each kernel with the
// CUDA toolkit's cuobjdump, which needs no GPU, and holds the properties the
// kernels' comments claim and a GPU would only show as slowness or a launch
// failure: no local memory (no register spills, per-lane arrays kept in
// registers), registers that fit the largest block each kernel is launched
// with, 16-byte global loads and stores in the row kernels, and the warp
// reductions compiled to REDUX. .ci/run fetches cuobjdump from Debian's
// nvidia-cuda-toolkit package.

// sassKernel is one kernel of a cubin: its resources (cuobjdump -res-usage)
// and how often each SASS opcode occurs in it (cuobjdump -sass).
type sassKernel struct {
	regs, stack, local, shared int
	ops                        map[string]int // opcode with its modifiers, e.g. "LDG.E.128"
	seq                        []string       // the opcodes in program order
}

// kernelBlock is the largest block (threads) each kernel is launched with.
var kernelBlock = map[string]int{
	"router_topk":   32 * device.RouterWarps,
	"permute_order": device.OrderBlock,
	"permute_rows":  device.RowBlockMax,
	"gather_f32":    device.FlatBlock,
	"sort_chunks":   device.RowBlockMax,
	"swiglu_prob":   device.FlatBlock,
	"unpermute_sum": device.RowBlockMax,
	"comm_test":     CommTestBlock,
	"copy_u4":       device.FlatBlock,
	"copy_rows_u32": device.FlatBlock,
	// the backward's
	"swiglu_prob_bwd": device.FlatBlock,
	"score_backward":  32 * device.RouterWarps,
	"input_grad":      device.FlatBlock,
	"add_f32":         device.FlatBlock,
	// dispatchers/deepep's: layout, notify, permute; dispatch and combine
	// with its default 16 warps
	"deepep_layout":       256,
	"deepep_notify":       128,
	"deepep_permute":      512,
	"deepep_dispatch":     512,
	"deepep_combine":      512,
	"deepep_combine_bwd":  512,
	"fifo_test":           32 * fifoWarps,
	"he_allgather":        128,
	"he_preprocess":       256,
	"he_preprocess_count": 256,
	"he_pack":             128,
	"he_dispatch":         128,
	"he_permute":          128,
	"he_combine":          192,
	// hybridep's backward forms (the same bodies, template BWD)
	"he_pack_bwd":     128,
	"he_dispatch_bwd": 128,
	"he_permute_bwd":  128,
	"he_combine_bwd":  192,
	// fp8.cu's
	"quant_fp8_1x128":   kernels.FP8KernelBlock,
	"quant_mxfp8":       kernels.FP8KernelBlock,
	"dequant_fp8_1x128": kernels.FP8KernelBlock,
	"quant_fp8_rows":    kernels.FP8KernelBlock,
	"dequant_fp8_rows":  kernels.FP8KernelBlock,
	"fp8_rows_lt":       kernels.FP8KernelBlock,
	"quant_fp8_lt":      kernels.FP8KernelBlock,
	"amax_fp8_tensor":   kernels.FP8KernelBlock,
	"quant_fp8_tensor":  kernels.FP8KernelBlock,
}

// bulkExpected, set in a compile's constants, says that the bulk-copy path
// was compiled (sm_90 by NVRTC ≥ 12): its kernels must use bulk copies
// (UBLKCP: global→shared .S.G, shared→global .G.S); otherwise their FIFO
// rows move as 16-byte accesses.
const bulkExpected = "moebench.bulk"

// fifoKernels are the kernels that move rows through moebench.cuh's FIFO,
// with the directions of their bulk copies (.S.G global→shared, .G.S
// shared→global); on the 16-byte path they load and store rows as
// 16-byte accesses, global and shared.
var fifoKernels = map[string][]string{"fifo_test": {".S.G", ".G.S"}, "he_dispatch": {".S.G", ".G.S"}, "he_combine": {".S.G"},
	"he_dispatch_bwd": {".S.G", ".G.S"}, "he_combine_bwd": {".S.G"}}

// cuobjdump finds the tool (MOEBENCH_CUOBJDUMP, else the path) or returns "";
// where the GPU-free kernel checks are required (MOEBENCH_REQUIRE_NVRTC=1,
// CI) a missing tool fails the test.
func cuobjdump(t *testing.T) string {
	p := os.Getenv("MOEBENCH_CUOBJDUMP")
	if p == "" {
		p, _ = exec.LookPath("cuobjdump")
	}
	if p == "" && os.Getenv("MOEBENCH_REQUIRE_NVRTC") == "1" {
		t.Fatal("cuobjdump required for the SASS audit (MOEBENCH_CUOBJDUMP or the path)")
	}
	return p
}

var (
	resFunc = regexp.MustCompile(`^\s*Function (\w+):`)
	resKV   = regexp.MustCompile(`\b(REG|STACK|SHARED|LOCAL):(\d+)`)
	sassFn  = regexp.MustCompile(`^\s*Function : (\w+)`)
	sassOp  = regexp.MustCompile(`^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)`)
)

// readSASS runs cuobjdump on cubin and returns its kernels by name, with
// their opcodes if opcodes is set (cuobjdump -sass takes half a second a
// cubin; -res-usage is instant).
func readSASS(tool string, cubin []byte, opcodes bool) (map[string]*sassKernel, error) {
	tmp, err := os.CreateTemp("", "moebench-sass-*.cubin")
	if err != nil {
		return nil, err
	}
	f := tmp.Name()
	defer os.Remove(f)
	_, err = tmp.Write(cubin)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	ks := map[string]*sassKernel{}
	kernel := func(name string) *sassKernel {
		if ks[name] == nil {
			ks[name] = &sassKernel{ops: map[string]int{}}
		}
		return ks[name]
	}
	run := func(flag string, line func(string, *sassKernel) *sassKernel) error {
		out, err := exec.Command(tool, flag, f).CombinedOutput()
		if err != nil {
			return fmt.Errorf("cuobjdump %s: %v\n%s", flag, err, out)
		}
		var k *sassKernel
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			k = line(sc.Text(), k)
		}
		return nil
	}
	err = run("-res-usage", func(l string, k *sassKernel) *sassKernel {
		if m := resFunc.FindStringSubmatch(l); m != nil {
			return kernel(m[1])
		}
		if k != nil {
			for _, m := range resKV.FindAllStringSubmatch(l, -1) {
				switch v := atoi(m[2]); m[1] {
				case "REG":
					k.regs = v
				case "STACK":
					k.stack = v
				case "SHARED":
					k.shared = v
				case "LOCAL":
					k.local = v
				}
			}
		}
		return k
	})
	if err == nil && opcodes {
		err = run("-sass", func(l string, k *sassKernel) *sassKernel {
			if m := sassFn.FindStringSubmatch(l); m != nil {
				return kernel(m[1])
			}
			if m := sassOp.FindStringSubmatch(l); m != nil && k != nil {
				k.ops[m[1]]++
				k.seq = append(k.seq, m[1])
			}
			return k
		})
	}
	if err == nil && len(ks) == 0 {
		err = fmt.Errorf("cuobjdump found no kernel in the cubin")
	}
	return ks, err
}

// has counts the opcodes of k that start with prefix and contain every part.
func (k *sassKernel) has(prefix string, parts ...string) int {
	n := 0
outer:
	for op, c := range k.ops {
		if !strings.HasPrefix(op, prefix) {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(op, p) {
				continue outer
			}
		}
		n += c
	}
	return n
}

// auditSASS checks the kernels of one compiled file (constants d), their
// opcodes too if opcodes is set: it returns one line per kernel for the log
// and what breaks the rules.
func auditSASS(tool string, cubin []byte, d map[string]string, opcodes bool) (lines, problems []string, err error) {
	ks, err := readSASS(tool, cubin, opcodes)
	if err != nil {
		return nil, nil, err
	}
	lines, problems = auditKernels(ks, d, opcodes)
	return lines, problems, nil
}

// auditKernels is auditSASS on kernels already read (readSASS, with their
// opcodes if opcodes is set).
func auditKernels(ks map[string]*sassKernel, d map[string]string, opcodes bool) (lines, problems []string) {
	names := make([]string, 0, len(ks))
	for name := range ks {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		k := ks[name]
		bad := func(format string, a ...any) { problems = append(problems, name+": "+fmt.Sprintf(format, a...)) }
		lines = append(lines, fmt.Sprintf("%s: %d registers, %d B shared", name, k.regs, k.shared))
		block, ok := kernelBlock[name]
		if !ok {
			bad("no launch block size in kernelBlock")
			continue
		}
		if k.regs == 0 { // every kernel uses registers: the output was not understood
			bad("no register count read (cuobjdump -res-usage)")
		}
		if k.local != 0 || k.stack != 0 {
			bad("local memory (%d B local, %d B stack): spills or arrays not kept in registers", k.local, k.stack)
		}
		// 64 Ki 32-bit registers per SM on sm_80 and sm_90, allocated in
		// units of 8 per thread (256 per warp)
		if r := (k.regs + 7) / 8 * 8; r*block > 64*1024 {
			bad("%d registers × %d threads exceed the SM's 64 Ki: the launch would fail", k.regs, block)
		}
		if !opcodes {
			continue
		}
		if len(k.ops) == 0 {
			bad("no SASS read")
		}
		vec16 := name == "permute_rows" || name == "copy_u4" || name == "sort_chunks" || name == "unpermute_sum" ||
			name == "input_grad" || name == "add_f32" || fp8Vec16[name] || (name == "swiglu_prob" || name == "swiglu_prob_bwd") && atoi(d["MB_FFN"])%8 == 0
		if vec16 && (k.has("LDG.E", ".128") == 0 || k.has("STG.E", ".128") == 0) {
			bad("no 16-byte global load or store (LDG/STG .128); it has %s", k.list("LDG", "STG"))
		}
		// loads through const __restrict__ pointers may take the read-only
		// path (LDG.CONSTANT) and be hoisted past the kernel's stores
		if name == "permute_order" && (k.has("LDG.E") == 0 || k.has("LDG.E") != k.has("LDG.E", "CONSTANT")) {
			bad("its loads of idx are not all read-only (LDG...CONSTANT: const __restrict__): %s", k.list("LDG"))
		}
		// every load of an item (gate, up and the probability) issued before
		// its math begins (the first MUFU, expf's EX2), in each of the
		// kernel's loops (code between EXITs)
		if name == "swiglu_prob" {
			math := -1
			for i, op := range k.seq {
				switch {
				case strings.HasPrefix(op, "EXIT"):
					math = -1
				case strings.HasPrefix(op, "MUFU") && math < 0:
					math = i
				case strings.HasPrefix(op, "LDG") && math >= 0:
					bad("a global load (%s, instruction %d) issued after the math began (a MUFU at %d)", op, i, math)
					math = -1
				}
			}
			if k.has("MUFU") == 0 {
				bad("no MUFU (expf) found")
			}
		}
		// deepep's rows move through peers' memory at generic addresses
		// (LD/ST) or through L2 (LDG .STRONG.GPU, ld.global.cg)
		if (name == "deepep_dispatch" || name == "deepep_combine" || name == "deepep_combine_bwd") && (k.has("LDG.E", ".128")+k.has("LD.E", ".128") == 0 || k.has("STG.E", ".128")+k.has("ST.E", ".128") == 0) {
			bad("no 16-byte load or store of a row; it has %s", k.list("LD", "ST"))
		}
		if dirs, ok := fifoKernels[name]; ok {
			for _, dir := range dirs {
				if d[bulkExpected] == "1" && k.has("UBLKCP", dir) == 0 {
					bad("the bulk-copy path has no bulk copy UBLKCP%s; it has %s", dir, k.list("UBLKCP", "UTMA", "LDG", "STG"))
				}
			}
			// rows in global memory are reached through generic pointers
			// (peers' memory too): LD/ST .128, or LDG/STG .128
			ld, st := k.has("LDG.E", ".128")+k.has("LD.E", ".128"), k.has("STG.E", ".128")+k.has("ST.E", ".128")
			if d[bulkExpected] != "1" && (ld == 0 || k.has("STS", ".128") == 0 || k.has("LDS", ".128") == 0 || st == 0) {
				bad("the 16-byte path does not move rows as 16-byte accesses (LD[G]/STS/LDS/ST[G] .128); it has %s", k.list("LD", "ST"))
			}
		}
		if (name == "router_topk" || name == "permute_order") && k.has("REDUX") == 0 {
			bad("the warp reductions did not compile to REDUX; it has %s", k.list("REDUX", "SHFL", "VOTE"))
		}
	}
	return lines, problems
}

// list names k's opcodes that start with one of prefixes, with their counts.
func (k *sassKernel) list(prefixes ...string) string {
	var l []string
	for op, c := range k.ops {
		for _, p := range prefixes {
			if strings.HasPrefix(op, p) {
				l = append(l, fmt.Sprintf("%s×%d", op, c))
				break
			}
		}
	}
	if len(l) == 0 {
		return "none of " + strings.Join(prefixes, ", ")
	}
	sort.Strings(l)
	return strings.Join(l, " ")
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

// TestSASSAuditCatches shows the audit failing on kernels that break its
// rules: a dynamically indexed array (local memory), scalar copies where 16-byte
// ones are due, and a block too large for the kernel's registers.
func TestSASSAuditCatches(t *testing.T) {
	tool := cuobjdump(t)
	if tool == "" {
		t.Skip("no cuobjdump")
	}
	n := nvrtc(t)
	bad := map[string]string{
		"permute_rows": `extern "C" __global__ void permute_rows(const bf16 *s, const int32 *r, int div, int n, bf16 *d) {
			for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[r[i] / div]; }`,
		"router_topk": `extern "C" __global__ void router_topk(const float *l, const int *which, float *o) {
			float a[256];
			for (int i = 0; i < 256; i++) a[i] = l[i * blockDim.x + threadIdx.x];
			a[which[threadIdx.x] & 255] = 0.f;
			o[threadIdx.x] = a[which[threadIdx.x + 32] & 255] + (float)__reduce_max_sync(0xffffffffu, threadIdx.x); }`,
		// 160 loaded values live across a store that may alias them
		"permute_order": `extern "C" __global__ void permute_order(const float *x, float *o) {
			float a[160];
			#pragma unroll
			for (int i = 0; i < 160; i++) a[i] = x[i * blockDim.x + threadIdx.x];
			o[threadIdx.x] = 0.f;
			float s = 0.f;
			#pragma unroll
			for (int i = 0; i < 160; i++) s += a[i] * x[i];
			o[threadIdx.x] = s + (float)__reduce_add_sync(0xffffffffu, threadIdx.x); }`,
	}
	want := map[string]string{"permute_rows": "16-byte", "router_topk": "local memory", "permute_order": "exceed the SM"}
	for name, src := range bad {
		t.Run(name, func(t *testing.T) {
			cubin, err := n.Compile(name+".cu", "typedef unsigned short bf16; typedef int int32;\n"+src, nil, []string{"--gpu-architecture=sm_90"})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			lines, problems, err := auditSASS(tool, cubin, nil, true)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !strings.Contains(strings.Join(problems, "\n"), want[name]) {
				t.Errorf("%s (%v): audit said %q, want a failure about %q", name, lines, problems, want[name])
			}
		})
	}
}
