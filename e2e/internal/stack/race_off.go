//go:build !race

package stack

// RaceEnabled reports whether this binary was built with -race; the idemgate
// binary the stack runs is then built with -race too, so the race detector
// watches the server under the end-to-end load as well.
const RaceEnabled = false
