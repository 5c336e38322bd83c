"""Which of a model's modules are its repeated blocks (:func:`find_blocks`):
what :func:`memscale.blocks` tracks when it is not told, and how
``Config(unit="auto")`` decides between blocks and a region. Holds no state.
"""

from __future__ import annotations

import torch
from torch.nn.utils.parametrize import ParametrizationList

from ..errors import ConfigError


def find_blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's repeated blocks, with their names: the entries of every
    ``ModuleList`` of modules of one class (or ``Sequential`` of two or more)
    that is not inside another such list's entry - a transformer's layers (an
    encoder's and a decoder's, one layer each included), a ResNet's stages -
    in the model's order.

    Raises:
        ConfigError: the model has no such list (pass ``modules=``).
    """
    found: list[tuple[str, torch.nn.Module]] = []
    inside: set[int] = set()  # modules within a chosen block
    for name, module in model.named_modules():
        if id(module) in inside:
            continue
        if isinstance(module, torch.nn.ModuleList):
            if len(module) < 1 or isinstance(module, ParametrizationList):
                continue  # (a parametrization's list is part of a weight, not a stack)
        elif not isinstance(module, torch.nn.Sequential) or len(module) < 2:
            continue  # a Sequential of one module is a wrapper, not a stack
        children = list(module.named_children())
        if len({type(child) for _, child in children}) != 1:
            continue
        for child_name, child in children:
            found.append((f"{name}.{child_name}" if name else child_name, child))
            inside.update(id(m) for m in child.modules())
    if not found:
        raise ConfigError(
            f"memscale.blocks: {type(model).__name__} has no list of repeated blocks (a ModuleList of modules of "
            "one class, or a Sequential of two or more); name the blocks to track with modules=[...]"
        )
    return found
