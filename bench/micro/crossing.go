package micro

/*
void ms_micro_c_noop(void);
void ms_micro_call_go(int n);
*/
import "C"

import "time"

//export msMicroGoNoop
func msMicroGoNoop() {}

// CrossingCost measures one Go-to-C call (what a Go caller pays to reach C)
// and one C-to-Go call (what every memscale_malloc/memscale_free from C or
// PyTorch pays to enter the Go allocator), each the mean over n calls.
func CrossingCost(n int) (goToC, cToGo time.Duration) {
	if n <= 0 {
		n = 1
	}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		C.ms_micro_c_noop()
	}
	goToC = time.Since(t0) / time.Duration(n)
	t0 = time.Now()
	C.ms_micro_call_go(C.int(n))
	cToGo = time.Since(t0) / time.Duration(n)
	return goToC, cToGo
}
