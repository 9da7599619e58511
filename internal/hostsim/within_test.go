package hostsim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLimits: the soft limit is the nominal time scaled, or a quarter of
// the time left when that is longer, and never past the hard limit, nine
// tenths of the time left (four times soft without a deadline).
func TestLimits(t *testing.T) {
	now := time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		d          time.Duration
		scale      float64
		left       time.Duration // 0: no deadline
		soft, hard time.Duration
		why        string
	}{
		{"no-deadline", time.Minute, 1, 0, time.Minute, 4 * time.Minute, "1m0s × MOEBENCH_TEST_TIMEOUT_SCALE 1; no test deadline"},
		{"no-deadline-scaled", 30 * time.Second, 4, 0, 2 * time.Minute, 8 * time.Minute, "30s × MOEBENCH_TEST_TIMEOUT_SCALE 4"},
		{"deadline-grows-it", time.Minute, 1, 30 * time.Minute, 450 * time.Second, 27 * time.Minute, "a quarter of the 30m0s left"},
		{"scale-beats-quarter", time.Minute, 10, 30 * time.Minute, 10 * time.Minute, 27 * time.Minute, "1m0s × MOEBENCH_TEST_TIMEOUT_SCALE 10"},
		{"capped-by-deadline", time.Minute, 1, 50 * time.Second, 45 * time.Second, 45 * time.Second, "nine tenths of the 50s left"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			soft, hard, why := Limits(tc.d, tc.scale, now.Add(tc.left), tc.left != 0, now)
			if soft != tc.soft || hard != tc.hard || !strings.Contains(why, tc.why) {
				t.Errorf("soft %v, hard %v (%s); want %v, %v (%s)", soft, hard, why, tc.soft, tc.hard, tc.why)
			}
		})
	}
}

