"""What the launch-time config comparison hashes: equal configs give equal text on every process."""

from __future__ import annotations

from ember._same_config import _flat_config


class Thing:
    pass


def test_values_are_compared_without_object_addresses_and_with_sets_sorted() -> None:
    a = _flat_config({"model": {"act": Thing(), "tags": {"b", "a", "c"}}, "lr": 0.1, "sizes": [1, (2, 3)]})
    b = _flat_config({"sizes": [1, (2, 3)], "lr": 0.1, "model": {"tags": {"c", "a", "b"}, "act": Thing()}})
    assert a == b
    assert a["model.tags"] == "{'a', 'b', 'c'}" and "0x" not in a["model.act"]
    assert a["sizes"] == "[1, (2, 3)]"


def test_a_changed_leaf_is_named_by_its_dotted_key() -> None:
    a = _flat_config({"parallel": {"tensor": {"size": 2}}, "amp": "bf16"})
    b = _flat_config({"parallel": {"tensor": {"size": 1}}, "amp": "bf16"})
    assert {k for k in a if a[k] != b[k]} == {"parallel.tensor.size"}
