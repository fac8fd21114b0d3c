"""This install's id: what tells its Grid Engine jobs from another tco install's on a shared cell.

Two installs that share a cell and a submit account (``TCO_SUBMIT_USER``) both number their
campaigns from 1, so a job name made of the campaign id alone (``tco-c<id>-<name>``, before
migration 0025) was the same for install A's campaign 5 and install B's: B's reconciler could
adopt A's job (issue 23, trust7). The job name now carries the install id
(``launch.submit.campaign_job_name``: ``tco-<install>-c<id>-<name>``).

The id is the setting ``TCO_INSTALL_ID`` when set (3-12 of ``[a-z0-9]``, checked when the settings
load), else the ``Install`` row's (pk 1), made by migration 0025 with :func:`new_install_id`, or by
the first caller that finds no row (a database flushed by a test). Every process of one install
(web, workers, beat) reads the same setting or the same row, and a restart changes neither.
"""
from __future__ import annotations

import re
import secrets
import string

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

#: An id's alphabet and length: 36**8 (2.8e12) ids, and Grid Engine takes every character in a job name.
ALPHABET = string.ascii_lowercase + string.digits
LENGTH = 8
#: Ids that would make a new name an old one: ``tco-c12-c3-x`` (install ``c12``, campaign 3 ``x``) is
#: also the old name of campaign 12 named ``c3-x``. Never made; refused in ``TCO_INSTALL_ID``.
OLD_NAME_LOOKALIKE = re.compile(r"c[0-9]+")


def new_install_id() -> str:
    """A fresh random id: ``LENGTH`` characters of ``ALPHABET`` (``secrets``, not guessable ahead),
    never ``c`` and digits only (:data:`OLD_NAME_LOOKALIKE`)."""
    while True:
        made = "".join(secrets.choice(ALPHABET) for _ in range(LENGTH))
        if not OLD_NAME_LOOKALIKE.fullmatch(made):
            return made


def install_row():
    """The ``Install`` row (pk 1), made with a new id if the database has none.

    Two processes making it at once: the second's insert fails on the primary key and it reads
    the first's, so both return the same row.
    """
    from dashboards.models import Install

    row = Install.objects.filter(pk=1).first()
    if row is not None:
        return row
    try:
        with transaction.atomic():
            return Install.objects.create(pk=1, install_id=new_install_id(), created_at=timezone.now())
    except IntegrityError:
        return Install.objects.get(pk=1)


def install_id() -> str:
    """This install's id: ``TCO_INSTALL_ID`` if set, else the database's (:func:`install_row`).

    Read each time it is asked for (one primary-key read; asked once per submission or lookup), so
    a test that sets ``TCO_INSTALL_ID`` is another install at once.
    """
    return getattr(settings, "TCO_INSTALL_ID", "") or install_row().install_id
