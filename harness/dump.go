package harness

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// dumpFile is one entry of the dump's index.json.
type dumpFile struct {
	File  string `json:"file"`
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	About string `json:"about"`
}

// Dump writes the layer's input, weights, routing and output to dir as .npy
// files (bf16 values widened to float32; indices int32) with an index.json
// describing each file and the layout conventions. dir must not exist or be
// empty (CheckDump). Files are written into a temporary sibling directory
// that is renamed to dir at the end (over dir when it is an empty directory),
// so a failure leaves nothing half-written at dir, and nothing else is ever
// removed.
func Dump(dir string, l *layer.Layer, rec *results.Record) error {
	if err := CheckDump(dir); err != nil {
		return fmt.Errorf("--dump %s: %w", dir, err)
	}
	parent := filepath.Dir(filepath.Clean(dir))
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("--dump %s: %w", dir, err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	c := l.Cfg
	n, h, f, E, k := c.EP*c.Tokens, c.Hidden, c.FFN, c.Experts, c.TopK
	var index []dumpFile
	add := func(name string, shape []int, data any, about string) error {
		d, err := writeNpy(filepath.Join(tmp, name), shape, data)
		if err != nil {
			return err
		}
		index = append(index, dumpFile{name, d, shape, about})
		return nil
	}
	var x, y, probs []float32
	var idx []int32
	for r, rk := range l.Ranks {
		x, y = append(x, l.X[r]...), append(y, rk.Y...)
		idx, probs = append(idx, rk.Idx...), append(probs, rk.Probs...)
	}
	steps := []func() error{
		func() error {
			return add("x.npy", []int{n, h}, x, "layer input; rows are rank-major: row r·tokens+t is token t of rank r")
		},
		func() error {
			return add("router_weight.npy", []int{E, h}, l.Wr, "router weight Wr; logits = x · Wrᵀ (fp32)")
		},
		func() error {
			return add("fc1.npy", []int{E, 2 * f, h}, perExpert{l, 0}, "expert fc1 weights [out,in]; rows 0..ffn-1 gate, ffn..2ffn-1 up")
		},
		func() error { return add("fc2.npy", []int{E, h, f}, perExpert{l, 1}, "expert fc2 weights [out,in]") },
		func() error {
			return add("routing_idx.npy", []int{n, k}, idx, "chosen global expert of each token copy; expert e lives on rank e / (experts/ep)")
		},
		func() error {
			return add("routing_probs.npy", []int{n, k}, probs, "routing probability of each copy (fp32), applied after SwiGLU, before fc2")
		},
		func() error {
			return add("output.npy", []int{n, h}, y, "layer output: Σ_k fc2_e(p·silu(gate)·up) (+ shared expert), bf16")
		},
	}
	if l.Bias != nil {
		steps = append(steps, func() error {
			return add("router_bias.npy", []int{E}, l.Bias, "sigmoid router's per-expert selection bias (used for selection only)")
		})
	}
	if l.SharedFC1 != nil {
		fs := f * c.SharedExperts
		steps = append(steps,
			func() error {
				return add("shared_fc1.npy", []int{2 * fs, h}, l.SharedFC1, "shared expert fc1 [out,in], gate then up")
			},
			func() error {
				return add("shared_fc2.npy", []int{h, fs}, l.SharedFC2, "shared expert fc2 [out,in]; no probability")
			})
	}
	if l.Override[0] != nil {
		steps = append(steps, func() error {
			return add("router_logits_override.npy", []int{n, E}, concat(l.Override),
				"routing "+c.Routing.String()+": these logits replace x·Wrᵀ before the score function and top-k")
		})
	}
	notes := []string{
		"all float32 arrays hold bf16 values exactly (widened); compute in float32 or float64",
		"router: " + routerNote(c),
		"per copy: y = fc2 · (p · silu(fc1_gate · x) ⊙ (fc1_up · x)); output row = Σ over the token's k copies (+ shared expert, which has no p)",
	}
	if l.Grads != nil {
		steps = append(steps, dumpGrads(l, add)...)
		notes = append(notes, "training step: the grad_*.npy files are the gradients of Σ dout · output (dout.npy, drawn from the seed) with respect to each input, "+
			"as the layer computed them: bf16 where Megatron's bf16 training stores them (input, router weight), fp32 where it keeps fp32 (probabilities, "+
			"the experts' and shared expert's weight gradients: main_grad); rounding points B1–B8 of kernels/BACKWARD.md")
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return fmt.Errorf("--dump %s: %w", dir, err)
		}
	}
	meta := map[string]any{"config": rec.Config, "status": rec.Status, "files": index, "notes": notes, "routing": dumpRouting(l)}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(tmp, "index.json"), append(b, '\n'), 0o644)
	}
	if err != nil {
		return fmt.Errorf("--dump %s: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil { // replaces only an empty directory
		return fmt.Errorf("--dump %s: %w", dir, err)
	}
	return nil
}

