"""Which rollup grain serves which hours of a range (``billing.grains``, issue 26): each hour once."""
from __future__ import annotations

import datetime as dt
import random

from dashboards.billing import grains

UTC = dt.timezone.utc


def test_pieces_cover_each_hour_once_and_no_day_crosses_a_boundary():
    rng = random.Random(26)
    base = dt.datetime(2026, 3, 1, tzinfo=UTC)
    for _ in range(300):
        begin = base + dt.timedelta(hours=rng.randint(0, 200))
        end = begin + dt.timedelta(hours=rng.randint(0, 24 * 40))
        boundaries = sorted({base + dt.timedelta(hours=rng.randint(0, 24 * 45)) for _ in range(rng.randint(0, 8))})
        days, hours = grains.pieces(begin, end, boundaries)
        covered = []
        for a, b in days:
            assert a.hour == 0 and b.hour == 0 and a < b
            # No day row of the span holds a boundary (one at a day's 00:00 lies between two rows).
            assert not any(a < x < b and x.hour != 0 for x in boundaries)
            covered += [a + dt.timedelta(hours=h) for h in range(int((b - a).total_seconds() // 3600))]
        for a, b in hours:
            covered += [a + dt.timedelta(hours=h) for h in range(int((b - a).total_seconds() // 3600))]
        assert sorted(covered) == [begin + dt.timedelta(hours=h) for h in range(int((end - begin).total_seconds()
                                                                                    // 3600))]
        # Every whole UTC day between two cuts is a day span (the hour rows are read only at the edges).
        cuts = sorted({begin, end, *(x for x in boundaries if begin < x < end)})
        for a, b in zip(cuts, cuts[1:]):
            d = a.replace(hour=0) + (dt.timedelta(days=1) if a.hour else dt.timedelta(0))
            while d + dt.timedelta(days=1) <= b:
                assert any(x <= d and d + dt.timedelta(days=1) <= y for x, y in days)
                d += dt.timedelta(days=1)
    assert grains.pieces(base, base) == ([], [])
    week = grains.pieces(base + dt.timedelta(hours=5), base + dt.timedelta(days=7, hours=5))
    assert week == ([(base + dt.timedelta(days=1), base + dt.timedelta(days=7))],
                    [(base + dt.timedelta(hours=5), base + dt.timedelta(days=1)),
                     (base + dt.timedelta(days=7), base + dt.timedelta(days=7, hours=5))])
