package cuda

import (
	"math"
	"testing"
	"unsafe"

	"github.com/moebench/moebench/internal/hostsim"
)

// TestFakeAllocPoisoned: the fake driver's cuMemAlloc and cuMemHostAlloc
// hand out memory filled with the word 0x7FFF (kernels/device.Poison16),
// not zeros: a GPU's new memory holds what a freed buffer held, and code
// that reads memory it never wrote must fail on the CPU as it does there
// (an unzeroed claim word hid planted timeouts on an H200). bf16 and fp32
// read it as NaN, an int32 as a large positive count.
func TestFakeAllocPoisoned(t *testing.T) {
	d := fakeDriver(t)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	check := func(what string, words []uint16) {
		t.Helper()
		for i, w := range words {
			if w != 0x7FFF {
				t.Fatalf("%s: word %d of a fresh allocation is %#04x, want the poison 0x7FFF", what, i, w)
			}
		}
		f := math.Float32frombits(uint32(words[1])<<16 | uint32(words[0]))
		if !math.IsNaN(float64(f)) {
			t.Fatalf("%s: an fp32 of poison reads %v, want NaN", what, f)
		}
		if n := int32(uint32(words[1])<<16 | uint32(words[0])); n < 1<<30 {
			t.Fatalf("%s: an int32 of poison reads %d, want a large positive count", what, n)
		}
	}
	for _, n := range []int{2, 1000, 1 << 20} { // past a page and the 256-byte rounding
		p, err := d.Alloc(int64(2 * n))
		if err != nil {
			t.Fatal(err)
		}
		got := make([]uint16, n)
		if err := CopyFromDevice(d, got, p, s); err != nil {
			t.Fatal(err)
		}
		check("cuMemAlloc", got)
		// a buffer freed after use and allocated again is poisoned again
		zero := make([]uint16, n)
		if err := CopyToDevice(d, p, zero, s); err != nil {
			t.Fatal(err)
		}
		if err := d.SyncStream(s); err != nil {
			t.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			t.Fatal(err)
		}
		if p, err = d.Alloc(int64(2 * n)); err != nil {
			t.Fatal(err)
		}
		if err := CopyFromDevice(d, got, p, s); err != nil {
			t.Fatal(err)
		}
		check("cuMemAlloc after a free", got)
		d.Free(p)
		h, err := d.HostAlloc(int64(2*n), HostAllocPortable|HostAllocDeviceMap)
		if err != nil {
			t.Fatal(err)
		}
		check("cuMemHostAlloc", unsafe.Slice((*uint16)(h), n))
		d.FreeHost(h)
	}
}

// peekSource is a kernel that copies out the shared memory its block starts
// with (16 words of static __shared__, then 16 of dynamic) and then
// overwrites both, so that a later block on the same SM would see zeros
// unless poisoned again.
const peekSource = `extern "C" __global__ void peek(unsigned short *out) {
    __shared__ unsigned short s[32];
    unsigned short *d = (unsigned short *)mbhost_dynamic_smem();
    out[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x];
    out[blockIdx.x * 64 + 32 + threadIdx.x] = d[threadIdx.x];
    __syncthreads();
    s[threadIdx.x] = 0;
    d[threadIdx.x] = 0;
}`

// TestHostSimSharedPoisoned: on the host simulation every block starts with
// its static and dynamic shared memory filled with the poison 0x7FFF, as a
// GPU's block finds there what the SM's last block left, not zeros.
func TestHostSimSharedPoisoned(t *testing.T) {
	c, err := hostsim.New()
	if err != nil {
		t.Skip(err)
	}
	so, err := c.Compile("peek.cu", peekSource, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := fakeDriver(t)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	m, err := d.LoadModule(so)
	if err != nil {
		t.Fatal(err)
	}
	defer d.UnloadModule(m)
	f, err := d.Function(m, "peek")
	if err != nil {
		t.Fatal(err)
	}
	const blocks = 16 // more than the fake's 4 SMs hold at once: later blocks reuse their storage
	out, err := d.Alloc(2 * 64 * blocks)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(out)
	got := make([]uint16, 64*blocks)
	for range 2 {
		if err := d.Launch(f, [3]uint32{blocks, 1, 1}, [3]uint32{32, 1, 1}, 64, s, out); err != nil {
			t.Fatal(err)
		}
		if err := CopyFromDevice(d, got, out, s); err != nil {
			t.Fatal(err)
		}
		for i, w := range got {
			if w != 0x7FFF {
				what := "static __shared__"
				if i%64 >= 32 {
					what = "dynamic shared"
				}
				t.Fatalf("block %d: %s word %d starts as %#04x, want the poison 0x7FFF", i/64, what, i%32, w)
			}
		}
	}
}
