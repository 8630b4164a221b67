"""Fixes in the words of the framework that set DDP up (Accelerate, Lightning's Trainer, Fabric).

A user of Accelerate does not call DistributedDataParallel or torch.save directly: the fix that
helps them names `accelerator.save` and `DistributedDataParallelKwargs`, not DDP's own arguments.
"""

from __future__ import annotations

from ddpdoctor.analysis.evidence import Evidence

_FIXES: dict[str, dict[str, str]] = {
    "save": {
        "accelerate": ("Save once, on the main process: `accelerator.wait_for_everyone()`, then "
                       "`if accelerator.is_main_process: accelerator.save(state, path)`, then "
                       "`accelerator.wait_for_everyone()` before anyone loads it."),
        "lightning": ("Let Lightning save: `trainer.save_checkpoint(path)` or a ModelCheckpoint callback write on "
                      "global rank 0 only; in your own code guard saves with `if trainer.is_global_zero:` (or "
                      "`@rank_zero_only`) and call `trainer.strategy.barrier()` before reading them."),
        "fabric": ("Save with `fabric.save(path, state)`, which writes once, then `fabric.barrier()` before anyone "
                   "loads it with `fabric.load(path)`."),
    },
    "find-unused": {
        "accelerate": ("Use every parameter in the loss or freeze the unused ones (`requires_grad_(False)`) before "
                       "`accelerator.prepare`, or, if they are skipped only on some steps, "
                       "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])`."),
        "lightning": ("Use every parameter in the loss or freeze the unused ones (`requires_grad_(False)`), or, if "
                      "they are skipped only on some steps, `Trainer(strategy=\"ddp_find_unused_parameters_true\")`."),
        "fabric": ("Use every parameter in the loss or freeze the unused ones, or, if they are skipped only on some "
                   "steps, `Fabric(strategy=DDPStrategy(find_unused_parameters=True))`."),
    },
    "needless-find-unused": {
        "accelerate": "Drop `find_unused_parameters=True` from the DistributedDataParallelKwargs you pass to Accelerator.",
        "lightning": "Use `strategy=\"ddp\"` instead of `strategy=\"ddp_find_unused_parameters_true\"`.",
        "fabric": "Drop `find_unused_parameters=True` from the DDPStrategy you pass to Fabric.",
    },
    "uneven": {
        "accelerate": ("Keep Accelerate's `even_batches=True` (the default; "
                       "`Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=True))`), which gives "
                       "every process the same number of batches; `accelerator.join_uneven_inputs` cannot help here "
                       "(it does nothing outside multi-GPU training)."),
        "lightning": ("Keep `Trainer(use_distributed_sampler=True)` (the default), which gives every rank the same "
                      "number of batches, or make a custom sampler pad or drop the last samples."),
        "fabric": ("Let `fabric.setup_dataloaders` add a DistributedSampler (it pads to equal sizes), or make your "
                   "sampler drop the last samples."),
    },
}


def fix(evidence: Evidence, topic: str, default: str) -> str:
    """``default``, or the fix for ``topic`` in the words of the framework the job uses."""
    found = evidence.facts.framework
    return _FIXES.get(topic, {}).get(found[0], default) if found else default
