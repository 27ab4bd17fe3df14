"""A mend for vLLM 0.32's CPU engine, put on a server's PYTHONPATH through its recipe's env (Python imports
sitecustomize at start, in the engine's processes too).

The CPU engine replaces the rejection sampler's Triton kernels with C++ ones. Its stand-in for `expand_kernel`
(vllm.utils.cpu_triton_utils._expand_kernel_impl) hands the C++ kernel an int64 copy of its output, so the output
itself is never written. With speculative decoding and sampling, that output is each draft token's temperature
(and top-k, top-p): the sampler then divides the logits by whatever the memory held, the target's probabilities
are inf and NaN, nearly every draft is rejected and the answers turn to salad. Greedy requests never expand, so
they are unaffected. Measured here with n-gram drafts at temperature 0.3: 0 of 108 draft tokens accepted without
this mend.

This replaces that stand-in with a few lines of torch, as the module is imported."""

import importlib.abc
import importlib.util
import sys

MENDED = "vllm.utils.cpu_triton_utils"


def _expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """expand_kernel's contract: request i's value, replace_from made replace_to, written over its tokens."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    if not len(ends):
        return
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output[: int(ends[-1])] = torch.repeat_interleave(values, counts)


class _Mend(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MENDED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module._expand_kernel_impl = _expand

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Mend())
