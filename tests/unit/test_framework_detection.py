"""Framework awareness: who built DDP, read from the constructing stack; fixes in its words."""

from __future__ import annotations

import sys

from builders import ddp_wrap, make_evidence, merge, on_all, usage

from ddpdoctor.analysis.report_builder import framework_of
from ddpdoctor.checks import unused_parameters
from ddpdoctor.rank.frameworks import framework_of as framework_on_stack


def _called_from(path: str):
    """framework_of() as seen from a function whose code lives at ``path``."""
    namespace: dict = {}
    exec(compile("def build(probe):\n    return probe(sys._getframe())\n", path, "exec"), {"sys": sys}, namespace)
    return namespace["build"](framework_on_stack)


def test_the_framework_on_the_stack_is_named():
    assert _called_from("/venv/site-packages/accelerate/accelerator.py")[0] == "accelerate"
    assert _called_from("/venv/site-packages/lightning/pytorch/strategies/ddp.py")[0] == "lightning"
    assert _called_from("/venv/site-packages/lightning/fabric/strategies/ddp.py")[0] == "fabric"
    assert _called_from("/job/train.py") == (None, None)


def test_the_hf_trainer_is_named_over_the_accelerate_it_sets_ddp_up_with():
    namespace: dict = {}
    exec(compile("def prepare(probe):\n    return probe(sys._getframe())\n",
                 "/venv/site-packages/accelerate/accelerator.py", "exec"), {"sys": sys}, namespace)
    prepare = namespace["prepare"]
    exec(compile("def train(probe):\n    return prepare(probe)\n", "/venv/site-packages/transformers/trainer.py",
                 "exec"), {"prepare": prepare}, namespace)
    assert namespace["train"](framework_on_stack)[0] == "transformers"


def _evidence(framework):
    wrap = ddp_wrap(params=("head.weight",))
    wrap.framework, wrap.framework_version = framework, "1.0"
    return make_evidence(2, merge(on_all(2, wrap), on_all(2, usage(3, {0: 3}))))


def test_fixes_use_the_frameworks_words():
    (finding,) = unused_parameters.analyze(_evidence("lightning")).findings
    assert 'strategy="ddp_find_unused_parameters_true"' in finding.fix
    (finding,) = unused_parameters.analyze(_evidence("accelerate")).findings
    assert "DistributedDataParallelKwargs(find_unused_parameters=True)" in finding.fix
    (finding,) = unused_parameters.analyze(_evidence(None)).findings
    assert "find_unused_parameters=True" in finding.fix and "Accelerator" not in finding.fix


def test_a_needless_find_unused_under_the_hf_trainer_names_its_training_argument():
    wrap = ddp_wrap(params=("head.weight",), find_unused_parameters=True)
    wrap.framework, wrap.framework_version = "transformers", "5.23.0"
    evidence = make_evidence(2, merge(on_all(2, wrap), on_all(2, usage(8))))
    (finding,) = unused_parameters.analyze(evidence).findings
    assert finding.severity == "warning" and "ddp_find_unused_parameters=False" in finding.fix
    assert framework_of(evidence)["title"] == "Hugging Face Trainer"


def test_the_report_names_the_framework():
    assert framework_of(_evidence("fabric")) == {"name": "fabric", "title": "Lightning Fabric", "version": "1.0"}
    assert framework_of(_evidence(None)) is None
