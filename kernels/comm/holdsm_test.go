package comm

import (
	"errors"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels/device"
)

// TestResidentBlockHoldsSM: on the host simulation's fake GPU (an H100's
// per-SM limits), comm_test's 128-thread blocks would share an SM two to
// one by their registers; a resident launch of them asks for enough
// dynamic shared memory that each holds one SM alone (occupancy 1), so
// that one more block than the GPU's SMs is refused, naming one block per
// SM; a program whose own shared memory already fills half an SM keeps it.
func TestResidentBlockHoldsSM(t *testing.T) {
	t.Setenv("FAKECUDA_SMS", "4")
	useHostSim(t)
	gs, err := device.OpenGPUs(1, 1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(gs)
	g := gs[0]
	p := CommTestProgram(2, 32)
	f, err := g.Program(p)
	if err != nil {
		t.Fatal(err)
	}
	if per, err := g.Drv.Occupancy(f, p.Block, p.Shared); err != nil || per != 2 {
		t.Fatalf("occupancy without the held SM: %d, %v; want 2 (the test's premise)", per, err)
	}
	if per, err := g.Residency(p); err != nil || per != 1 {
		t.Fatalf("Residency: %d, %v; want 1 block per SM", per, err)
	}
	static, err := g.Drv.FuncAttribute(f, cuda.FuncAttrSharedBytes)
	if err != nil {
		t.Fatal(err)
	}
	shared, per, err := g.HoldSM(p, f)
	if err != nil || per != 1 || 2*(shared+static+g.ReservedShared) <= g.SMShared {
		t.Errorf("held shared memory %d B (%d per SM, %v): two blocks with %d B static and the %d B reserve must exceed the SM's %d B", shared, per, err, static, g.ReservedShared, g.SMShared)
	}
	s, err := g.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	err = g.LaunchResident(device.NewCollective(p, 1), g.SMs+1, s)
	var re *device.ResidencyError
	if !errors.As(err, &re) || re.PerSM != 1 || re.Grid != g.SMs+1 || re.Shared != shared {
		t.Errorf("a resident launch of %d blocks on %d SMs: %v; want a residency error of one block per SM", g.SMs+1, g.SMs, err)
	}
	big := CommTestProgram(2, 32)
	big.Shared = 150 << 10
	fb, err := g.Program(big)
	if err != nil {
		t.Fatal(err)
	}
	if shared, per, err := g.HoldSM(big, fb); err != nil || per != 1 || shared != big.Shared {
		t.Errorf("a program with %d B of its own: %d B, %d per SM, %v", big.Shared, shared, per, err)
	}
	if n, err := g.Drv.FuncAttribute(fb, cuda.FuncAttrMaxDynamicShared); err != nil || n < big.Shared {
		t.Errorf("its dynamic shared memory limit: %d, %v", n, err)
	}
}