// dumpRouting says whose step's routing a dump holds: per_step (drawn per
// step, or one replayed), the step, and how to get it back.
func dumpRouting(l *layer.Layer) map[string]any {
	c := l.Cfg
	about := "one routing every step (step 0's): "
	switch {
	case c.Routing.Kind == setup.RoutingNatural:
		about += "the router's own choice on the input, the same every step"
	case c.RoutingFixed:
		about += "--routing-fixed replays the first step's routing"
	}
	if c.PerStepRouting() {
		about = fmt.Sprintf("drawn per step from the seed and the step; the files hold step %d's (the last step run: warm-up steps 1..%d, then the timed ones; 0 is the check's)",
			l.RoutedStep, c.Warmup)
	}
	if c.Routing.Kind == setup.RoutingTrace && c.PerStepRouting() {
		about += "; a trace's routing continues where the step before ended"
	}
	return map[string]any{"per_step": c.PerStepRouting(), "step": l.RoutedStep, "about": about}
}

// dumpGrads are the steps that write a training step's upstream gradient
// and every gradient the layer computed.
func dumpGrads(l *layer.Layer, add func(name string, shape []int, data any, about string) error) []func() error {
	c := l.Cfg
	n, h, f, E, k := c.EP*c.Tokens, c.Hidden, c.FFN, c.Experts, c.TopK
	var dx, dprobs, fc1, fc2 []float32
	for r, rk := range l.Ranks {
		dx, dprobs = append(dx, l.Grads[r].Dx...), append(dprobs, rk.DProbs...)
		for _, w := range rk.ExpertGrads { // rank r's experts are r·L … (r+1)·L − 1
			fc1, fc2 = append(fc1, w.FC1...), append(fc2, w.FC2...)
		}
	}
	steps := []func() error{
		func() error {
			return add("dout.npy", []int{n, h}, concat(l.DOut), "upstream gradient: the gradient of the loss with respect to output.npy (bf16, N(0,1) from the seed)")
		},
		func() error {
			return add("grad_x.npy", []int{n, h}, dx, "gradient of x: through the experts (each token's copies summed), the router and the shared expert, added in that order (bf16)")
		},
		func() error {
			return add("grad_routing_probs.npy", []int{n, k}, dprobs, "gradient of each copy's routing probability (fp32)")
		},
		func() error {
			return add("grad_fc1.npy", []int{E, 2 * f, h}, fc1, "gradient of the expert fc1 weights (fp32 main_grad; all ranks' tokens)")
		},
		func() error {
			return add("grad_fc2.npy", []int{E, h, f}, fc2, "gradient of the expert fc2 weights (fp32 main_grad; all ranks' tokens)")
		},
	}
	if l.RouterGrad() {
		steps = append(steps, func() error {
			return add("grad_router_weight.npy", []int{E, h}, l.Replica.Router, "gradient of the router weight (fp32 main_grad): the sum over ranks of each rank's, rounded to bf16 first")
		})
	}
	if fs := f * c.SharedExperts; fs > 0 {
		steps = append(steps,
			func() error {
				return add("grad_shared_fc1.npy", []int{2 * fs, h}, l.Replica.Shared.FC1, "gradient of the shared expert's fc1 (fp32 main_grad; all ranks' tokens)")
			},
			func() error {
				return add("grad_shared_fc2.npy", []int{h, fs}, l.Replica.Shared.FC2, "gradient of the shared expert's fc2 (fp32 main_grad; all ranks' tokens)")
			})
	}
	return steps
}

