"""Fixes in the words of the framework that set DDP up (the Hugging Face Trainer, Accelerate,
Lightning's Trainer, Fabric).

A user of Accelerate does not call DistributedDataParallel or torch.save directly: the fix that
helps them names `accelerator.save` and `DistributedDataParallelKwargs`, not DDP's own arguments.
"""

from __future__ import annotations

from ddpdoctor.analysis import facts
from ddpdoctor.analysis.evidence import Evidence

_FIXES: dict[str, dict[str, str]] = {
    "save": {
        "transformers": ("Let the Trainer save: `trainer.save_model(path)` and its checkpoints (`save_strategy`) write "
                         "on the main process only; guard your own saves with `if trainer.is_world_process_zero():` "
                         "and load them after `trainer.accelerator.wait_for_everyone()`."),
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
        "transformers": ("Use every parameter in the loss or freeze the unused ones (`requires_grad_(False)`), or, if "
                         "they are skipped only on some steps, pass `ddp_find_unused_parameters=True` in "
                         "TrainingArguments (`--ddp_find_unused_parameters True`)."),
        "accelerate": ("Use every parameter in the loss or freeze the unused ones (`requires_grad_(False)`) before "
                       "`accelerator.prepare`, or, if they are skipped only on some steps, "
                       "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])`."),
        "lightning": ("Use every parameter in the loss or freeze the unused ones (`requires_grad_(False)`), or, if "
                      "they are skipped only on some steps, `Trainer(strategy=\"ddp_find_unused_parameters_true\")`."),
        "fabric": ("Use every parameter in the loss or freeze the unused ones, or, if they are skipped only on some "
                   "steps, `Fabric(strategy=DDPStrategy(find_unused_parameters=True))`."),
    },
    "needless-find-unused": {
        "transformers": ("Pass `ddp_find_unused_parameters=False` in TrainingArguments (`--ddp_find_unused_parameters "
                         "False`): the Trainer turns it on by default unless gradient checkpointing is enabled."),
        "accelerate": ("Drop `find_unused_parameters=True` from the DistributedDataParallelKwargs you pass to "
                       "Accelerator."),
        "lightning": "Use `strategy=\"ddp\"` instead of `strategy=\"ddp_find_unused_parameters_true\"`.",
        "fabric": "Drop `find_unused_parameters=True` from the DDPStrategy you pass to Fabric.",
    },
    "uneven": {
        "transformers": ("Keep the Trainer's own data loading (`accelerator_config={\"even_batches\": True}`, the "
                         "default), which gives every process the same number of batches."),
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
    found = facts.ddp.framework(evidence)
    return _FIXES.get(topic, {}).get(found[0], default) if found else default
