package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// cliDocPath is the generated command-line reference, relative to this
// package; cliDocMarker separates its hand-written preamble (kept as it is)
// from the part TestCLIDoc generates from every command's --help.
const (
	cliDocPath   = "../../docs/cli.md"
	cliDocMarker = "<!-- Generated from every command's --help below this line: do not edit; regenerate with MOEBENCH_UPDATE_DOCS=1 go test -run TestCLIDoc ./cmd/moebench -->\n"
)

// testOnlyDispatchers are the names this package's tests register (the
// failing dispatcher of sweep_test.go): the help a user sees lists none.
var testOnlyDispatchers = regexp.MustCompile(`failing(\||, ?)`)

// helpOf is the help 'moebench ARGS... --help' prints, as a user sees it.
func helpOf(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := cli(append(args, "--help")...)
	if code != exitOK || out == "" {
		t.Fatalf("moebench %s --help: exit %d, stdout %d bytes, stderr %q", strings.Join(args, " "), code, len(out), errOut)
	}
	return testOnlyDispatchers.ReplaceAllString(out, "")
}

// cliDocGenerated is docs/cli.md's generated part: a section per command
// (per subcommand where a command's usage names some, as bench's does),
// each its --help verbatim.
func cliDocGenerated(t *testing.T) string {
	var b strings.Builder
	section := func(title, help string) {
		fmt.Fprintf(&b, "\n## %s\n\n```\n%s", title, help)
		if !strings.HasSuffix(help, "\n") {
			b.WriteByte('\n')
		}
		b.WriteString("```\n")
	}
	for _, name := range commandOrder {
		if name == "run" {
			section("moebench run", helpOf(t))
			continue
		}
		help := helpOf(t, name)
		subs := regexp.MustCompile(`(?m)^\s+moebench `+regexp.QuoteMeta(name)+` ([a-z][a-z-]*)\b`).FindAllStringSubmatch(help, -1)
		if len(subs) == 0 {
			section("moebench "+name, help)
			continue
		}
		seen := map[string]bool{}
		for _, s := range subs {
			if !seen[s[1]] {
				seen[s[1]] = true
				section("moebench "+name+" "+s[1], helpOf(t, name, s[1]))
			}
		}
	}
	return b.String()
}

// TestCLIDoc: docs/cli.md holds every command's --help as it is now.
// MOEBENCH_UPDATE_DOCS=1 rewrites its generated part (below the marker).
func TestCLIDoc(t *testing.T) {
	raw, err := os.ReadFile(cliDocPath)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(raw, []byte(cliDocMarker))
	if i < 0 {
		t.Fatalf("docs/cli.md lacks its marker line %q", strings.TrimSpace(cliDocMarker))
	}
	want := string(raw[:i+len(cliDocMarker)]) + cliDocGenerated(t)
	if os.Getenv("MOEBENCH_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(cliDocPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if string(raw) != want {
		t.Errorf("docs/cli.md is not what the commands' --help prints; regenerate it with\n  MOEBENCH_UPDATE_DOCS=1 go test -run TestCLIDoc ./cmd/moebench\n(first difference at byte %d)", firstDiff(string(raw), want))
	}
}

func firstDiff(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