// CheckDump tells whether Dump can write to dir: it must be an empty
// directory, or not exist in a directory where one can be created.
func CheckDump(dir string) error {
	st, err := os.Lstat(dir)
	switch {
	case err != nil: // a new directory: create one beside it, then remove it
		tmp, err := os.MkdirTemp(filepath.Dir(filepath.Clean(dir)), "."+filepath.Base(dir)+".probe-")
		if err != nil {
			return fmt.Errorf("cannot create it: %w", err)
		}
		return os.Remove(tmp)
	case st.Mode()&os.ModeSymlink != 0:
		return errors.New("is a symbolic link; give a new or empty directory")
	case !st.IsDir():
		return errors.New("exists and is not a directory; give a new or empty directory")
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return errors.New("directory is not empty; give a new or empty directory")
	}
	return nil
}

func routerNote(c setup.Config) string {
	s := "softmax over the k selected logits"
	if c.PreSoftmax {
		s = "softmax over all logits, then top-k on it; the chosen keep their softmax values (not renormalised)"
	}
	if c.Score == "sigmoid" {
		s = "top-k on sigmoid(logit)+bias; probs = sigmoid(logit) of the chosen, renormalised"
	}
	if c.Groups > 1 {
		s += fmt.Sprintf("; group-limited: %d groups, each token uses its best %d (group score = sum of its top %d)", c.Groups, c.GroupTopK, c.TopK/c.GroupTopK)
	}
	return s + fmt.Sprintf("; probs × %g", c.TopKScale)
}

func concat(parts [][]float32) []float32 {
	var out []float32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// perExpert is one of the layer's expert weights (which 0: fc1, 1: fc2) of
// every expert, written one expert at a time: a device layer's host twin
// does not hold them, so they are drawn again from the seed.
type perExpert struct {
	l     *layer.Layer
	which int
}

func (p perExpert) get(e int) []float32 {
	fc1, fc2 := p.l.ExpertWeights(e)
	if p.which == 0 {
		return fc1
	}
	return fc2
}

// writeNpy writes a little-endian NPY v1.0 file of float32 or int32 data (or
// perExpert's) and returns the numpy dtype it used.
func writeNpy(path string, shape []int, data any) (string, error) {
	var descr string
	n := 0
	switch d := data.(type) {
	case []float32:
		descr, n = "<f4", len(d)
	case []int32:
		descr, n = "<i4", len(d)
	case perExpert:
		descr, n = "<f4", d.l.Cfg.Experts*[]int{2, 1}[d.which]*d.l.Cfg.FFN*d.l.Cfg.Hidden
	default:
		return "", fmt.Errorf("writeNpy: unsupported %T", data)
	}
	want := 1
	dims := make([]string, len(shape))
	for i, s := range shape {
		want *= s
		dims[i] = fmt.Sprint(s)
	}
	if want != n {
		return "", fmt.Errorf("%s: %d values for shape %v", filepath.Base(path), n, shape)
	}
	tuple := strings.Join(dims, ", ")
	if len(shape) == 1 {
		tuple += ","
	}
	header := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, tuple)
	pad := 64 - (10+len(header)+1)%64
	header += strings.Repeat(" ", pad%64) + "\n"
	fh, err := os.Create(path)
	if err != nil {
		return "", err
	}
	w := bufio.NewWriter(fh)
	w.WriteString("\x93NUMPY\x01\x00")
	binary.Write(w, binary.LittleEndian, uint16(len(header)))
	w.WriteString(header)
	write := func(d any) error { return binary.Write(w, binary.LittleEndian, d) }
	if p, ok := data.(perExpert); ok {
		for e := 0; e < p.l.Cfg.Experts && err == nil; e++ {
			err = write(p.get(e))
		}
	} else {
		err = write(data)
	}
	if err != nil {
		fh.Close()
		return "", err
	}
	if err := w.Flush(); err != nil {
		fh.Close()
		return "", err
	}
	return descr, fh.Close()
}
