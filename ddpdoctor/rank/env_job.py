"""The job behind `ddpdoctor env`: join the process group as a real job would (NCCL with one GPU
per local rank, else gloo), meet once in a barrier, leave. The environment probe records the rest."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    from ddpdoctor.rank.gpus import real_gpu_count

    if real_gpu_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    dist.barrier()  # on NCCL this creates the communicator: a GPU two ranks share fails here
    dist.destroy_process_group()


if __name__ == "__main__":
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != here]  # rank/ is no top-level package dir
    main()
