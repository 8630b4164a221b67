"""The rank's probes install when the script imports torch, not before: a script that never
imports torch pays nothing for it, and one that does is probed before its next line runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import json, sys
    from ddpdoctor.rank import probes
    from ddpdoctor.rank.recorder import Recorder
    from ddpdoctor.schema.settings import RankSettings

    rec = Recorder(RankSettings.from_env())
    finish = probes.install(rec)
    from ddpdoctor.rank import callsite
    callsite.is_user_file(__file__ if "__file__" in dir() else "/x/train.py")  # what the watchdog thread does
    seen = {"torch_before": "torch" in sys.modules}
    if sys.argv[2] == "import":
        import torch.distributed as dist  # a submodule first: the package's import fires the hook
        seen["patched"] = hasattr(dist.init_process_group, "__ddpdoctor_wrapped__")
        seen["activity"] = rec.activity
    finish()
    seen["torch_after"] = "torch" in sys.modules
    seen["restored"] = "torch" not in sys.modules or not hasattr(sys.modules["torch"].distributed.init_process_group,
                                                                  "__ddpdoctor_wrapped__")
    rec.close()
    print(json.dumps(seen))
""")


def _run(tmp_path: Path, mode: str) -> tuple[dict, list[dict]]:
    env = {**os.environ, "DDPDOCTOR_EVIDENCE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), mode], capture_output=True, text=True,
                         timeout=120, check=True, env=env).stdout
    events = [json.loads(line) for f in tmp_path.glob("events-*.jsonl") for line in f.read_text().splitlines()]
    return json.loads(out.strip().splitlines()[-1]), events


def test_a_script_that_never_imports_torch_never_imports_it(tmp_path):
    seen, events = _run(tmp_path, "none")
    assert seen == {"torch_before": False, "torch_after": False, "restored": True}
    assert not [e for e in events if e.get("kind") == "probe_error"]


def test_probes_are_in_place_as_soon_as_the_script_imports_torch(tmp_path):
    seen, events = _run(tmp_path, "import")
    assert seen == {"torch_before": False, "patched": True, "activity": "starting", "torch_after": True,
                    "restored": True}
    assert not [e for e in events if e.get("kind") == "probe_error"], events
    assert any(e.get("kind") == "environment" and e.get("torch_version") for e in events)
