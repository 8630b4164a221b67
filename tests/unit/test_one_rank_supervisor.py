"""--against-one-rank's supervisor side: which launches it replays, and the ranks' settings for it."""

from __future__ import annotations

from ddpdoctor.schema.settings import RankSettings
from ddpdoctor.supervisor import one_rank
from ddpdoctor.supervisor.config import RunConfig


def test_only_torchrun_launches_are_replayed():
    asked = RunConfig(script=None, against_one_rank=3)
    assert one_rank.unsupported(asked, "torchrun") is None
    assert one_rank.unsupported(asked, "spawn") == "--against-one-rank replays torchrun launches only (this one: spawn)"
    assert one_rank.unsupported(RunConfig(script=None), "spawn") is None  # not asked for: nothing to refuse


def test_the_ranks_record_into_the_folder_and_the_settings_reach_them():
    config = one_rank.recording(RunConfig(script=None, against_one_rank=2), "/tmp/x")
    settings = RankSettings(evidence_dir="/e", one_rank_role=config.one_rank_role, one_rank_dir=config.one_rank_dir,
                            one_rank_steps=config.against_one_rank or 0)
    back = RankSettings.from_env(settings.to_env())
    assert (back.one_rank_role, back.one_rank_dir, back.one_rank_steps) == ("record", "/tmp/x", 2)
    assert RankSettings.from_env(RankSettings(evidence_dir="/e").to_env()).one_rank_role == ""
