package sim

// sysMemfdCreate is memfd_create(2) on linux/arm64.
const sysMemfdCreate = 279
