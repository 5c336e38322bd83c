"""``python -m memscale``: the ``memscale`` command line (:mod:`memscale._cli`)."""

from __future__ import annotations

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
