"""--html is one self-contained page (one timeline lane per rank, the code, nothing fetched), --trace
is Chrome trace-event JSON with one track per rank, and the report's timeline stays bounded."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from builders import SCRIPT, collective, init_pg, make_evidence, process_start, save, stop_snapshot
from builders import step as step_event

from ddpdoctor.analysis.registry import load_checks
from ddpdoctor.analysis.render.html import render_html
from ddpdoctor.analysis.render.chrome_trace import render_trace
from ddpdoctor.analysis.report import Report
from ddpdoctor.analysis.report_builder import build_report
from ddpdoctor.analysis.runner import analyze
from ddpdoctor.analysis.timeline import TOTAL_POINTS, build_timeline, points_per_rank


def timed_step(n: int, t: float):
    event = step_event(n, t=t)
    event.timing = [0.002, 0.05, 0.03, 0.01, 0.001]
    return event


def hung_job(world_size: int = 3, steps: int = 6):
    """Every rank trains ``steps`` steps; rank 0 then calls a barrier the others never call."""
    events = {}
    for rank in range(world_size):
        evs = [process_start(t=100.0), init_pg(world_size, t=100.5)]
        evs += [timed_step(n, 101.0 + n * 0.1 * (1 + rank)) for n in range(1, steps + 1)]
        evs.append(collective("all_reduce", 1, t=102.0))
        if rank == 0:
            s = save("/ckpt/model.pt", seq_start=1)
            s.t, s.dur_s = 102.5, 0.25
            evs += [s, collective("barrier", 2, shape=None, t=103.0)]
        events[rank] = evs
    stop = stop_snapshot({r: {} for r in range(world_size)}, {}, threshold_s=5.0)
    stop.t = 109.0
    return make_evidence(world_size, events, outcome="hung", stop=stop)


def report_of(evidence) -> Report:
    return build_report(evidence, analyze(evidence, load_checks()), version="0", script=SCRIPT, argv=[],
                        duration_s=9.0)


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.lanes: list[str] = []
        self.urls: list[str] = []
        self.tags: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attrs = dict(attrs)
        if tag == "g" and "lane" in (attrs.get("class") or "").split():
            self.lanes.append(attrs.get("data-rank"))
        for name in ("src", "href", "xlink:href", "action", "data"):
            if attrs.get(name):
                self.urls.append(attrs[name])

    def handle_data(self, data):
        self.text.append(data)


def parsed(html: str) -> Page:
    page = Page()
    page.feed(html)
    return page


def test_the_html_has_one_timeline_lane_per_rank_and_fetches_nothing():
    report = report_of(hung_job(world_size=3))
    html = render_html(report)
    page = parsed(html)
    assert page.lanes == ["0", "1", "2"]
    assert page.urls == [] and "http://" not in html and "https://" not in html and "@import" not in html
    assert {"svg", "style", "table"} <= page.tags and "script" not in page.tags
    text = "".join(page.text)
    assert "verdict: NOT OK" in text and "collective-hang" in text and "fix:" in text
    assert "#2 first divergence" in text and "never called #2" in text
    assert "ddpdoctor stopped the job (hang)" in text
    assert "Step time per rank" in text and "Environment" not in text  # no rank recorded its environment


def test_the_html_shows_the_code_line_of_a_finding(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("import torch\n\n\ndef main():\n    dist.barrier()  # rank 0 only\n")
    report = Report(version="0", script=str(train), argv=[], world_size=2, nnodes=1, backend="gloo", device="cpu",
                    outcome="hung", duration_s=1.0, launch_mode="torchrun", findings=report_of(hung_job(2)).findings)
    report.findings = [type(f)(**{**f.__dict__, "location": type(f.location)(str(train), 5)}) if f.location else f
                       for f in report.findings]
    text = "".join(parsed(render_html(report)).text)
    assert "dist.barrier()  # rank 0 only" in text and "^^^^^^^^^^^^^^" in text


def test_the_trace_has_the_event_fields_and_one_track_per_rank():
    trace = render_trace(report_of(hung_job(world_size=3)))
    json.dumps(trace)  # serializable as is
    events = trace["traceEvents"]
    assert events and all({"ph", "ts", "pid", "tid"} <= set(e) for e in events)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    assert {e["pid"] for e in events} == {0, 1, 2}
    by_name = {e["name"] for e in events}
    assert {"before the first step", "step 1", "forward", "backward", "optimizer.step", "data wait", "after step 6",
            "all_reduce #1",
            "barrier #2 (first divergence)", "torch.save model.pt", "no progress"} <= by_name
    step_1 = next(e for e in events if e["name"] == "step 1" and e["pid"] == 0)
    assert step_1["ph"] == "X" and step_1["dur"] > 0
    for pid in (0, 1, 2):  # spans of a track nest or follow one another: viewers draw them as a stack
        spans = sorted(((e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and e["pid"] == pid
                        and e["tid"] == 0), key=lambda s: (s[0], -s[1]))
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-6 or b1 <= a1 + 1e-6, ((a0, a1), (b0, b1))
    collective_2 = next(e for e in events if e["name"].startswith("barrier #2"))
    assert collective_2["ph"] == "i" and collective_2["args"]["sequence"] == 2


def test_the_timeline_is_bounded_for_long_runs_and_many_ranks():
    world_size = 1024
    limit = points_per_rank(world_size)
    assert limit * world_size <= TOTAL_POINTS
    shared = [init_pg(world_size, t=0.5), *[step_event(n, t=float(n)) for n in range(1, 121)]]
    evidence = make_evidence(world_size, {r: shared for r in range(world_size)})  # one list: no copies
    timeline = build_timeline(evidence)
    lane = timeline["ranks"]["1023"]
    assert len(lane["steps"]) == limit and lane["dropped_steps"] == 120 - limit
    assert lane["steps"][0][1] == 1 and lane["steps"][-1][1] == 120  # first and last kept
    assert len(json.dumps(timeline)) < 3_000_000


def test_ddps_own_collectives_are_on_the_timeline_with_their_numbers():
    from ddpdoctor.schema.events import InternalCollectives

    internal = InternalCollectives(t=102.5, first=2, count=2, phase="ddp-backward")
    evidence = make_evidence(2, {0: [init_pg(2, t=100.0), collective("all_reduce", 1, t=101.0),
                                     collective("barrier", 2, shape=None, t=103.0)],
                                 1: [init_pg(2, t=100.0), collective("all_reduce", 1, t=101.0), internal]})
    lanes = build_timeline(evidence)["ranks"]
    assert [c[1:] for c in lanes["1"]["collectives"]] == [[1, "all_reduce"], [2, "DDP's gradient all-reduce"],
                                                          [3, "DDP's gradient all-reduce"]]
    assert "never called" not in render_html(report_of(evidence))


def test_ddps_collectives_booked_at_the_stack_dump_are_drawn_where_the_rank_stopped():
    from ddpdoctor.schema.events import InternalCollectives

    stop = stop_snapshot({0: {}, 1: {}}, {}, threshold_s=5.0)  # every rank stalled 31 s
    stop.t = 140.0
    late = InternalCollectives(t=139.5, first=2, count=1, phase="ddp-backward")  # flushed by the dump
    evidence = make_evidence(2, {0: [init_pg(2, t=100.0), collective("barrier", 2, shape=None, t=103.0)],
                                 1: [init_pg(2, t=100.0), timed_step(1, 103.2), late]}, outcome="hung", stop=stop)
    (tick,) = build_timeline(evidence)["ranks"]["1"]["collectives"]
    assert tick[1:] == [2, "DDP's gradient all-reduce"] and tick[0] == 3.2  # at its last event, not the dump


# -- the timeline's axis: training to scale, start-up and a hang's wait as bands ------------------------

def started_job(*, first_collective: float = 103.0, stop=None, outcome: str = "completed"):
    """Both ranks start at 100 s, import torch by 101 s, init the process group at 101.5 s and train
    from their first collective at ``first_collective`` (steps every 0.1 s after it)."""
    from ddpdoctor.schema.events import RankEnvironment

    events = {}
    for rank in range(2):
        events[rank] = [process_start(t=100.0 + rank * 0.2), RankEnvironment(t=101.0 + rank * 0.1),
                        init_pg(2, t=101.5), collective("all_reduce", 1, t=first_collective),
                        *[timed_step(n, first_collective + 0.1 * n) for n in range(1, 6)]]
    return make_evidence(2, events, outcome=outcome, stop=stop)


def test_the_axis_starts_where_training_starts_and_start_up_is_one_labelled_band():
    from ddpdoctor.analysis.render.svg import BAND_GAP, BAND_W, LABEL_W, TimeAxis, timeline_svg

    timeline = build_timeline(started_job())
    assert timeline["startup"] == {"end": 3.0, "milestones": [["import torch", 1.0], ["init_process_group", 1.5]]}
    axis = TimeAxis(timeline, left=LABEL_W, right=LABEL_W + 1000)
    assert axis.start == 3.0 and axis(0.0) == LABEL_W and axis(1.5) == LABEL_W + BAND_W / 2  # start-up: the band
    assert axis(3.0) == LABEL_W + BAND_W + BAND_GAP and axis(timeline["end"]) == LABEL_W + 1000  # training: the rest
    assert all(tick >= 3.0 for tick in axis.ticks())
    page = parsed(timeline_svg(timeline))
    words = "".join(page.text)
    assert "start-up 3.0 s" in words and "import torch 1.0 s" in words and "init_process_group 500 ms" in words
    assert "rest of set-up 1.5 s" in words and "the axis starts at training (3.00 s)" in words


def test_training_starts_at_the_first_ddp_forward_when_it_comes_before_any_collective():
    evidence = make_evidence(2, {0: [process_start(t=100.0), collective("all_reduce", 1, t=104.0)],
                                 1: [process_start(t=100.0), timed_step(1, 103.55)]})  # its forward: 0.05 s before
    assert build_timeline(evidence)["startup"]["end"] == 3.5


def test_without_training_the_axis_starts_at_the_first_process_and_has_no_band():
    from ddpdoctor.analysis.render.svg import LABEL_W, TimeAxis, timeline_svg

    evidence = make_evidence(2, {r: [process_start(t=100.0), init_pg(2, t=101.5)] for r in range(2)})
    timeline = build_timeline(evidence)
    assert timeline["startup"] is None
    assert TimeAxis(timeline, left=LABEL_W, right=LABEL_W + 1000)(0.0) == LABEL_W
    assert "start-up" not in "".join(parsed(timeline_svg(timeline)).text)


def test_a_hangs_wait_is_a_band_too_so_the_steps_before_it_keep_the_width():
    from ddpdoctor.analysis.render.svg import BAND_W, LABEL_W, TimeAxis, timeline_svg

    stop = stop_snapshot({0: {}, 1: {}}, {}, threshold_s=5.0)
    stop.t = 140.0  # every rank stalled 31 s, from 109 s: long after its last step (103.5 s)
    timeline = build_timeline(started_job(stop=stop, outcome="hung"))
    axis = TimeAxis(timeline, left=LABEL_W, right=LABEL_W + 1000)
    idle = axis.band("idle")
    assert idle is not None and idle.x1 - idle.x0 == BAND_W and idle.t1 == 40.0
    assert idle.t0 > 3.5  # after the last step, with room for its label
    training = axis.pieces[1]
    assert (training.t0, training.band) == (3.0, "") and training.x1 - training.x0 > 500  # most of the width
    words = "".join(parsed(timeline_svg(timeline)).text)
    assert "no progress" in words and "ddpdoctor stopped the job (hang) at 40.0 s" in words


def test_a_post_mortems_stop_is_the_dumps_not_ddpdoctor():
    from ddpdoctor.analysis.render.svg import timeline_svg

    stop = stop_snapshot({0: {}, 1: {}}, {}, threshold_s=5.0)
    stop.t = 140.0
    evidence = started_job(stop=stop, outcome="hung")
    evidence.observations.launch_mode = "post-mortem"
    timeline = build_timeline(evidence)
    assert timeline["stop"]["label"] == "flight recorder dumps (hang)"
    words = "".join(parsed(timeline_svg(timeline)).text)
    assert "ddpdoctor stopped" not in words and "flight recorder dumps (hang) at 40.0 s" in words
    assert "ddpdoctor stopped" not in json.dumps(render_trace(report_of(evidence)))