// TestScale: MOEBENCH_TEST_TIMEOUT_SCALE is 1 unset, else a number above 0;
// anything else is refused naming the variable, the value and the range.
func TestScale(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want float64
	}{{"", 1}, {"2.5", 2.5}, {"0.5", 0.5}, {"0", 0}, {"-1", 0}, {"x", 0}, {"Inf", 0}, {"NaN", 0}} {
		t.Run(fmt.Sprintf("%q", tc.v), func(t *testing.T) {
			t.Setenv(ScaleEnv, tc.v)
			got, err := Scale()
			if tc.want == 0 {
				if err == nil || !strings.Contains(err.Error(), ScaleEnv+"=\""+tc.v+"\": want a number above 0") {
					t.Errorf("%v, %v; want the variable, value and range named", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("%v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestWithinReturns: f that returns in time leaves the test alone.
func TestWithinReturns(t *testing.T) {
	ran := false
	Within(t, time.Minute, func() { ran = true })
	if !ran {
		t.Error("f did not run")
	}
}

// childEnv makes the TestWithinChild tests run: they fail on purpose, in a
// child process that TestWithinFailsOnlyItsTest starts and reads.
const childEnv = "MOEBENCH_HOSTSIM_WITHIN_CHILD"

// TestWithinFailsOnlyItsTest: a function past its limit fails its own test,
// naming what it waited for with its goroutines' stacks, and the package's
// later tests still run (the old Within panicked, ending them all): one
// that returns after the limit ends its test when it returns, a panic
// fails its test, a t.Fatal or t.Skip in f ends the test, and one that never returns is abandoned, poisons the
// simulation for later tests, and its late t.Error does not end the binary.
func TestWithinFailsOnlyItsTest(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in the child")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWithinChild", "-test.v", "-test.timeout=0")
	cmd.Env = append(os.Environ(), childEnv+"=1", ScaleEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("the child ended with %v; want exit status 1 (failed tests, no panic)", err)
	}
	for _, want := range []string{
		"TestWithinChildSlow: TestWithinChildSlow's function still running after ",
		"(limit 300ms: 300ms × MOEBENCH_TEST_TIMEOUT_SCALE 1; no test deadline); waiting for it",
		"hostsim.slowWait(",   // f's goroutine
		"hostsim.slowHelper(", // a goroutine f started
		"--- FAIL: TestWithinChildSlow",
		"the child's panicking function panicked: boom",
		"--- FAIL: TestWithinChildPanics",
		"f's own t.Fatal",
		"--- FAIL: TestWithinChildFatal",
		"--- SKIP: TestWithinChildSkip",
		"TestWithinChildAbandoned: the child's hung wait still running after ",
		"hostsim.hungWait(",
		"abandoned (it leaks; later tests on the simulation fail)",
		"--- FAIL: TestWithinChildAbandoned",
		"--- PASS: TestWithinChildPoisoned",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the child's output lacks %q", want)
		}
	}
	for _, bad := range []string{"panic: ", "not reached"} {
		if strings.Contains(string(out), bad) {
			t.Errorf("the child's output has %q", bad)
		}
	}
	if t.Failed() {
		t.Logf("the child's output:\n%s", out)
	}
}

func child(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs in TestWithinFailsOnlyItsTest's child process")
	}
}

// slowWait waits for release, with a goroutine of its own waiting too.
func slowWait(release chan struct{}) {
	var wg sync.WaitGroup
	wg.Add(1)
	go slowHelper(release, &wg)
	<-release
	wg.Wait()
}

func slowHelper(release chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	<-release
}

func TestWithinChildSlow(t *testing.T) {
	child(t)
	release := make(chan struct{})
	onExpire = func() { close(release) }
	defer func() { onExpire = nil }()
	Within(t, 300*time.Millisecond, func() { slowWait(release) })
	fmt.Println("not reached: Within returned after its limit")
}

func TestWithinChildPanics(t *testing.T) {
	child(t)
	WithinNamed(t, time.Minute, "the child's panicking function", func() { panic("boom") })
	fmt.Println("not reached: Within returned after a panic")
}

func TestWithinChildFatal(t *testing.T) {
	child(t)
	Within(t, time.Minute, func() { t.Fatal("f's own t.Fatal") })
	fmt.Println("not reached: Within returned after f's t.Fatal")
}

func TestWithinChildSkip(t *testing.T) {
	child(t)
	Within(t, time.Minute, func() { t.Skip("f's own t.Skip") })
	fmt.Println("not reached: Within returned after f's t.Skip")
}

var hold = make(chan struct{})

// hungWait waits until TestWithinChildPoisoned lets it go.
func hungWait() { <-hold }

func TestWithinChildAbandoned(t *testing.T) {
	child(t)
	WithinNamed(t, 200*time.Millisecond, "the child's hung wait", func() {
		hungWait()
		t.Error("late") // the testing package panics: its test has ended
	})
	fmt.Println("not reached: Within returned an abandoned function")
}

// fakeTB records a Fatal and ends its goroutine, as a test's would.
type fakeTB struct {
	testing.TB
	fatal string
}

func (f *fakeTB) Helper()                      {}
func (f *fakeTB) Name() string                 { return "fake" }
func (f *fakeTB) Fatal(args ...any)            { f.fatal = fmt.Sprint(args...); runtime.Goexit() }
func (f *fakeTB) Skip(args ...any)             { f.fatal = "skipped: " + fmt.Sprint(args...); runtime.Goexit() }
func (f *fakeTB) Fatalf(s string, args ...any) { f.Fatal(fmt.Sprintf(s, args...)) }

func TestWithinChildPoisoned(t *testing.T) {
	child(t)
	want := "hostsim: TestWithinChildAbandoned abandoned the child's hung wait still running after "
	for name, call := range map[string]func(testing.TB){
		"Within": func(tb testing.TB) { Within(tb, time.Minute, func() { t.Error("f ran on a poisoned simulation") }) },
		"Setup":  func(tb testing.TB) { Setup(tb) },
	} {
		f := &fakeTB{}
		done := make(chan struct{})
		go func() { defer close(done); call(f) }()
		<-done
		if !strings.HasPrefix(f.fatal, want) {
			t.Errorf("%s on a poisoned simulation: %q; want it to fail at once with %q", name, f.fatal, want)
		}
	}
	close(hold)
	abandoned.Wait()
	select {
	case r := <-late:
		if !strings.Contains(fmt.Sprint(r), "Fail in goroutine after TestWithinChildAbandoned has completed") {
			t.Errorf("the abandoned goroutine panicked with %v; want the testing package's late Fail", r)
		}
	default:
		t.Error("the abandoned goroutine's late t.Error did not panic")
	}
}

// TestRemoveStaleCaches: a kernel cache folder is removed only when its
// process has ended and it is an hour old.
func TestRemoveStaleCaches(t *testing.T) {
	tmp := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	dirs := map[string]bool{ // the folder: whether it stays
		fmt.Sprintf("%s%d-1", cachePrefix, dead.Process.Pid): false,
		fmt.Sprintf("%s%d-2", cachePrefix, os.Getpid()):      true, // this process
		fmt.Sprintf("%s%d-3", cachePrefix, os.Getppid()):     true, // alive
		fmt.Sprintf("%s%d-4", cachePrefix, dead.Process.Pid): true, // recent
		"other-" + fmt.Sprintf("%d", dead.Process.Pid):       true,
	}
	for d := range dirs {
		p := filepath.Join(tmp, d)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(d, "-4") {
			os.Chtimes(p, old, old)
		}
	}
	removeStaleCaches(tmp)
	for d, stays := range dirs {
		if _, err := os.Stat(filepath.Join(tmp, d)); (err == nil) != stays {
			t.Errorf("%s: stat %v; want it kept: %v", d, err, stays)
		}
	}
}
