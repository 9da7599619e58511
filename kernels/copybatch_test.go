package kernels

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
)

// TestCopyBatchRefusedFallsBack: on the fake driver (internal/cuda's
// testdata: device memory is host memory), CopyBatch copies as one batch;
// once the driver refuses a batch as invalid, that batch and the later ones
// are copied one by one, and BatchMethod says why.
func TestCopyBatchRefusedFallsBack(t *testing.T) {
	so := filepath.Join(t.TempDir(), "libcuda.so.1")
	if out, err := exec.Command("cc", "-shared", "-fPIC", "-o", so, "../internal/cuda/testdata/fakecuda.c").CombinedOutput(); err != nil {
		t.Fatalf("building the fake driver: %v\n%s", err, out)
	}
	t.Setenv("MOEBENCH_LIBCUDA", so)
	drv, err := cuda.OpenDriver()
	if err != nil {
		t.Fatal(err)
	}
	c := &CUDA{Drv: drv}
	s, err := drv.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	src, dst := []uint16{1, 2, 3, 4, 5, 6, 7, 8}, make([]uint16, 8)
	ps, err := drv.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	pd, err := drv.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	swap := []CopyOp{{pd, ps + 8, 8}, {pd + 8, ps, 8}, {pd, ps, 0}} // the halves swapped
	// the third batch: the driver would take it, but a refusal is final
	for i, refuse := range []bool{false, true, false} {
		if refuse {
			t.Setenv("FAKECUDA_REFUSE_BATCH", "1")
		} else {
			os.Unsetenv("FAKECUDA_REFUSE_BATCH")
		}
		if err := c.Upload(ps, src, s); err != nil {
			t.Fatal(err)
		}
		if err := c.Fill16(pd, 0, 8, s); err != nil {
			t.Fatal(err)
		}
		if err := c.CopyBatch(swap, s); err != nil {
			t.Fatalf("refuse %v: %v", refuse, err)
		}
		if err := c.Download(dst, pd, s); err != nil {
			t.Fatal(err)
		}
		if want := slices.Concat(src[4:], src[:4]); !slices.Equal(dst, want) {
			t.Errorf("refuse %v: copied %v, want %v", refuse, dst, want)
		}
		if (c.BatchErr != nil) != (i > 0) { // refused once, it stays refused
			t.Errorf("batch %d: BatchErr %v", i, c.BatchErr)
		}
	}
	if c.BatchErr == nil || !strings.Contains(c.BatchMethod(), "refused the batch copy") || !strings.Contains(c.BatchMethod(), "CUDA_ERROR_INVALID_VALUE") {
		t.Errorf("after a refusal: BatchErr %v, method %q", c.BatchErr, c.BatchMethod())
	}
}
