package micro

/*
void ms_micro_c_noop(void);
void ms_micro_call_go(int n);
*/
import "C"

import (
	"slices"
	"time"
)

//export msMicroGoNoop
func msMicroGoNoop() {}

// CrossingCost measures one Go-to-C call (what a Go caller pays to reach C)
// and one C-to-Go call (what every memscale_malloc/memscale_free from C or
// PyTorch pays to enter the Go allocator): the median over 7 rounds of the
// mean of n/7 calls each.
func CrossingCost(n int) (goToC, cToGo time.Duration) {
	const rounds = 7
	per := max(1, n/rounds)
	var g, c [rounds]time.Duration
	for r := 0; r < rounds; r++ {
		t0 := time.Now()
		for i := 0; i < per; i++ {
			C.ms_micro_c_noop()
		}
		g[r] = time.Since(t0) / time.Duration(per)
		t0 = time.Now()
		C.ms_micro_call_go(C.int(per))
		c[r] = time.Since(t0) / time.Duration(per)
	}
	slices.Sort(g[:])
	slices.Sort(c[:])
	return g[rounds/2], c[rounds/2]
}
