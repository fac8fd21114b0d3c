"""WhiteNoise's scan of the static files, done once per test process instead of once per test.

Django's test client builds its middleware for every client, and WhiteNoise's middleware walks every
static directory (plotly's package data among them: tens of thousands of files) when it is built:
0.2 s in each test that requests a page, a fifth of the database tests' time. The walk's result
depends on the directory's files and on the middleware's settings, so it is kept per (directory,
prefix, settings that shape a response, directory and manifest modification times) and replayed:
the same responders a fresh walk would build. The web server of the live stack is not touched.
"""
from __future__ import annotations

import os

from whitenoise.base import WhiteNoise
from whitenoise.middleware import WhiteNoiseMiddleware

_walked: dict[tuple, list] = {}
_update_files_dictionary = WhiteNoise.update_files_dictionary
_add_files_from_finders = WhiteNoiseMiddleware.add_files_from_finders


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _config(self) -> tuple:
    """What shapes the responders besides the files: the middleware's options and the settings they come from."""
    from django.conf import settings

    whitenoise = tuple(sorted((name, repr(getattr(settings, name))) for name in dir(settings)
                              if name.startswith("WHITENOISE_")))
    return (type(self), self.max_age, self.allow_all_origins, self.charset, repr(getattr(self, "mimetypes", None)), self.index_file,
            repr(getattr(self, "add_headers_function", None)), getattr(self, "static_prefix", None), settings.DEBUG, settings.STATIC_URL,
            repr(settings.STORAGES), str(settings.STATIC_ROOT), repr(settings.STATICFILES_DIRS),
            repr(settings.STATICFILES_FINDERS), tuple(settings.INSTALLED_APPS), whitenoise,
            _mtime(os.path.join(str(settings.STATIC_ROOT), "staticfiles.json")))


def _replayed(self, key: tuple, walk) -> None:
    entries = _walked.get(key)
    if entries is None:
        before = dict(self.files)
        walk()
        entries = [(url, found) for url, found in self.files.items() if before.get(url) is not found]
        _walked[key] = entries
    else:
        self.files.update(entries)


def _memo_update_files_dictionary(self, root, prefix):
    _replayed(self, ("dir", root, prefix, _mtime(root), _config(self)),
              lambda: _update_files_dictionary(self, root, prefix))


def _memo_add_files_from_finders(self):
    _replayed(self, ("finders", _config(self)), lambda: _add_files_from_finders(self))


def install() -> None:
    WhiteNoise.update_files_dictionary = _memo_update_files_dictionary
    WhiteNoiseMiddleware.add_files_from_finders = _memo_add_files_from_finders
