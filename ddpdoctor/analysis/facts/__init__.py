"""Facts derived from the evidence once and shared by several consumers, so that checks never import each other.

One module per domain: :mod:`.ddp` (the process group, DDP modules and their usage), :mod:`.steps`
(optimizer steps, their fingerprints), :mod:`.loaders` (loader passes paired across ranks),
:mod:`.collectives` (world collective traces) and :mod:`.failures` (how ranks failed). A fact is a
function of an :class:`~ddpdoctor.analysis.evidence.Evidence`, computed on its first use and cached on
that evidence (:mod:`.derived`). A fact with a single consumer lives in that consumer, not here.
"""

from . import collectives, ddp, failures, loaders, steps

__all__ = ["collectives", "ddp", "failures", "loaders", "steps"]
