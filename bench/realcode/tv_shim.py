"""Lets PyPI's torchvision 0.28 import beside the CPU build of torch 2.13 (the realcode venv only).

PyPI's torchvision wheel is built against CUDA torch, so its C++ ops library does not load beside
torch+cpu; torchvision then still registers fake kernels for `torchvision::nms` and `qnms`, which
fails because those ops were never defined. This defines their schemas just before torchvision is
imported (nothing else: nms itself still has no kernel; classification models, datasets and
transforms need none). Installed as a .pth hook by the command in README.md; torch is imported only
when torchvision is.
"""

import importlib.abc
import sys


class _DefineTorchvisionOps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        for op in ("nms", "qnms"):
            try:
                torch.library.define(f"torchvision::{op}",
                                     "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            except RuntimeError:
                pass  # already defined: torchvision's own ops did load
        return None


sys.meta_path.insert(0, _DefineTorchvisionOps())
