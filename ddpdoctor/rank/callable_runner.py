"""Runs a pickled callable on this rank inside an initialized gloo process group.

The ``ddpdoctor`` pytest fixture's ``run(fn, *args)`` gives ddpdoctor this file as the script and
the path of a pickle of ``(caller's sys.path, pickle.dumps((fn, args)))`` as its argument: the
caller's path goes in first, so unpickling ``fn`` can import the module defining it (a test module).
"""

from __future__ import annotations

import os
import pickle
import sys

import torch.distributed as dist


def main(payload_path: str) -> None:
    with open(payload_path, "rb") as f:
        caller_path, call = pickle.load(f)
    sys.path[:] = [*caller_path, *(p for p in sys.path if p not in caller_path)]
    fn, args = pickle.loads(call)
    dist.init_process_group("gloo")
    fn(*args)
    if dist.is_initialized():  # fn may have destroyed it itself
        dist.destroy_process_group()


if __name__ == "__main__":
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != here]  # rank/ is no top-level package dir
    main(sys.argv[1])
