"""Imported first by the child processes that run our Triton kernels in Triton's interpreter
(``TRITON_INTERPRET=1``, read when Triton is imported): checks the variable and mends the interpreter
for NumPy >= 2.4."""
from __future__ import annotations

import os

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
import triton.runtime.interpreter as interpreter  # noqa: E402

_patch_lang_tensor = interpreter._patch_lang_tensor


def _patch_with_numpy_2_4(tensor, scope) -> None:
    """Triton 3.6's interpreter turns a scalar into an int with ``int(array)``, which NumPy >= 2.4
    refuses for a one-element 1-d array (a runtime loop bound); index its single element instead."""
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


interpreter._patch_lang_tensor = _patch_with_numpy_2_4
