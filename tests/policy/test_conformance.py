"""Conformance of the embedded Rego engine for every feature the bundle relies on.

If the embedded engine is swapped (another regorus release, another interpreter),
these must still pass: they pin the semantics, in OPA's definition, of default
rules, `not ... with input as`, `in`, `every`, sets, `sprintf`, comprehensions,
`with data.x as`, else chains (in functions and in rules with a default), undefined
results, and the cross-type ordering that scope.rego uses to test for non-empty
strings.
"""

from __future__ import annotations

from typing import Any

import pytest
import regorus

MODULE = """
package conf

import rego.v1

default allow := false

allow if input.user == "alice"

denied if not allow

deny contains "no user" if not input.user

deny contains msg if {
	input.user == "mallory"
	msg := sprintf("user %v is banned (%d tries)", [input.user, 3])
}

names := {n | some n in input.names}

upper := {n: upper(n) | some n in input.names}

lengths := [count(n) | some n in input.names]

all_short if every n in input.names { count(n) < 6 }

known if input.role in data.roles

cfg := data.cfg.level

grade(x) := "high" if {
	x > 10
} else := "low"

undef_rule := 1 if input.never

default chained := "default"

chained := "first" if {
	input.pick == 1
} else := "second" if {
	input.pick == 2
}

test_with_input if allow with input as {"user": "alice"}

test_not_with_input if not allow with input as {"user": "bob"}

test_with_data if cfg == 9 with data.cfg.level as 9

test_failing if allow with input as {"user": "bob"}
"""


@pytest.fixture(scope="module")
def engine() -> Any:
    """A regorus engine holding the conformance module and some data."""
    e = regorus.Engine()
    e.add_policy("conf.rego", MODULE)
    e.add_data({"roles": ["admin", "dev"], "cfg": {"level": 1}})
    return e


def ev(engine: Any, rule: str, input: dict[str, Any]) -> Any:
    engine.set_input(input)
    return engine.eval_rule(f"data.conf.{rule}")


def test_default_rule_applies_when_no_body_matches(engine: Any) -> None:
    """A default rule gives its value when no body holds."""
    assert ev(engine, "allow", {"user": "bob"}) is False
    assert ev(engine, "allow", {"user": "alice"}) is True


def test_not_negates_a_rule(engine: Any) -> None:
    """`not` holds exactly when the rule is false or undefined."""
    assert ev(engine, "denied", {"user": "bob"}) is True
    assert ev(engine, "denied", {"user": "alice"}) is None


def test_not_with_input_as_in_a_test_rule(engine: Any) -> None:
    """`not x with input as {...}` parses and replaces input for that expression."""
    assert ev(engine, "test_not_with_input", {"user": "alice"}) is True
    assert ev(engine, "test_with_input", {}) is True


def test_with_data_replaces_a_data_path(engine: Any) -> None:
    """`with data.x as v` replaces base data for the expression only."""
    assert ev(engine, "test_with_data", {}) is True
    assert ev(engine, "cfg", {}) == 1


def test_failing_test_rule_is_undefined(engine: Any) -> None:
    """A test whose condition fails is undefined (None), which the runner counts as failing."""
    assert ev(engine, "test_failing", {}) is None


def test_partial_set_rules_collect_messages(engine: Any) -> None:
    """`contains` rules build a set; sprintf formats %v and %d."""
    assert ev(engine, "deny", {}) == {"no user"}
    assert ev(engine, "deny", {"user": "mallory"}) == {"user mallory is banned (3 tries)"}
    assert ev(engine, "deny", {"user": "alice"}) == set()


def test_in_membership_against_data(engine: Any) -> None:
    """`x in array` tests membership."""
    assert ev(engine, "known", {"role": "dev"}) is True
    assert ev(engine, "known", {"role": "root"}) is None


def test_every_quantifier(engine: Any) -> None:
    """`every` holds when the body holds for all members (and for none)."""
    assert ev(engine, "all_short", {"names": ["ab", "cd"]}) is True
    assert ev(engine, "all_short", {"names": ["ab", "toolongname"]}) is None
    assert ev(engine, "all_short", {"names": []}) is True


def test_set_object_and_array_comprehensions(engine: Any) -> None:
    """Set, object and array comprehensions build their collections."""
    inp = {"names": ["a", "bb", "a"]}
    assert ev(engine, "names", inp) == {"a", "bb"}
    assert ev(engine, "upper", inp) == {"a": "A", "bb": "BB"}
    assert ev(engine, "lengths", inp) == [1, 2, 1]


def test_else_chain_in_a_function(engine: Any) -> None:
    """`f(x) := a if {...} else := b` picks the first body that holds."""
    engine.set_input({})
    assert (
        engine.eval_query("data.conf.grade(11)")["result"][0]["expressions"][0]["value"] == "high"
    )
    assert engine.eval_query("data.conf.grade(1)")["result"][0]["expressions"][0]["value"] == "low"


def test_else_chain_in_a_rule_with_a_default(engine: Any) -> None:
    """A rule's else branch is taken when the body before it fails, also on an undefined
    reference, and the default applies when every branch fails (decisions rely on this)."""
    assert ev(engine, "chained", {"pick": 1}) == "first"
    assert ev(engine, "chained", {"pick": 2}) == "second"
    assert ev(engine, "chained", {}) == "default"


def test_undefined_rule_evaluates_to_none(engine: Any) -> None:
    """An undefined rule gives None (the engines treat it as a deny)."""
    assert ev(engine, "undef_rule", {}) is None


@pytest.mark.parametrize(
    ("value", "is_non_empty_string"),
    [
        ("a", True),
        ("", False),
        (None, False),
        (True, False),
        (7, False),
        ([], False),
        (["a"], False),
        ({}, False),
        ({"a": 1}, False),
    ],
)
def test_cross_type_order_brackets_non_empty_strings(value: Any, is_non_empty_string: bool) -> None:
    """`x > ""; x < []` holds exactly for non-empty strings (Rego's total order of types)."""
    e = regorus.Engine()
    e.add_policy(
        "o.rego", 'package o\nimport rego.v1\nok if {\n\tinput.x > ""\n\tinput.x < []\n}\n'
    )
    e.set_input({"x": value})
    assert (e.eval_rule("data.o.ok") is True) is is_non_empty_string


def test_object_get_with_path_and_default() -> None:
    """object.get accepts a key path and returns the default when absent."""
    e = regorus.Engine()
    e.add_policy(
        "g.rego",
        'package g\nimport rego.v1\nhit := object.get(data.d, ["a", "b"], 0)\n'
        'miss := object.get(data.d, ["a", "z"], 0)\n',
    )
    e.add_data({"d": {"a": {"b": 5}}})
    e.set_input({})
    assert e.eval_rule("data.g.hit") == 5
    assert e.eval_rule("data.g.miss") == 0


def test_v0_syntax_is_rejected_by_default() -> None:
    """The engine reads Rego v1: a v0 body without `if` is a parse error."""
    e = regorus.Engine()
    with pytest.raises(Exception, match="`if` keyword is required"):
        e.add_policy("v0.rego", "package v0\nallow { input.x == 1 }\n")
