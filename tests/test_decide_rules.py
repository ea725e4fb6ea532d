"""The rules grammar: every injection attempt is rejected at load time; allowed rules evaluate correctly."""
import pytest

from agenttune_lib.decide import RuleError, compile_rule, evaluate_rule

INJECTIONS = [
    "__import__('os').system('id')",
    "open('/etc/passwd').read() == ''",
    "exec('x = 1')",
    "eval('1') == 1",
    "getattr(input, 'name') == 'x'",
    "input.name.upper() == 'X'",
    "input.__class__ == 1",
    "input.__dict__ == {}",
    "input._private == 1",
    "_hidden == 1",
    "__builtins__ == 1",
    "().__class__.__bases__ == 1",
    "[].__class__ == 1",
    "input['name'] == 'x'",
    "input.names[0] == 'x'",
    "(lambda: 1)() == 1",
    "1 + 1 == 2",
    "input.age * 2 > 10",
    "2 ** 100 > 1",
    "input.age if input.ok else 0",
    "(x := 1) == 1",
    "f'{input.name}' == 'x'",
    "input.name in ['a']",
    "input.name not in ['a']",
    "input.name is None",
    "[x for x in input.items] == []",
    "{**input} == {}",
    "{1: 2} == {}",
    "-input.age < 0",
    "~1 == -2",
    "b'bytes' == 1",
    "... == 1",
    "input.a; input.b",
    "import os",
    "input.a.b()",
    "type(input) == dict",
    "x" * 3000,
    "",
]


@pytest.mark.parametrize("source", INJECTIONS)
def test_rules_walker_rejects_injection(source):
    with pytest.raises(RuleError):
        compile_rule(source)


NS = {
    "extract": {"output": {"age": 37, "country": "ES", "flags": ["a"], "ok": True, "missing": None}},
    "input": {"amount": 10.5, "name": "Maria"},
}


@pytest.mark.parametrize(
    "source,expected",
    [
        ("extract.output.age >= 18", True),
        ("extract.output.age < 18", False),
        ("18 <= extract.output.age <= 65", True),
        ("18 <= extract.output.age <= 30", False),
        ("extract.output.country == 'ES' and input.amount > 10", True),
        ("extract.output.country == \"FR\" or input.amount > 100", False),
        ("not extract.output.ok", False),
        ("extract.output.ok == true", True),
        ("extract.output.ok == True", True),
        ("extract.output.missing == null", True),
        ("extract.output.flags == ['a']", True),
        ("extract.output.flags != []", True),
        ("input.amount > -1", True),
        ("input.name != 'Maria'", False),
    ],
)
def test_allowed_rules_evaluate(source, expected):
    assert evaluate_rule(source, NS) is expected


def test_missing_lookup_and_bad_comparisons_raise_clearly():
    with pytest.raises(RuleError, match="not in the pipeline state"):
        evaluate_rule("extract.output.nope > 1", NS)
    with pytest.raises(RuleError, match="cannot order"):
        evaluate_rule("extract.output.country > 3", NS)
    with pytest.raises(RuleError, match="must evaluate to true or false"):
        evaluate_rule("extract.output.age", NS)
    with pytest.raises(RuleError, match="need booleans"):
        evaluate_rule("extract.output.age and true", NS)


def test_short_circuit_does_not_evaluate_the_rest():
    assert evaluate_rule("extract.output.ok == false and extract.output.nope > 1", NS) is False
    assert evaluate_rule("extract.output.ok or extract.output.nope > 1", NS) is True
