"""The memscale version: the same number as libmemscale.so's (``MEMSCALE_VERSION``
in ``cabi/memscale.h``) and the ``memscale`` command's. The wheel build refuses
to build when they differ, and :func:`memscale._native.lib.lib` refuses a library of
another version."""

__version__ = "0.2.0"
