package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
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

// docFiles are README.md and every Markdown file under docs/, relative to
// the repository root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir("../../docs", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, strings.TrimPrefix(p, "../../"))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading  = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	fencedCode = regexp.MustCompile("(?ms)^```.*?^```")
)

// anchorOf is GitHub's anchor for a heading: lower case, punctuation
// dropped but for '-' and '_', spaces as '-'.
func anchorOf(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the anchors of a Markdown file's headings.
func anchors(md string) map[string]bool {
	a := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(fencedCode.ReplaceAllString(md, ""), -1) {
		a[anchorOf(m[1])] = true
	}
	return a
}

// TestDocLinks: every relative link of README.md and docs/ names a file of
// the repository, and a link to a heading (#anchor) a heading that file
// has; nothing links outside the repository by a relative path.
func TestDocLinks(t *testing.T) {
	for _, f := range docFiles(t) {
		raw, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		text := fencedCode.ReplaceAllString(string(raw), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(link, "#")
			path := f
			if target != "" {
				path = filepath.Join(filepath.Dir(f), target)
			}
			if rel, err := filepath.Rel(".", path); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s: link %s leaves the repository", f, link)
				continue
			}
			body, err := os.ReadFile(filepath.Join("../..", path))
			if err != nil {
				if st, serr := os.Stat(filepath.Join("../..", path)); serr == nil && st.IsDir() && anchor == "" {
					continue
				}
				t.Errorf("%s: link %s: no such file %s", f, link, path)
				continue
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(string(body))[anchor] {
				t.Errorf("%s: link %s: %s has no heading with anchor #%s", f, link, path, anchor)
			}
		}
	}
}

// TestREADME: the README stays short, its first screen holds the two
// set-up commands, and its test command is the one .ci/run runs.
func TestREADME(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) >= 15000 {
		t.Errorf("README.md has %d bytes; keep it under 15,000 (move the detail into docs/)", len(raw))
	}
	lines := strings.Split(string(raw), "\n")
	first := strings.Join(lines[:min(40, len(lines))], "\n")
	const runCmd, testCmd = "    go run ./cmd/moebench\n", "    go vet ./... && go test -race -timeout 60m ./...\n"
	for _, c := range []string{runCmd, testCmd} {
		if !strings.Contains(first+"\n", c) {
			t.Errorf("README.md's first 40 lines lack the set-up command %q", strings.TrimSpace(c))
		}
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains("\n"+string(ci), "\n"+strings.TrimSpace(testCmd)+"\n") {
		t.Errorf(".ci/run does not run the README's test command %q", strings.TrimSpace(testCmd))
	}
}
