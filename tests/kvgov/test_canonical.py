"""kvgov.canonical: RFC 8785 text, checked on the RFC's own vectors and against rfc8785."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgov.canonical import JCS_INT_MAX, CanonicalizationError, canonical_json, reference_json

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "rfc8785.json").read_text("utf-8"))


@pytest.mark.parametrize("case", VECTORS["objects"], ids=lambda c: c["name"])
def test_the_rfc_examples_encode_byte_for_byte(case: dict[str, Any]) -> None:
    """The examples of RFC 8785 sections 3.2.2 and 3.2.3 give the RFC's bytes, both paths."""
    value = json.loads(case["input"])
    expected = bytes.fromhex(case["output_utf8_hex"])
    assert canonical_json(value).encode("utf-8") == expected
    assert reference_json(value).encode("utf-8") == expected


@pytest.mark.parametrize(("bits", "text"), VECTORS["numbers"], ids=lambda v: str(v))
def test_the_rfc_number_table(bits: str, text: str | None) -> None:
    """Appendix B: each double's text; NaN and Infinity have none and are refused."""
    (number,) = struct.unpack(">d", bytes.fromhex(bits))
    if text is None:
        with pytest.raises(CanonicalizationError):
            canonical_json(number)
    else:
        assert canonical_json(number) == text
        assert canonical_json([number]) == f"[{text}]"


@pytest.mark.parametrize("n", [JCS_INT_MAX + 1, -JCS_INT_MAX - 1, 2**64])
def test_integers_beyond_2_53_are_refused(n: int) -> None:
    """RFC 8785 numbers are doubles: an integer a double cannot hold exactly has no form."""
    with pytest.raises(CanonicalizationError):
        canonical_json({"n": n})


def test_integers_up_to_2_53_are_exact() -> None:
    """The largest safe integers are written digit for digit."""
    assert canonical_json([JCS_INT_MAX, -JCS_INT_MAX, 10**15]) == (
        "[9007199254740991,-9007199254740991,1000000000000000]"
    )


def test_text_is_utf8_with_only_the_required_escapes() -> None:
    """Non-ASCII and DEL stay as they are; quotes, backslashes and controls are escaped."""
    assert canonical_json(["é\x7f", '"\\', "\x00\x08\t\n\x0c\r\x1f"]) == (
        '["é\x7f","\\"\\\\","\\u0000\\b\\t\\n\\f\\r\\u001f"]'
    )


@pytest.mark.parametrize("value", [["\ud800"], {"\udfff": 1}, ["a\U0001f600\ud800"]])
def test_a_lone_surrogate_is_refused(value: Any) -> None:
    """A lone surrogate has no UTF-8 form, in a value or a key (a ValueError)."""
    with pytest.raises(ValueError):
        canonical_json(value)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-JCS_INT_MAX, JCS_INT_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.sampled_from(["2e-3", "1.0", "1234567890123456", "\U0001f600", "\ufb33", "\x7f"])
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_the_fast_path_equals_the_reference(value: Any) -> None:
    """For any JSON value in RFC 8785's domain, the C-encoder path gives rfc8785's text."""
    assert canonical_json(value) == reference_json(value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3.0, "3"),
        ([3.0], "[3]"),
        ([-0.0, 1], "[0,1]"),
        ({"a": 10.0}, '{"a":10}'),
        ({"a": [1e-05]}, '{"a":[0.00001]}'),
        ([1.5e16], "[15000000000000000]"),
        ([1e21, 1e-7], "[1e+21,1e-7]"),
        ({"\U0001f600": 1, "\ufb33": 2}, '{"\U0001f600":1,"\ufb33":2}'),
        (["v1.0", "2e-3", 1234567890123456], '["v1.0","2e-3",1234567890123456]'),
    ],
)
def test_every_place_the_c_encoder_differs_is_caught(value: Any, text: str) -> None:
    """A float or key Python writes otherwise is found wherever it sits (and false alarms hold)."""
    assert canonical_json(value) == text


def test_a_circular_value_is_a_value_error() -> None:
    """The encoder skips json's circular check: the recursion it ends in is a ValueError."""
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="circular"):
        canonical_json(loop)
    assert canonical_json([[1]]) == "[[1]]"  # and the encoder still works after it
