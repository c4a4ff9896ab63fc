"""Repro fp16: does float16 compute work on this GPU?

PASS: an fp16 matmul and a few autocast training steps agree with fp32 and stay finite.
FAIL: an op raises (CUBLAS errors, no kernel image) or the results are wrong / not finite.
SKIP: no CUDA GPU. (Values past the fp16 range are another question: repro fp16-overflow.)
"""

# The program is bf16.py's, run under this file's name so that its RID (and so its dtype) is fp16.
# Like every repro script this file still runs on its own: python fp16.py ['{"option": value}'].
import os

_BODY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bf16.py")
with open(_BODY, encoding="utf-8") as _f:
    exec(compile(_f.read(), _BODY, "exec"))
