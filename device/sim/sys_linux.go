package sim

import (
	"fmt"
	"syscall"
	"unsafe"
)

// Raw memory-management system calls. syscall.Mmap cannot place a mapping at a
// fixed address and package syscall has no memfd_create, so the calls are made
// directly; golang.org/x/sys is not a dependency of this module.

const (
	mfdCloexec      = 0x1 // MFD_CLOEXEC
	fallocKeepSize  = 0x1 // FALLOC_FL_KEEP_SIZE
	fallocPunchHole = 0x2 // FALLOC_FL_PUNCH_HOLE
)

// mmap is mmap(2) returning the raw address.
func mmap(addr uintptr, length uint64, prot, flags, fd int, off int64) (uintptr, error) {
	r, _, errno := syscall.Syscall6(syscall.SYS_MMAP, addr, uintptr(length), uintptr(prot), uintptr(flags), uintptr(fd), uintptr(off))
	if errno != 0 {
		return 0, errno
	}
	return r, nil
}

// munmap is munmap(2).
func munmap(addr uintptr, length uint64) error {
	_, _, errno := syscall.Syscall(syscall.SYS_MUNMAP, addr, uintptr(length), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// reserveNone maps length bytes of inaccessible, unbacked address space. With
// fixed set it replaces whatever is mapped at addr.
func reserveNone(addr uintptr, length uint64, fixed bool) (uintptr, error) {
	flags := syscall.MAP_PRIVATE | syscall.MAP_ANONYMOUS | syscall.MAP_NORESERVE
	if fixed {
		flags |= syscall.MAP_FIXED
	}
	return mmap(addr, length, syscall.PROT_NONE, flags, -1, 0)
}

// memfdCreate creates an anonymous memory file.
func memfdCreate(name string) (int, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return -1, fmt.Errorf("memfd name %q: %w", name, err)
	}
	fd, _, errno := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(p)), mfdCloexec, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// punchHole frees the pages of [off, off+length) in the file fd.
func punchHole(fd int, off int64, length uint64) error {
	return syscall.Fallocate(fd, fallocPunchHole|fallocKeepSize, off, int64(length))
}

// hostBytes views n bytes at the raw address p as a byte slice. The memory is
// not managed by Go; the caller guarantees it stays mapped while in use.
func hostBytes(p uintptr, n uint64) []byte {
	// Going through a pointer to the uintptr keeps vet's unsafeptr check
	// quiet: p is a raw address outside the Go heap, not a hidden Go pointer.
	ptr := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	return unsafe.Slice((*byte)(ptr), n)
}
