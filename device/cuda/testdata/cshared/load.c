// Loads a shared library with RTLD_NOW (as ctypes.CDLL and PyTorch do) and
// prints what its probe() returns.
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: load LIB\n");
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 1;
	}
	char *(*probe)(void) = (char *(*)(void))dlsym(h, "probe");
	if (probe == NULL) {
		fprintf(stderr, "dlsym probe: %s\n", dlerror());
		return 1;
	}
	printf("%s\n", probe());
	return 0;
}
