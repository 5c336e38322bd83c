// Command cabi is libmemscale.so: built with
//
//	go build -buildmode=c-shared -o build/libmemscale.so ./cabi
//
// it exports the C ABI declared in cabi/memscale.h - the PyTorch pluggable
// allocator pair (memscale_malloc / memscale_free) and its optional hooks,
// statistics and snapshots as JSON, configuration, the last error, and the DTR
// engine's API for the Python plugin.
//
// Layout of the package:
//
//   - abi.c: the public C entry points. Each checks the fork guard and then
//     calls a Go export named memscale_go_*; also the last-error store and
//     the pure-C calls (memscale_last_error, memscale_string_free, ...).
//   - export.go: setError, guard and cString, used by every export.
//   - state.go: configuration from the environment and the lazily created
//     per-device allocators; env.go reads libc's environment (the Go
//     runtime's copy is the one from process start).
//   - alloc.go: the allocator-side Go exports; report.go: the JSON of
//     memscale_config_json and memscale_snapshot_json.
//   - engine.go: the DTR engine exports (memscale_dtr_*).
//   - reclaim.go: the host's reclaimers (memscale_set_reclaimer) and the C
//     trampoline that calls them, the reclaim shortfall that
//     memscale_dtr_reclaim records for the out-of-memory message, and the
//     one-time warning about an eviction threshold nothing enforces.
//   - throwing.cpp: memscale_malloc_or_throw, compiled by cgo with g++ (so
//     the library needs libstdc++ and libgcc_s).
//   - testhelpers.go: Go and C helpers for the tests (test files cannot use
//     cgo).
//
// The public header is cabi/memscale.h. The header go build writes next to
// the .so (libmemscale.h) declares the internal memscale_go_* names and is
// not for users.
package main

// main is required by -buildmode=c-shared and never runs.
func main() {}
