// Package all registers every dispatcher; import it for its side effect.
//
// The dispatchers: docs/design.md.
package all

import (
	_ "github.com/moebench/moebench/dispatchers/alltoall"
	_ "github.com/moebench/moebench/dispatchers/deepep"
	_ "github.com/moebench/moebench/dispatchers/deepepll"
	_ "github.com/moebench/moebench/dispatchers/feplb"
	_ "github.com/moebench/moebench/dispatchers/hybridep"
	_ "github.com/moebench/moebench/dispatchers/ncclep"
)
