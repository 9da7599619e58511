package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/hostsim"
)

// buildFake compiles the fake library NAME (internal/hostsim/fakes) and
// points the environment variable env at it.
func buildFake(t *testing.T, name, env string) {
	t.Helper()
	so, err := hostsim.BuildFake(name, t.TempDir(), "lib"+name+".so")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(env, so)
}

// fakeDriver opens the binding on the fake driver (fakecuda.c), with GPU 0's
// context current.
func fakeDriver(t *testing.T) *Driver {
	buildFake(t, "fakecuda", "MOEBENCH_LIBCUDA")
	d, err := OpenDriver()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.PrimaryContext(0); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDriverQueries(t *testing.T) {
	d := fakeDriver(t)
	if v, err := d.Version(); err != nil || v != 13000 {
		t.Errorf("Version = %d, %v", v, err)
	}
	if n, err := d.DeviceCount(); err != nil || n != 2 {
		t.Errorf("DeviceCount = %d, %v", n, err)
	}
	if v, err := d.Attribute(1, AttrMultiprocessorCount); err != nil || v != 4 {
		t.Errorf("Attribute(1, SMs) = %d, %v (the fake has 4 SMs)", v, err)
	}
	if v, err := d.Attribute(1, AttrAsyncEngineCount); err != nil || v != 4001 {
		t.Errorf("Attribute(1, copy engines) = %d, %v (the fake answers attr·100+device)", v, err)
	}
	if id, err := d.PCIBusID(1); err != nil || id != "0000:2C:00.0" {
		t.Errorf("PCIBusID(1) = %q, %v", id, err)
	}
	if _, err := d.PCIBusID(2); err == nil || !strings.Contains(err.Error(), "cuDeviceGetPCIBusId") {
		t.Errorf("PCIBusID(2) of 2 GPUs: %v", err)
	}
	if n, err := d.TotalMem(0); err != nil || n != 80<<30 {
		t.Errorf("TotalMem = %d, %v", n, err)
	}
	if ok, err := d.CanAccessPeer(0, 1); err != nil || !ok {
		t.Errorf("CanAccessPeer(0, 1) = %v, %v", ok, err)
	}
	if f, tot, err := d.MemInfo(); err != nil || f != 1<<30 || tot != 2<<30 {
		t.Errorf("MemInfo = %d, %d, %v", f, tot, err)
	}
	// Probe goes through the same override
	drv, gpus, err := Probe()
	if err != nil || drv != 13000 || len(gpus) != 2 || gpus[1].Name != "Fake GPU 1" {
		t.Errorf("Probe = %d, %v, %v", drv, gpus, err)
	}
}

func TestDriverStreamsEventsCopiesLaunch(t *testing.T) {
	d := fakeDriver(t)
	c0, err := d.PrimaryContext(0)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := d.PrimaryContext(1)
	least, greatest, err := d.StreamPriorities()
	if err != nil || least != 0 || greatest != -5 {
		t.Fatalf("priorities %d, %d, %v", least, greatest, err)
	}
	s, err := d.NewStream(greatest)
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	e0, _ := d.NewEvent()
	e1, _ := d.NewEvent()
	d.Record(e0, s)
	d.Record(e1, s)
	if err := d.SyncEvent(e1); err != nil { // before it, the time may not be ready
		t.Fatal(err)
	}
	if ms, err := d.Elapsed(e0, e1); err != nil || ms != 0.5 {
		t.Errorf("Elapsed = %v, %v", ms, err)
	}
	x := []float32{1, 2, 3, 4, 5}
	p, err := d.Alloc(int64(4 * len(x)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	if err := CopyToDevice(d, p, x, s); err != nil {
		t.Fatal(err)
	}
	m, err := d.LoadModule([]byte("\x7fELF fake cubin"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := d.Function(m, "add")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetMaxDynamicShared(f, 200<<10); err != nil {
		t.Fatal(err)
	}
	if err := d.Launch(f, [3]uint32{7, 1, 1}, [3]uint32{128, 1, 1}, 4096, s, p, int32(4), float32(0.5)); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(x))
	if err := CopyFromDevice(d, got, p, s); err != nil {
		t.Fatal(err)
	}
	// the fake writes grid·(100,10,1) + block·(1000,1,1) + shared/1024 after the n elements
	if want := []float32{1.5, 2.5, 3.5, 4.5, 700 + 10 + 1 + 128000 + 1 + 1 + 4}; !slices.Equal(got, want) {
		t.Errorf("after the fake add kernel: %v, want %v (arguments and launch geometry)", got, want)
	}
	// device-to-device and peer copies (from GPU 0's memory), and a 16-bit fill
	q, _ := d.Alloc(20)
	defer d.Free(q)
	if err := d.CopyDevice(q, p, 20, s); err != nil {
		t.Fatal(err)
	}
	d.SetCurrent(c0)
	q0, _ := d.Alloc(8)
	defer d.Free(q0)
	d.SetCurrent(c1)
	if err := d.CopyPeer(p, c1, q0, c0, 8, s); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyDevice(p, q0, 8, s); err == nil {
		t.Error("a same-context copy of GPU 0's memory on GPU 1's stream: the fake should refuse it")
	}
	if err := d.Fill16(q, 0x7fc0, 10, s); err != nil {
		t.Fatal(err)
	}
	CopyFromDevice(d, got, q, s)
	for _, v := range got {
		if v == v { // 0x7fc07fc0 is a NaN
			t.Fatalf("Fill16 with the bf16 NaN pattern left %v", got)
		}
	}
	if err := d.Launch(f, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, s, "nope"); err == nil {
		t.Error("unsupported argument type accepted")
	}
	// cooperative and extensible launches: the fake adds 10⁶ for a
	// cooperative launch and 2·10⁶·x for a cluster of x blocks
	for _, tc := range []struct {
		name   string
		launch func() error
		want   float32
	}{
		{"cooperative", func() error {
			return d.LaunchCooperative(f, [3]uint32{2, 1, 1}, [3]uint32{64, 1, 1}, 0, s, p, int32(4), float32(1))
		}, 1e6},
		{"ex plain", func() error {
			return d.LaunchEx(f, [3]uint32{2, 1, 1}, [3]uint32{64, 1, 1}, 0, s, LaunchOptions{}, p, int32(4), float32(1))
		}, 0},
		{"ex cooperative", func() error {
			return d.LaunchEx(f, [3]uint32{2, 1, 1}, [3]uint32{64, 1, 1}, 0, s, LaunchOptions{Cooperative: true}, p, int32(4), float32(1))
		}, 1e6},
		{"ex cluster", func() error {
			return d.LaunchEx(f, [3]uint32{2, 1, 1}, [3]uint32{64, 1, 1}, 0, s, LaunchOptions{Cluster: [3]uint32{2, 1, 1}}, p, int32(4), float32(1))
		}, 4e6},
	} {
		if err := tc.launch(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		CopyFromDevice(d, got, p, s)
		if g := got[4] - (200 + 10 + 1 + 64000 + 1 + 1); g != tc.want {
			t.Errorf("%s: the fake saw launch flags %v, want %v", tc.name, g, tc.want)
		}
	}
	if err := d.LaunchEx(f, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, s, LaunchOptions{Cluster: [3]uint32{2, 0, 1}}, p, int32(4), float32(1)); err == nil {
		t.Error("a cluster with a zero dimension accepted")
	}
	// a batch copy (the fake has CUDA 13's ABI and checks the attributes):
	// two halves of p swapped into q
	if name := d.BatchCopy(); name != "cuMemcpyBatchAsync_v2" {
		t.Fatalf("BatchCopy = %q", name)
	}
	CopyToDevice(d, p, []float32{1, 2, 3, 4}, s)
	if err := d.CopyBatch([]DevicePtr{q, q + 8}, []DevicePtr{p + 8, p}, []int64{8, 8}, 1, 1, true, s); err != nil {
		t.Fatal(err)
	}
	CopyFromDevice(d, got[:4], q, s)
	if want := []float32{3, 4, 1, 2}; !slices.Equal(got[:4], want) {
		t.Errorf("after the batch copy: %v, want %v", got[:4], want)
	}
	if err := d.CopyBatch([]DevicePtr{q}, []DevicePtr{p}, []int64{8}, 1, 1, false, s); err == nil || !strings.Contains(err.Error(), "cuMemcpyBatchAsync_v2") {
		t.Errorf("the fake refuses a batch without the prefer-overlap flag; got %v", err)
	}
}

func TestDriverErrorsNameTheCall(t *testing.T) {
	d := fakeDriver(t)
	_, err := d.LoadModule([]byte("not a cubin"))
	var ce *Error
	if !errors.As(err, &ce) || ce.Call != "cuModuleLoadData" || ce.Name != "CUDA_ERROR_INVALID_IMAGE" || ce.Code != 200 {
		t.Errorf("bad image: %v", err)
	}
	m, _ := d.LoadModule([]byte("\x7fELF"))
	if _, err := d.Function(m, "missing"); err == nil || err.Error() != "cuModuleGetFunction(missing): CUDA_ERROR_NOT_FOUND (500)" {
		t.Errorf("missing function: %v", err)
	}
}

func TestGPUInfoFromFake(t *testing.T) {
	fakeDriver(t)
	t.Setenv("MOEBENCH_NVML", "/nonexistent/libnvidia-ml.so.1")
	g, err := ReadGPUInfo()
	if err != nil {
		t.Fatal(err)
	}
	// the fake has 4 SMs and answers attribute a of device 0 with a·100
	if g.Model != "Fake GPU 0" || g.Count != 2 || g.SMs != 4 || g.CopyEngines != 4000 || g.MemoryBytes != 80<<30 ||
		g.CUDADriver != 13000 || g.SMClockMHz != 1 || g.Topology != "0→1 p2p, 1→0 p2p" {
		t.Errorf("GPU info %+v", g)
	}
	if len(g.Unread) != 2 || !strings.Contains(g.Unread[0], "NVLink (NVML)") || !strings.Contains(g.Unread[1], "power limit") || g.PowerLimitW != 0 {
		t.Errorf("NVML missing should leave the NVLinks and power limit unread: %+v", g.Unread)
	}
}

// TestGPUInfoNVMLByBusID: NVML finds each CUDA device by its PCI address,
// not by its own index (whose order can differ from CUDA's), for the power
// limit and the NVLinks.
func TestGPUInfoNVMLByBusID(t *testing.T) {
	fakeDriver(t)
	buildFake(t, "fakenvml", "MOEBENCH_NVML")
	g, err := ReadGPUInfo()
	if err != nil {
		t.Fatal(err)
	}
	if g.PowerLimitW != 700 || g.Driver != "580.00.fake" || len(g.Unread) != 0 {
		t.Errorf("power limit %v W (want 700, the fake's GPU at 0000:1B:00.0), driver %q, unread %v", g.PowerLimitW, g.Driver, g.Unread)
	}
	// CUDA's GPU 0 is NVML's GPU at 0000:1B:00.0: 16 of its 18 links up;
	// the other GPU has no NVLink
	if want := "0→1 p2p, 1→0 p2p; active NVLinks: GPU 0 16, GPU 1 0"; g.Topology != want {
		t.Errorf("topology %q, want %q", g.Topology, want)
	}
}

// TestLibDirsSearchedFirst: a library in a MOEBENCH_CUDA_LIBS folder is
// found there, under its usual name; the library's own variable still wins.
func TestLibDirsSearchedFirst(t *testing.T) {
	dir := t.TempDir()
	if _, err := hostsim.BuildFake("fakecublaslt", dir, "libcublasLt.so.13"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_CUBLASLT", "")
	t.Setenv(LibDirsEnv, "/nonexistent:"+dir)
	b, err := OpenCuBLASLt()
	if err != nil || b.Path != filepath.Join(dir, "libcublasLt.so.13") {
		t.Fatalf("with %s: %v, %+v", LibDirsEnv, err, b)
	}
	t.Setenv("MOEBENCH_CUBLASLT", "/nonexistent/libcublasLt.so")
	if _, err := OpenCuBLASLt(); err == nil || !strings.Contains(err.Error(), "MOEBENCH_CUBLASLT=/nonexistent") {
		t.Errorf("the library's own variable should win: %v", err)
	}
}

// TestSearchDirsFindWheels: the wheels' nvidia/*/lib folders of the python3
// on the path, of the active virtual environment and of the conda
// environment are searched.
func TestSearchDirsFindWheels(t *testing.T) {
	onPath, venv, conda := t.TempDir(), t.TempDir(), t.TempDir()
	want := []string{filepath.Join(onPath, "lib/python3.12/site-packages/nvidia/cu13/lib"),
		filepath.Join(venv, "lib/python3.12/site-packages/nvidia/nccl/lib"), filepath.Join(conda, "lib/python3.11/site-packages/nvidia/cublas/lib")}
	for _, d := range append(want, filepath.Join(onPath, "bin")) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(onPath, "bin", "python3"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", filepath.Join(onPath, "bin"))
	t.Setenv("VIRTUAL_ENV", venv)
	t.Setenv("CONDA_PREFIX", conda)
	dirs := searchDirs()
	for _, d := range want {
		if !slices.Contains(dirs, d) {
			t.Errorf("%s not searched: %v", d, dirs)
		}
	}
}

// TestMaxConnections: CUDA_DEVICE_MAX_CONNECTIONS is in the process's
// environment when the driver initializes (the fake reports what it saw at
// cuInit): moebench's 32 when unset, the user's value when set.
func TestMaxConnections(t *testing.T) {
	for _, tc := range []struct{ env, want string }{{"", MaxConnections}, {"8", "8"}} {
		t.Run("env="+tc.env, func(t *testing.T) {
			t.Setenv("CUDA_DEVICE_MAX_CONNECTIONS", tc.env)
			if tc.env == "" {
				os.Unsetenv("CUDA_DEVICE_MAX_CONNECTIONS")
			}
			d := fakeDriver(t) // a new fake library: its first cuInit
			if v, err := d.Attribute(0, 10000); err != nil || fmt.Sprint(v) != tc.want {
				t.Errorf("at cuInit: %d, %v; want %s", v, err, tc.want)
			}
		})
	}
}

// TestStreamCapture: against the fake driver's capture, which implements
// the driver's rules: captured work does not run until the graph is
// launched, runs at each launch (on a joined stream too), and what a
// capture cannot take — a synchronization, an allocation, a stream left
// unjoined — fails as the driver's does.
func TestStreamCapture(t *testing.T) {
	d := fakeDriver(t)
	if !d.HasGraphs() {
		t.Fatal("the fake driver has graphs")
	}
	s1, _ := d.NewStream(0)
	s2, _ := d.NewStream(0)
	e, _ := d.NewEvent()
	x := []float32{0, 0}
	p, _ := d.Alloc(12)
	if err := CopyToDevice(d, p, x, s1); err != nil {
		t.Fatal(err)
	}
	if err := d.SyncStream(s1); err != nil {
		t.Fatal(err)
	}
	m, _ := d.LoadModule([]byte("\x7fELF fake cubin"))
	f, _ := d.Function(m, "add")
	add := func(s Stream) error {
		return d.Launch(f, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, s, p, int32(2), float32(1))
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// s1 adds 1, s2 joins and adds 1, s1 waits for it
	must(d.BeginCapture(s1))
	must(add(s1))
	must(d.Record(e, s1))
	must(d.WaitEvent(s2, e))
	must(add(s2))
	e2, _ := d.NewEvent()
	must(d.Record(e2, s2))
	must(d.WaitEvent(s1, e2))
	g, err := d.EndCapture(s1)
	must(err)
	x2 := make([]float32, 2)
	must(CopyFromDevice(d, x2, p, s1))
	if x2[0] != 0 {
		t.Fatalf("captured work ran: %v", x2)
	}
	ex, err := d.Instantiate(g)
	must(err)
	for range 3 {
		must(d.LaunchGraph(ex, s1))
	}
	must(CopyFromDevice(d, x2, p, s1))
	if x2[0] != 6 || x2[1] != 6 {
		t.Errorf("after 3 launches of a graph adding 1 twice: %v", x2)
	}
	must(d.DestroyGraph(g, ex))

	code := func(err error) int {
		var ce *Error
		if errors.As(err, &ce) {
			return ce.Code
		}
		return 0
	}
	must(d.BeginCapture(s1))
	if err := d.SyncStream(s1); code(err) != 900 {
		t.Errorf("a sync inside a capture: %v, want CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", err)
	}
	if err := d.Record(e, s1); code(err) != 901 {
		t.Errorf("a record into the capture the sync invalidated: %v, want CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", err)
	}
	if _, err := d.EndCapture(s1); code(err) != 901 {
		t.Errorf("ending the capture the sync invalidated: %v, want CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", err)
	}
	must(d.BeginCapture(s1))
	if _, err := d.Alloc(16); code(err) != 900 {
		t.Errorf("an allocation inside a capture: %v", err)
	}
	d.EndCapture(s1)
	must(d.BeginCapture(s1))
	must(d.Record(e, s1))
	must(d.WaitEvent(s2, e))
	must(add(s2)) // s2 never joined back
	if _, err := d.EndCapture(s1); code(err) != 904 {
		t.Errorf("a stream left unjoined: %v, want CUDA_ERROR_STREAM_CAPTURE_UNJOINED", err)
	}
	if _, err := d.EndCapture(s1); code(err) != 401 {
		t.Errorf("ending no capture: %v, want CUDA_ERROR_ILLEGAL_STATE", err)
	}
}
