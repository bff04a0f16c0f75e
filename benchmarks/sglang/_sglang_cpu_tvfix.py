"""CPU shim, loaded by _sglang_cpu_tvfix.pth (not part of SGLang).

PyPI's torchvision wheel links libtorch_cuda; with the CPU torch wheel its C ops do not load,
and torchvision/_meta_registrations.py then fails on register_fake("torchvision::nms").
sglang.srt.configs imports torchvision.transforms at module level (multimodal/internvl_utils.py),
so memory_pool.py cannot be imported. On the first `import torchvision`, and only with a CPU
torch, define the two op schemas so torchvision's Python parts import; its C ops stay unusable,
which nothing on the KV-cache path needs."""

import importlib.abc
import sys


class _TorchvisionCpuFix(importlib.abc.MetaPathFinder):
    lib = None

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        if torch.version.cuda is None and torch.version.hip is None:
            lib = torch.library.Library("torchvision", "FRAGMENT")
            for op in ("nms", "qnms"):
                lib.define(op + "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _TorchvisionCpuFix.lib = lib
        return None


sys.meta_path.insert(0, _TorchvisionCpuFix())
