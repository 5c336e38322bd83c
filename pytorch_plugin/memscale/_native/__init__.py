"""The binding of libmemscale.so: loading it (lib), the engine's C declarations (dtr_abi),
the C crossing extension (crossing), the engine handle (engine). Imports nothing above it.
"""
