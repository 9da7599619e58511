package deepep

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/dispatchers"
	dt "github.com/moebench/moebench/dispatchers/dispatchtest"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
)

const proxyChildEnv = "MOEBENCH_DE_PROXY_CHILD"

// TestDispatchProxyFenceFault: with the dispatch's senders skipping the
// proxy fence after their ring stores (deepep.cu's MB_DE_BUG 7), the
// receivers' bulk copies (the host simulation compiles the bulk path)
// read generic-proxy stores not ordered before the async proxy's reads:
// mbhost.h's stand-in names the broken rule and the launch fails. A
// failed launch leaves the fake GPUs failed for the rest of the process,
// so the broken run is a child process of the test binary
// (TestDispatchProxyFenceChild).
func TestDispatchProxyFenceFault(t *testing.T) {
	if os.Getenv(proxyChildEnv) != "" {
		t.Skip("the child process")
	}
	if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
		t.Skip("the GPU check runs the kernels on the GPU")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDispatchProxyFenceChild$", "-test.v")
	cmd.Env = append(os.Environ(), proxyChildEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(hostsim.Patience(t, 3*time.Minute)):
		cmd.Process.Kill()
		t.Fatalf("child still running:\n%s", out.String())
	}
	rule := ""
	for _, l := range strings.Split(out.String(), "\n") {
		if _, r, ok := strings.Cut(l, "bulk-copy rule broken: "); ok {
			rule = r
			break
		}
	}
	if err != nil || !strings.Contains(rule, "not followed by its fence.proxy.async") {
		t.Fatalf("child: %v; first rule broken %q, want the missing proxy fence:\n%s", err, rule, out.String())
	}
	t.Log(rule)
}

// TestDispatchProxyFenceChild is TestDispatchProxyFenceFault's broken
// run: the step must fail (it passes when it does). A ring of 4 slots
// keeps the senders' blocks alive (waiting for room) while the receivers
// copy their rows.
func TestDispatchProxyFenceChild(t *testing.T) {
	if os.Getenv(proxyChildEnv) == "" {
		t.Skip("runs as a child of TestDispatchProxyFenceFault")
	}
	sh := dispatchers.Shape{Tokens: 64, Hidden: 256, Experts: 8, TopK: 2, EP: 2}
	cfg := Config{SMs: 2, Dispatch: Queue{Chunk: 2, Ring: 4}, Combine: Queue{Chunk: 2, Ring: 4}, Warps: 2, MinBlocks: 4}
	devs := dt.FakeGPUs(t, 2)
	c := devCase{sh: sh, cfg: cfg, devs: devs}
	_, ranks := hostRun(t, c, 8, dt.Mild)
	d := WithDeviceConfig(cfg)
	d.bug, d.timeout = 7, 1500*time.Millisecond
	var got devResult
	hostsim.WithinNamed(t, 2*time.Minute, "the unfenced dispatch to fail", func() { got = runDevice(t, d, c, ranks, 1, false) })
	if got.err == nil {
		t.Fatal("the dispatch without the senders' proxy fence did not fail")
	}
	t.Log(got.err)
}

// TestDeviceNoBulkOnHostSim: the dispatch's 16-byte receivers (sm_80 and
// NVRTC 11.8's path, MB_NO_BULK=1 here) against the host design bit for
// bit, as TestDeviceOnHostSim checks the bulk path.
func TestDeviceNoBulkOnHostSim(t *testing.T) { checkDevicesPath(t, dt.FakeGPUs(t, 2), true) }

// TestDispatchStageMatchesSource: the launch sizes the dispatch's dynamic
// shared memory from dispatchStage, which must be deepep.cu's DE_STAGE
// (the warps' staging halves are laid out from it there).
func TestDispatchStageMatchesSource(t *testing.T) {
	src, err := kernels.Sources.ReadFile("cuda/deepep.cu")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#define DE_STAGE (\d+)`).FindSubmatch(src)
	if m == nil {
		t.Fatal("deepep.cu defines no DE_STAGE")
	}
	if got, _ := strconv.Atoi(string(m[1])); got != dispatchStage {
		t.Errorf("deepep.cu's DE_STAGE is %d; dispatchStage (the launch's shared memory) is %d", got, dispatchStage)
	}
}
