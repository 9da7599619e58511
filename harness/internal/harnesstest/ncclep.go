package harnesstest

import (
	"testing"

	"github.com/moebench/moebench/internal/hostsim"
)

// UseFakeNCCLEP makes cuda-device runs find the fake libnccl_ep
// (fakencclep.c, over the fake NCCL, which says it is 2.30.7) and what
// NCCL EP's run-time compile looks for (hostsim.FakeNCCLEPRuntime).
func UseFakeNCCLEP(t *testing.T) {
	t.Helper()
	so, err := hostsim.BuildFake("fakencclep", t.TempDir(), "libnccl_ep.so.0")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_NCCL_EP", so)
	t.Setenv("FAKENCCL_VERSION", "23007")
	hostsim.FakeNCCLEPRuntime(t)
}
