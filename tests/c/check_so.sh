#!/bin/sh
# check_so.sh - static checks on a built libmemscale.so:
#   1. every undefined dynamic symbol comes from glibc (libc/libdl/libpthread
#      are all versioned GLIBC_*), from libstdc++ (GLIBCXX_*, CXXABI_*: the
#      C++ of memscale_malloc_or_throw, cabi/throwing.cpp) or libgcc_s
#      (GCC_*: the unwinder), or is weak, so dlopen(RTLD_NOW) - ctypes.CDLL,
#      PyTorch's loader - works on a machine without CUDA;
#   2. nothing from go-nvml is linked in (it leaves ~400 undefined symbols);
#   3. every public export of memscale.h is defined;
#   4. no C++ symbol is exported (the exception class's type information
#      stays inside the library).
# usage: tests/c/check_so.sh build/libmemscale.so [path/to/memscale.h]
set -eu
so=${1:?usage: check_so.sh path/to/libmemscale.so [memscale.h]}
hdr=${2:-$(dirname "$0")/../../cabi/memscale.h}
fail=0

bad=$(nm -D --undefined-only "$so" | awk '$1 == "U" && $2 !~ /@(GLIBC|GLIBCXX|CXXABI|GCC)_/ {print $2}')
if [ -n "$bad" ]; then
	echo "FAIL: undefined symbols not provided by glibc, libstdc++ or libgcc_s:"; echo "$bad" | sed 's/^/  /'
	fail=1
fi
if nm -D "$so" | grep -qi nvml; then
	echo "FAIL: go-nvml symbols are linked in:"; nm -D "$so" | grep -i nvml | head -5 | sed 's/^/  /'
	fail=1
fi
defined=$(nm -D --defined-only "$so" | awk '{print $3}')
cxx=$(echo "$defined" | grep '^_Z' || true)
if [ -n "$cxx" ]; then
	echo "FAIL: C++ symbols are exported:"; echo "$cxx" | head -5 | sed 's/^/  /'
	fail=1
fi
for f in $(grep -oE '\bmemscale_[a-z_]+\(' "$hdr" | tr -d '(' | sort -u); do
	if ! echo "$defined" | grep -qx "$f"; then
		echo "FAIL: $f is declared in $(basename "$hdr") but not exported"
		fail=1
	fi
done
if [ "$fail" = 0 ]; then
	echo "ok: $so: $(nm -D --undefined-only "$so" | wc -l) undefined symbols, all glibc, libstdc++, libgcc_s or weak; no nvml; every memscale.h export defined; no C++ symbol exported"
fi
exit $fail
