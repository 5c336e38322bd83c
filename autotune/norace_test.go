//go:build !race

package autotune

const raceEnabled = false
