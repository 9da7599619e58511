package setup

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/launch"
)

// TestSettingsOf: every exported field of Config (Shape's among them) is a
// setting the processes compare, by its flag, then the version; a run that
// differs in one field differs in that setting alone, and Compare names it
// with both values.
func TestSettingsOf(t *testing.T) {
	c := DefaultConfig()
	fields := 0
	for _, typ := range []reflect.Type{reflect.TypeOf(c), reflect.TypeOf(c.Shape)} {
		for i := range typ.NumField() {
			if f := typ.Field(i); f.IsExported() && !f.Anonymous && f.Name != "CheckAll" { // CheckAll: in --check's word
				fields++
			}
		}
	}
	a := SettingsOf(c, "v1")
	if len(a) != fields+1 || a[len(a)-1] != (launch.Setting{Name: "moebench's version", Value: "v1"}) {
		t.Fatalf("%d settings for %d fields: %v", len(a), fields, a)
	}
	for _, s := range a[:len(a)-1] {
		if !strings.HasPrefix(s.Name, "--") {
			t.Errorf("setting %q is not a flag", s.Name)
		}
	}
	c.Seed, c.Routing = 7, Routing{Kind: RoutingSkewed, Alpha: 1.2}
	err := launch.Compare([][]launch.Setting{a, SettingsOf(c, "v1")})
	var ce *ConfigError
	if err == nil || AsSettingsError(err) == nil || !errors.As(AsSettingsError(err), &ce) ||
		!strings.Contains(err.Error(), "--routing differs: process 0 has balanced, process 1 has skewed:1.2; --seed differs: process 0 has 1, process 1 has 7") ||
		strings.Count(err.Error(), " differs: ") != 2 {
		t.Errorf("%v", err)
	}
	all := DefaultConfig()
	all.CheckAll = true
	if err := launch.Compare([][]launch.Setting{a, SettingsOf(all, "v1")}); err == nil || !strings.Contains(err.Error(), "--check differs: process 0 has sample, process 1 has all") {
		t.Errorf("--check all against sample: %v", err)
	}
}
