"""The fingerprint schedule is a pure function of the step, the same on every rank."""

from ddpdoctor.schema.sampling import AUTO, describe, should_fingerprint


def test_explicit_interval_starts_at_the_first_step():
    assert [n for n in range(1, 12) if should_fingerprint(n, 5)] == [1, 6, 11]
    assert all(should_fingerprint(n, 1) for n in range(1, 50))


def test_automatic_schedule_is_dense_first_then_sparse():
    sampled = [n for n in range(1, 401) if should_fingerprint(n, AUTO)]
    assert sampled[:10] == list(range(1, 11))
    assert [n for n in sampled if 10 < n <= 200] == list(range(20, 201, 20))
    assert [n for n in sampled if n > 200] == [250, 300, 350, 400]


def test_description_names_the_schedule():
    assert describe(1) == "every step"
    assert describe(7) == "every 7 steps"
    assert describe(AUTO) == "steps 1-10, every 20th to 200, every 50th after"
