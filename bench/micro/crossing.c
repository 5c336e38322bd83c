#include "_cgo_export.h"

void ms_micro_c_noop(void) {}

void ms_micro_call_go(int n) {
	for (int i = 0; i < n; i++) {
		msMicroGoNoop();
	}
}
