"""The drop-in API: a region per training step with no code change. Where budgets come
from (budget), the steps (steps, fitting), enable() and memscale run (enable),
wrap()/optimize() (api), torchrun/DDP/FSDP2 (distributed), memscale 0.1 (compat).
"""
