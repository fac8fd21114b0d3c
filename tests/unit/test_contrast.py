"""Text contrast of the stylesheet's colours: at least 4.5:1 (WCAG 2.x AA, normal text) in both themes.

The ratio is WCAG's: (L1 + 0.05) / (L2 + 0.05) of the relative luminances, computed here from the sRGB
definition, not taken from the stylesheet's own comment.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

CSS = (Path(__file__).resolve().parents[2] / "static" / "css" / "tco.css").read_text()
LIGHT, DARK = (dict(re.findall(r"(--[\w-]+):\s*([^;]+);", block)) for block in re.findall(r":root\s*\{([^}]*)\}", CSS)[:2])


def luminance(colour: str) -> float:
    hex_digits = colour.strip().lstrip("#")
    if len(hex_digits) == 3:
        hex_digits = "".join(c * 2 for c in hex_digits)
    channels = [int(hex_digits[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def ratio(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_ratio_is_wcags():
    assert ratio("#000", "#fff") == pytest.approx(21.0)
    assert ratio("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)


#: Text colour -> the backgrounds it is drawn on.
PAIRS = {"--fg": ("--bg", "--card", "--track"), "--muted": ("--bg", "--card", "--track"),
         "--zero": ("--bg", "--card"), "--accent": ("--bg", "--card"), "--ok": ("--ok-bg", "--card"),
         "--bad": ("--bad-bg", "--card"), "--warn": ("--warn-bg", "--card")}


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_text_colours_reach_4_5_to_1_on_their_backgrounds(theme):
    colours = {**LIGHT, **(DARK if theme == "dark" else {})}
    low = [(text, back, round(ratio(colours[text], colours[back]), 2))
           for text, backs in PAIRS.items() for back in backs if ratio(colours[text], colours[back]) < 4.5]
    assert not low, low


def test_zero_counts_are_told_apart_by_weight_not_by_a_faint_colour():
    rule = re.search(r"td\.zero\s*\{([^}]*)\}", CSS).group(1)
    assert "var(--zero)" in rule and "font-weight" in rule
