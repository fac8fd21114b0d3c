"""Grid Engine flavours and everything that follows from a cell's flavour.

Two flavours are known (tried for real: SGE 8.1.9 live on the dev cluster,
OCS 9.1.4 and 9.2.0prealpha from captures):

==================== ====================================== =========================================
                     ``sge8`` (Son of Grid Engine 8.1.9)    ``ocs9`` (Open/Gridware Cluster Scheduler 9)
==================== ====================================== =========================================
accounting file      ``common/accounting``, colon lines      ``common/accounting.jsonl``, JSON lines
                     (accounting(5))                         (sge_accounting(5) of OCS 9)
reporting file       ``common/reporting``                    ``common/reporting.jsonl``
libdrmaa             ``$SGE_ROOT/lib/<arch>/libdrmaa.so.1.0`` ``$SGE_ROOT/lib/<arch>/libdrmaa.so``
                     (Debian: ``/usr/lib/gridengine-drmaa/
                     lib/libdrmaa.so.1.0``)
jemalloc preload     needed by Debian's libdrmaa              not needed
client banner        ``SGE 8.1.9`` (``qstat -help``)          ``OCS 9.1.4``, ``GCS 9.1.7``, ``OCS 9.2.0prealpha``
==================== ====================================== =========================================

:func:`detect_flavour` reads the installation when the cluster record does
not name a flavour: the clients' version banner first, then the files in
``$SGE_ROOT/$SGE_CELL/common/``.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable

from schedulers.base import SchedulerError

from .commands import run_command

DEBIAN_DRMAA_LIBRARY = "/usr/lib/gridengine-drmaa/lib/libdrmaa.so.1.0"
JEMALLOC_PRELOAD = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
DEFAULT_ARCH = "lx-amd64"

#: ``qstat -help`` first line: ``SGE 8.1.9``, ``OCS 9.1.4``, ``GCS 9.1.7``, ``OCS 9.2.0prealpha``.
BANNER_RE = re.compile(r"^\s*(SGE|OGS|UGE|OCS|GCS)\s+(\d+)\.(\d+)(?:\.(\d+))?(\S*)")


@dataclasses.dataclass(frozen=True)
class FlavourDefaults:
    """What follows from a flavour. Paths ``*_file`` are relative to ``$SGE_ROOT/$SGE_CELL``."""

    flavour: str
    label: str
    accounting_file: str
    accounting_format: str  # "colon" (accounting(5)) or "json" (JSON lines)
    reporting_file: str
    drmaa_library_name: str
    jemalloc_preload: str | None

    def accounting_path(self, sge_root: str, sge_cell: str) -> str:
        """``$SGE_ROOT/$SGE_CELL/common/accounting[.jsonl]``."""
        return os.path.join(sge_root, sge_cell, self.accounting_file)

    def reporting_path(self, sge_root: str, sge_cell: str) -> str:
        """``$SGE_ROOT/$SGE_CELL/common/reporting[.jsonl]``."""
        return os.path.join(sge_root, sge_cell, self.reporting_file)

    def drmaa_library_candidates(self, sge_root: str, arch: str = DEFAULT_ARCH) -> list[str]:
        """Where this flavour's libdrmaa may be, most specific first."""
        found = [os.path.join(sge_root, "lib", arch, self.drmaa_library_name)]
        if self.flavour == "sge8":
            found.append(DEBIAN_DRMAA_LIBRARY)
        return found

    def drmaa_library(self, sge_root: str, arch: str = DEFAULT_ARCH) -> str:
        """The first existing candidate of :meth:`drmaa_library_candidates` (else the first one)."""
        candidates = self.drmaa_library_candidates(sge_root, arch)
        return next((c for c in candidates if os.path.exists(c)), candidates[0])


FLAVOURS: dict[str, FlavourDefaults] = {
    "sge8": FlavourDefaults("sge8", "Son of Grid Engine 8", "common/accounting", "colon", "common/reporting",
                            "libdrmaa.so.1.0", JEMALLOC_PRELOAD),
    "ocs9": FlavourDefaults("ocs9", "Open/Gridware Cluster Scheduler 9", "common/accounting.jsonl", "json",
                            "common/reporting.jsonl", "libdrmaa.so", None),
}


