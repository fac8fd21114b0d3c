"""A private in-process cache that keeps the project cache's contract: values go through tco's JSON
serializer (tco_web/cache.py), so what Redis could not hold raises here too and what comes back has
the shapes Redis gives back (tuples as lists, Decimal and aware datetimes tagged)."""
from __future__ import annotations

from django.core.cache.backends.locmem import LocMemCache

from tco_web.cache import JSONSerializer

_json = JSONSerializer()


def _as_stored(value):
    return _json.loads(_json.dumps(value))


class JSONLocMemCache(LocMemCache):
    def add(self, key, value, *args, **kwargs):
        return super().add(key, _as_stored(value), *args, **kwargs)

    def set(self, key, value, *args, **kwargs):
        return super().set(key, _as_stored(value), *args, **kwargs)
