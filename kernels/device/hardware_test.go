package device

import "testing"

// fakeCompiler compiles nothing; gpu is its GPU answer.
type fakeCompiler struct{ gpu bool }

func (f fakeCompiler) Compile(string, string, map[string]string, []string) ([]byte, error) {
	return nil, nil
}
func (f fakeCompiler) ID() string { return "fake" }
func (f fakeCompiler) GPU() bool  { return f.gpu }

// wrapped is a compiler wrapping another, as a test's mutating or a cache
// would: it must not hide that its images run on a GPU.
type wrapped struct{ Compiler }

// TestHardware: a CUDA device is hardware when its compiler's images run on
// a GPU, through a wrapper too; a simulated one (hostsim's compiler) and
// Emu are not.
func TestHardware(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    Device
		want bool
	}{
		{"emu", &Emu{}, false},
		{"cuda without a JIT", &CUDA{}, false},
		{"cuda, GPU compiler", &CUDA{JIT: &JIT{Compiler: fakeCompiler{true}}}, true},
		{"cuda, wrapped GPU compiler", &CUDA{JIT: &JIT{Compiler: wrapped{fakeCompiler{true}}}}, true},
		{"cuda, CPU compiler", &CUDA{JIT: &JIT{Compiler: fakeCompiler{false}}}, false},
	} {
		if got := Hardware(tc.d); got != tc.want {
			t.Errorf("%s: Hardware = %v, want %v", tc.name, got, tc.want)
		}
	}
}
