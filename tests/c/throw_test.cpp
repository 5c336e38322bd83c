// throw_test.cpp - drives memscale_malloc_or_throw the way PyTorch's
// CUDAPluggableAllocator does: from C++, without checking for NULL.
//
//   g++ -O2 -Wall -Wextra -o build/throw_test tests/c/throw_test.cpp -ldl
//   MEMSCALE_BACKEND=sim build/throw_test build/libmemscale.so
//
// The library is loaded with dlopen(RTLD_NOW), as abi_test.c does; the
// backend is always the simulation (a 1 GiB card) under a 64 MiB limit. The
// exception class memscale::OutOfMemoryError is not exported, so the test
// catches std::runtime_error and checks what() (and the dynamic type's
// name). It also sets a reclaimer before the device is opened, and checks
// that the reclaimer freeing an earlier block lets an allocation over the
// limit succeed. Exit status 0 only if every check passed; the last line is
// "N passed, M failed".

#include <dlfcn.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <utility>
#include <string>
#include <typeinfo>

#include "../../cabi/memscale.h"

namespace {

constexpr int64_t MiB = 1024 * 1024;
constexpr int64_t limit = 64 * MiB;

int passed, failed;

decltype(&memscale_malloc_or_throw) malloc_or_throw;
decltype(&memscale_free) free_fn;
decltype(&memscale_set_limit) set_limit;
decltype(&memscale_set_reclaimer) set_reclaimer;
decltype(&memscale_allocated) allocated;
decltype(&memscale_last_error) last_error;

// The type PyTorch casts set_begin_allocate_to_pool's address to
// (torch/csrc/cuda/Module.cpp): the call below is made exactly as PyTorch
// makes it, through its C++ signature, not memscale.h's C declaration.
using BeginAllocateToPool = void(int, std::pair<unsigned long long, unsigned long long>, std::function<bool(void*)>);
BeginAllocateToPool* begin_allocate_to_pool;

void check(bool ok, const char* fmt, ...) {
	if (ok) {
		passed++;
		return;
	}
	failed++;
	va_list ap;
	va_start(ap, fmt);
	std::fprintf(stderr, "FAIL: ");
	std::vfprintf(stderr, fmt, ap);
	std::fprintf(stderr, " (last error: %s)\n", last_error ? last_error() : "?");
	va_end(ap);
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// Held is what the reclaimer may free: one block.
struct Held {
	void* p = nullptr;
	int64_t size = 0;
	int calls = 0;
};

// free_held is the reclaimer: it frees the block it holds, if any.
int64_t free_held(int device, int64_t need, void* ctx) {
	Held* h = static_cast<Held*>(ctx);
	h->calls++;
	if (h->p == nullptr || need <= 0) {
		return 0;
	}
	free_fn(h->p, h->size, device, nullptr);
	h->p = nullptr;
	return h->size;
}

// expect_throw calls memscale_malloc_or_throw(size) and checks that it
// throws a std::runtime_error whose what() starts with the prefix and
// contains every word.
void expect_throw(int64_t size, const char* what, std::initializer_list<const char*> words) {
	try {
		void* p = malloc_or_throw(size, 0, nullptr);
		check(false, "%s: returned %p instead of throwing", what, p);
		if (p != nullptr) {
			free_fn(p, size, 0, nullptr);
		}
	} catch (const std::runtime_error& e) {
		std::string msg = e.what();
		check(msg.rfind("memscale: out of memory: ", 0) == 0, "%s: what() starts with the prefix: %s", what, msg.c_str());
		for (const char* w : words) {
			check(contains(msg, w), "%s: what() mentions \"%s\": %s", what, w, msg.c_str());
		}
		check(contains(typeid(e).name(), "memscale16OutOfMemoryError"), "%s: the exception is a memscale::OutOfMemoryError (%s)",
		      what, typeid(e).name());
	} catch (...) {
		check(false, "%s: threw something other than a std::runtime_error", what);
	}
}

template <typename F>
bool load(void* h, F& fn, const char* name) {
	fn = reinterpret_cast<F>(dlsym(h, name));
	check(fn != nullptr, "dlsym(%s): %s", name, fn ? "" : dlerror());
	return fn != nullptr;
}

} // namespace

int main(int argc, char** argv) {
	if (argc < 2) {
		std::fprintf(stderr, "usage: %s path/to/libmemscale.so\n", argv[0]);
		return 2;
	}
	setenv("MEMSCALE_BACKEND", "sim", 1);
	setenv("MEMSCALE_SIM_CAPACITY", "1GiB", 1);
	if (!getenv("MEMSCALE_LOG_LEVEL")) {
		setenv("MEMSCALE_LOG_LEVEL", "error", 1);
	}
	void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (h == nullptr) {
		std::fprintf(stderr, "dlopen(%s, RTLD_NOW): %s\n", argv[1], dlerror());
		std::printf("0 passed, 1 failed\n");
		return 1;
	}
	bool ok = load(h, last_error, "memscale_last_error") && load(h, malloc_or_throw, "memscale_malloc_or_throw") &&
	          load(h, free_fn, "memscale_free") && load(h, set_limit, "memscale_set_limit") &&
	          load(h, set_reclaimer, "memscale_set_reclaimer") && load(h, allocated, "memscale_allocated") &&
	          load(h, begin_allocate_to_pool, "memscale_begin_allocate_to_pool");
	if (!ok) {
		std::printf("%d passed, %d failed\n", passed, failed);
		return 1;
	}

	// The reclaimer is set before anything opens the device; it holds
	// nothing yet, so it cannot help.
	Held held;
	check(set_reclaimer(0, free_held, &held) == 0, "set_reclaimer before the device is opened");
	check(set_limit(0, limit) == 0, "set_limit(64 MiB)");

	void* a = malloc_or_throw(16 * MiB, 0, nullptr);
	check(a != nullptr, "16 MiB under a 64 MiB limit returns a pointer");
	expect_throw(100 * MiB, "100 MiB over the limit",
	             {"memscale_malloc: 104857600 bytes on device 0", "tried to allocate 100.00 MiB", "allocated 16.00 MiB",
	              "limit 64.00 MiB (67108864 bytes)", "the reclaimer was asked 1 time and freed 0 B"});
	check(held.calls == 1, "the reclaimer installed before the device opened was asked (%d calls)", held.calls);

	// The reclaimer frees the first block: 32 MiB more fits after it.
	void* b = malloc_or_throw(32 * MiB, 0, nullptr);
	check(b != nullptr, "32 MiB with 16 MiB allocated");
	held.p = a;
	held.size = 16 * MiB;
	held.calls = 0;
	void* c = nullptr;
	try {
		c = malloc_or_throw(32 * MiB, 0, nullptr);
	} catch (const std::exception& e) {
		check(false, "32 MiB more with a reclaimer threw: %s", e.what());
	}
	check(c != nullptr, "the reclaimer freed the first block: 32 MiB more fits under the limit");
	check(held.calls == 1 && held.p == nullptr, "the reclaimer was asked once and freed its block (%d calls)", held.calls);
	check(allocated(0) == 64 * MiB, "64 MiB allocated (%lld)", static_cast<long long>(allocated(0)));

	// Without a reclaimer, and for a bad size.
	check(set_reclaimer(0, nullptr, nullptr) == 0, "set_reclaimer(NULL) removes it");
	expect_throw(1 * MiB, "1 MiB with the limit reached", {"no reclaimer installed", "limit 64.00 MiB"});
	expect_throw(-5, "a negative size", {"memscale_malloc", "-5", "negative"});

	// CUDA graph capture is refused before it starts, with a clear message.
	bool threw = false;
	bool filter_called = false;
	try {
		begin_allocate_to_pool(0, {3, 0}, [&](void*) { return filter_called = true; });
	} catch (const std::runtime_error& e) {
		threw = true;
		std::string what = e.what();
		for (const char* word : {"CUDA graph capture is not supported", "device 0, pool (3, 0)", "reduce-overhead",
		                         "max-autotune-no-cudagraphs"}) {
			check(contains(what, word), "begin_allocate_to_pool: what() contains \"%s\": %s", word, what.c_str());
		}
	}
	check(threw, "begin_allocate_to_pool throws std::runtime_error");
	check(!filter_called, "begin_allocate_to_pool does not call the filter");

	free_fn(b, 32 * MiB, 0, nullptr);
	free_fn(c, 32 * MiB, 0, nullptr);
	check(allocated(0) == 0, "everything freed (%lld)", static_cast<long long>(allocated(0)));
	std::printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
