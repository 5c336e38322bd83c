package sim

// sysMemfdCreate is memfd_create(2) on linux/amd64; package syscall predates it.
const sysMemfdCreate = 319
