// Package harnesstest holds the test helpers that need only
// harness/setup and that the tests of the packages above it share:
// configurations and Emu wrappers. Test code cannot be imported, so these
// helpers live here as ordinary code; nothing but tests imports it.
package harnesstest
