//go:build race

package allocator

// raceEnabled shortens the property runs under the race detector, which
// slows them tenfold; TestConcurrent is the test that needs it.
const raceEnabled = true