class UnknownInstallation(SchedulerError):
    """Neither the clients nor the files of a cell say which flavour it is."""


def defaults_for(flavour: str) -> FlavourDefaults:
    """The defaults of ``flavour``. Raises KeyError naming the known ones."""
    try:
        return FLAVOURS[flavour]
    except KeyError:
        raise KeyError(f"unknown flavour {flavour!r} (known: {', '.join(FLAVOURS)})") from None


def flavour_of_banner(banner: str) -> str | None:
    """``SGE 8.1.9`` -> ``sge8``; ``OCS 9.1.4`` / ``GCS 9.1.7`` -> ``ocs9``; else None."""
    match = BANNER_RE.match(banner or "")
    if match is None:
        return None
    product, major = match.group(1), int(match.group(2))
    if product in ("OCS", "GCS") and major >= 9:
        return "ocs9"
    if product in ("SGE", "OGS") and major == 8:
        return "sge8"
    return None


def version_banner(sge_root: str, sge_cell: str, *, timeout: float = 10.0,
                   run: Callable[..., bytes] = run_command) -> str:
    """The first line of ``qstat -help`` (``SGE 8.1.9``). Raises SchedulerUnavailable
    (client missing or not answering), SchedulerCommandError."""
    out = run(["qstat", "-help"], timeout=timeout, env_extra={"SGE_ROOT": sge_root, "SGE_CELL": sge_cell})
    return out.decode("utf-8", "replace").strip().splitlines()[0] if out.strip() else ""


def version_tuple(banner: str) -> tuple[int, int, int] | None:
    """``OCS 9.2.0prealpha`` -> ``(9, 2, 0)``; None when the banner is not a version."""
    match = BANNER_RE.match(banner or "")
    if match is None:
        return None
    return int(match.group(2)), int(match.group(3)), int(match.group(4) or 0)


@dataclasses.dataclass(frozen=True)
class Detection:
    """The flavour found and why (``evidence``: the banner, or the file that decided)."""

    flavour: str
    evidence: str


def flavour_of_files(sge_root: str, sge_cell: str) -> Detection | None:
    """Decide from ``$SGE_ROOT/$SGE_CELL/common/``: ``accounting.jsonl`` or
    ``reporting.jsonl`` -> ocs9; a colon ``accounting`` -> sge8; else None."""
    common = os.path.join(sge_root, sge_cell, "common")
    for name in ("accounting.jsonl", "reporting.jsonl"):
        if os.path.exists(os.path.join(common, name)):
            return Detection("ocs9", f"{common}/{name} exists")
    if os.path.exists(os.path.join(common, "accounting")):
        return Detection("sge8", f"{common}/accounting exists (no accounting.jsonl)")
    return None


def detect_flavour(sge_root: str, sge_cell: str, *, timeout: float = 10.0,
                   run: Callable[..., bytes] = run_command) -> Detection:
    """The flavour of the cell at ``sge_root``/``sge_cell``: the clients' version
    banner if they answer with one we know, else the files in ``common/``.

    Raises UnknownInstallation when neither decides.
    """
    banner = ""
    try:
        banner = version_banner(sge_root, sge_cell, timeout=timeout, run=run)
    except SchedulerError:
        pass
    flavour = flavour_of_banner(banner)
    if flavour is not None:
        return Detection(flavour, f"qstat -help: {banner}")
    found = flavour_of_files(sge_root, sge_cell)
    if found is not None:
        return found
    raise UnknownInstallation(
        f"cannot tell the Grid Engine flavour of {sge_root}/{sge_cell}: qstat -help printed "
        f"{banner!r} and common/ has no accounting or accounting.jsonl; set the cluster's flavour "
        f"(TCO_SCHEDULER_FLAVOUR=sge8 or ocs9)")
