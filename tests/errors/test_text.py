"""``vllm_omni.errors.text``: finding text that is not Unicode, and making it safe."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_omni.errors.text import NonUnicode, is_unicode, make_safe, non_unicode_field

LONE = ("\ud800", "\udbff", "\udc00", "\udfff", "\udc00\ud800")


@pytest.mark.parametrize("text", LONE)
def test_lone_surrogates_are_not_unicode(text: str) -> None:
    assert not is_unicode(text)
    assert not is_unicode(f"héllo {text} 世界")
    safe = make_safe(f"a{text}b")
    assert safe == "a" + "\ufffd" * len(text) + "b"
    safe.encode("utf-8")  # what every encoder downstream does


def test_a_pair_decoded_by_json_is_one_code_point() -> None:
    text = json.loads('"\\ud83d\\ude00"')
    assert text == "😀" and is_unicode(text) and make_safe(text) is text


@given(st.text())
def test_valid_text_is_unicode_and_left_alone(text: str) -> None:
    # hypothesis' text() draws no surrogates: every such string is valid.
    assert is_unicode(text)
    assert make_safe(text) == text


@given(st.text(st.characters(codec=None)))
def test_make_safe_always_encodes(text: str) -> None:
    assert make_safe(text).encode("utf-8").decode("utf-8") == make_safe(text)
    assert is_unicode(make_safe(text))


@pytest.mark.parametrize(
    ("document", "found"),
    [
        ({"a": "ok", "b": ["x", {"c": "\ud800"}]}, NonUnicode("b.1.c")),
        ({"messages": [{"content": "hi"}, {"content": "\udc00"}]},
         NonUnicode("messages.1.content")),
        ({"a": {"\ud800": 1}}, NonUnicode("a", in_name=True)),
        ({"\udfff": 1}, NonUnicode("", in_name=True)),
        (["\ud800"], NonUnicode("0")),
        ("\ud800", NonUnicode("")),
        ({"first": "\ud800", "second": "\udc00"}, NonUnicode("first")),
        ({"a": [1, 2.5, None, True, "fine"]}, None),
        (None, None),
        (42, None),
    ],
)  # fmt: skip
def test_non_unicode_field_names_the_field(document: object, found: object) -> None:
    assert non_unicode_field(document) == found


def test_non_unicode_field_walks_deep_documents_without_recursion() -> None:
    depth = 100_000
    document: object = "\ud800"
    for _ in range(depth):
        document = [document]
    found = non_unicode_field(document)
    assert found is not None and found.path == ".".join(["0"] * depth)
