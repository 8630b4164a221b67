"""The fingerprint schedule is a pure function of the step, the same on every rank."""

from ddpdoctor.schema.sampling import AUTO, describe, explains, should_fingerprint


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


def test_automatic_schedule_explains_every_step_it_fingerprints():
    assert all(explains(n, AUTO) == should_fingerprint(n, AUTO) for n in range(1, 1001))


def test_every_step_explains_on_the_automatic_schedule():
    assert [n for n in range(1, 1001) if explains(n, 1)] == [n for n in range(1, 1001) if should_fingerprint(n, AUTO)]


def test_an_interval_explains_its_first_step_at_or_after_each_automatic_one():
    for every in (2, 3, 7, 19, 20, 25, 60, 1000):
        fingerprinted = [n for n in range(1, 3001) if should_fingerprint(n, every)]
        automatic = [n for n in range(1, 3001) if should_fingerprint(n, AUTO)]
        expected = sorted({min(f for f in fingerprinted if f >= a) for a in automatic if a <= fingerprinted[-1]})
        assert [n for n in fingerprinted if explains(n, every)] == expected, every
    assert [n for n in range(1, 70) if explains(n, 3)] == [1, 4, 7, 10, 22, 40, 61]
    assert all(explains(n, 50) for n in range(1, 3001) if should_fingerprint(n, 50))
