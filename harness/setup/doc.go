// Package setup is what a moebench run is given and carries to the layers:
// Config (presets, validation, the record's configuration), Env (what the
// process gives a run: devices, dump, progress, rendezvous, interrupt),
// routing generators, the settings a run's processes must share, the
// budget of steps, the host memory estimate, and the progress line and the
// interrupt, which Config carries. It imports no other harness package
// (docs/design.md, Packages).
package setup
