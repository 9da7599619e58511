package results

import (
	"fmt"
	"strings"
)

// Names that changed: a dispatcher name that meant another design in
// records written before. Readers map such a record to today's name and
// say so (Record.Mapped), so that one name in a table is one algorithm.
//
// deepep --impl library ran NCCL EP's low-latency mode, which is DeepEP's
// low-latency design, not DeepEP's normal mode that native deepep runs;
// that design is now deepep-ll, and deepep --impl library is unavailable
// (no library of DeepEP's normal mode is reachable from Go), with a reason
// that starts so (deepepNormalNoLibrary).
const (
	deepepLL              = "deepep-ll"
	deepepNormalNoLibrary = "no library of DeepEP's normal mode is reachable from Go"
	deepepLLNote          = "recorded as deepep --impl library, the name NCCL EP's low-latency mode (DeepEP's low-latency design, not DeepEP's normal mode) " +
		"had before it was named deepep-ll: read as deepep-ll"
)

// mapOldNames gives rec today's name of its design, and in rec.Mapped the
// note saying so, when it was recorded under an older name.
func mapOldNames(rec *Record) {
	c := &rec.Config
	if c.Dispatcher == "deepep" && c.Impl == "library" && !strings.Contains(rec.Reason, deepepNormalNoLibrary) {
		c.Dispatcher, rec.Mapped = deepepLL, deepepLLNote
	}
}

// MappedNotes are the notes of recs' records read under a new name (one
// line per note: how many records, and the note).
func MappedNotes(recs []Record) []string {
	count := map[string]int{}
	var notes []string
	for _, r := range recs {
		if r.Mapped == "" {
			continue
		}
		if count[r.Mapped] == 0 {
			notes = append(notes, r.Mapped)
		}
		count[r.Mapped]++
	}
	out := make([]string, len(notes))
	for i, n := range notes {
		s := "s"
		if count[n] == 1 {
			s = ""
		}
		out[i] = fmt.Sprintf("%d record%s: %s", count[n], s, n)
	}
	return out
}
