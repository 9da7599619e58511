package harnesstest

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
)

// OverlapCase is a small training layer on the deepep design with a shared
// expert, its ranks on two Emus.
func OverlapCase() setup.Config {
	c := Small()
	c.Device, c.Dispatcher, c.SMs = "cuda", "deepep", 4
	c.SharedExperts = 1
	return c
}

// SyncLog is an Emu that logs its Record and Wait calls, in order.
type SyncLog struct {
	*device.Emu
	Mu  *sync.Mutex
	Log *[]string
}

func (d SyncLog) Add(s string) {
	d.Mu.Lock()
	*d.Log = append(*d.Log, s)
	d.Mu.Unlock()
}

func (d SyncLog) Record(e device.Event, s device.Stream) error {
	d.Add(fmt.Sprintf("record %p %p", e, s))
	return d.Emu.Record(e, s)
}

func (d SyncLog) Wait(s device.Stream, e device.Event) error {
	d.Add(fmt.Sprintf("wait %p %p", s, e))
	return d.Emu.Wait(s, e)
}

// TraceOf is a routing trace of n lines for c, each line its own draw.
func TraceOf(t *testing.T, c setup.Config, n int) string {
	g := rand.New(rand.NewPCG(1, 2))
	var tr strings.Builder
	for range n {
		for j, e := range g.Perm(c.Experts)[:c.TopK] {
			if j > 0 {
				tr.WriteString(" ")
			}
			fmt.Fprint(&tr, e)
		}
		tr.WriteString("\n")
	}
	return WriteTrace(t, tr.String())
}
