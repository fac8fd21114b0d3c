"""Shared XML loading and time handling of the Grid Engine status parsers.

Text handling, the same for every parser: the bytes are parsed as they are
when they are well-formed XML. Otherwise they are decoded as UTF-8 with
invalid bytes replaced by U+FFFD, characters XML 1.0 forbids (control
characters a job name may carry, since the Grid Engine printer escapes only
``< > & ' "``) are replaced by U+FFFD, and the result is parsed again. So a
job name with Latin-1 bytes or a ``\\x01`` never fails a poll; only output
that is not XML at all does. (Grid Engine escapes ``<`` as the literal text
``%lt;``, a long-standing bug in ``escape_string``; it is passed through.)

Times: ``qstat -xml`` prints local time of the qstat process without a zone
(``2025-03-10T09:00:05``; OCS adds microseconds, ``…:43.834192``). They are
read in ``tz`` (the cluster's zone, or UTC when qstat runs with ``TZ=UTC``)
and returned as aware UTC datetimes. In a backward DST change the earlier
of the two instants is taken (``fold=0``).
"""
from __future__ import annotations

import codecs
import datetime as dt
import re

from lxml import etree

from schedulers.base import SchedulerParseError

UTC = dt.timezone.utc


# ---------------------------------------------------------------------------
# Loading XML
# ---------------------------------------------------------------------------

# Characters XML 1.0 does not allow (surrogates cannot occur after decoding).
ILLEGAL_XML_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>")
DECL_ENCODING = re.compile(rb"""^\s*<\?xml[^>]*encoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")


def new_parser() -> etree.XMLParser:
    # A parser per call (they keep state, such as the error log, between
    # parses). huge_tree: a 100,000-job qstat is tens of MB; the input is
    # our own scheduler's output, never fetched from the network.
    """A new lxml parser for a scheduler's own XML output: no entities, network or DTD; huge
    trees allowed (a 100,000-job qstat is tens of MB)."""
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                           huge_tree=True, collect_ids=False)


def decode(data: bytes) -> str:
    """Decode as declared (UTF-8 by default), invalid bytes -> U+FFFD, and
    replace characters XML 1.0 forbids by U+FFFD."""
    encoding = "utf-8"
    match = DECL_ENCODING.match(data[:200])
    if match:
        try:
            encoding = codecs.lookup(match.group(1).decode("ascii")).name
        except LookupError:
            encoding = "utf-8"
    text = data.decode(encoding, "replace")
    if ILLEGAL_XML_CHARS.search(text):
        text = ILLEGAL_XML_CHARS.sub("\ufffd", text)
    return text


def strip_namespaces(root: etree._Element) -> None:
    # qquota -xml declares a default namespace (SGE 8.1.9 on the dev cluster,
    # OCS 9.2: xmlns="…/qquota.xsd"); the other commands only declare
    # xmlns:xsd. Strip it so one set of tag names works.
    """Remove every element's namespace under ``root``, in place (qquota -xml declares a
    default one), so one set of tag names works."""
    for el in root.iter():
        tag = el.tag
        if isinstance(tag, str) and tag[:1] == "{":
            el.tag = tag.split("}", 1)[1]
    etree.cleanup_namespaces(root)


_SPACED_TAG = re.compile(r"<(/?)([A-Za-z_][\w.-]*(?: [A-Za-z_][\w.-]*)+)>")


def load_xml(data: bytes, roots: tuple[str, ...], what: str) -> etree._Element:
    """Parse ``data`` (see the module docstring for the text rules) and check
    the root element is one of ``roots``."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if not data or not data.strip():
        raise SchedulerParseError(f"{what}: empty output")
    try:
        root = etree.fromstring(data, new_parser())
    except etree.XMLSyntaxError:
        text = _XML_DECL.sub("", decode(data), count=1)
        # qstat -j dumps CULL list names as tags, some with a space (SGE
        # 8.1.9 writes <job ids> in MES_job_number_list after qmod -cj):
        # not XML. A tag can never hold a bare word after its name, so join
        # such words with '_' (<job_ids>) and read the rest as written.
        text = _SPACED_TAG.sub(lambda m: "<" + m.group(1) + m.group(2).replace(" ", "_") + ">", text)
        try:
            root = etree.fromstring(text.encode("utf-8"), new_parser())
        except etree.XMLSyntaxError as exc:
            raise SchedulerParseError(f"{what}: not well-formed XML: {exc}") from exc
    if root is None:
        raise SchedulerParseError(f"{what}: no XML document")
    if isinstance(root.tag, str) and root.tag[:1] == "{":
        strip_namespaces(root)
    if root.tag not in roots:
        raise SchedulerParseError(f"{what}: root element <{root.tag}>, expected <{'|'.join(roots)}>")
    return root


def children_text(el: etree._Element) -> dict[str, str]:
    """Leaf children of ``el`` as {tag: text}; '' for empty elements."""
    return {c.tag: (c.text or "") for c in el if isinstance(c.tag, str)}


# ---------------------------------------------------------------------------
# Times
# ---------------------------------------------------------------------------

def iso_to_utc(text: str, tz: dt.tzinfo) -> dt.datetime:
    """``2025-03-10T09:00:05[.834192]`` local in ``tz`` (or with an offset) -> aware UTC."""
    value = dt.datetime.fromisoformat(text.strip())
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz)
    return value.astimezone(UTC)


def epoch_or_iso_to_utc(text: str | None, tz: dt.tzinfo) -> dt.datetime | None:
    """``qstat -j`` times: epoch seconds (SGE 8, or OCS with
    SGE_QSTAT_SGE_COMPATIBILITY) or ISO local time with µs (OCS 9). 0 -> None."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        seconds = int(text)
        if seconds == 0:
            return None
        # Some OCS uint64 fields hold µs since the epoch.
        if seconds > 10**11:
            return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=seconds)
        return dt.datetime.fromtimestamp(seconds, UTC)
    try:
        return iso_to_utc(text, tz)
    except ValueError as exc:
        raise SchedulerParseError(f"qstat -j: time {text!r} is neither epoch seconds nor ISO 8601") from exc
