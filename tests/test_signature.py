"""An op's signature as the loader reads it from a backend's ping ("ops", backends/common/cuplug_ops.h) and
checks every call against before anything reaches C: counts, dtypes, shapes, attributes, size rules, and the
outputs it allocates. In process, no backend, no GPU: each test is a signature and the calls it takes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from cuplug.contract import dtypes, jsontext
from cuplug.contract.errors import InvalidInputError
from cuplug.runtime import signature

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

F16, F32, F64 = dtypes.BY_NAME["float16"], dtypes.BY_NAME["float32"], dtypes.BY_NAME["float64"]
I8, I32, I64 = dtypes.BY_NAME["int8"], dtypes.BY_NAME["int32"], dtypes.BY_NAME["int64"]
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def from_ping(text: str) -> dict[str, signature.OpSignature]:
    """The "ops" object of a ping, read as the loader reads it (cuplug's JSON reader, then parse())."""
    return signature.parse(jsontext.loads(text))


def op(spec: dict[str, Any], name: str = "f") -> signature.OpSignature:
    """One op declared as ``spec``, through JSON text: its strings are the reader's, as a backend's are."""
    return from_ping(json.dumps({name: spec}))[name]


def refused(message: str) -> Any:
    """The exact text the caller reads."""
    return pytest.raises(InvalidInputError, match=f"^{re.escape(message)}$")


# ---- reading the declaration


def test_signatures_read_as_a_backend_declares_them():
    """What `repr(backend.ops[...])` shows is the declaration: like inputs list their model's dtypes, every
    attribute its kind's default (a float64 default stays a float, an int64 one an int)."""
    ops = from_ping(
        '{"scale_add": {"inputs": [{"name": "x", "dtypes": ["float16", "float32"]}, {"name": "y", "like": 0}],'
        ' "outputs": [{"name": "out", "dtype": {"like": 0}, "shape": {"like": 0}}],'
        ' "attrs": [{"name": "alpha", "kind": "float64", "default": 1},'
        ' {"name": "n", "kind": "int64", "default": 4.0}], "size_rules": [], "elementwise": true, "sample_n": 1024}}'
    )
    sig = ops["scale_add"]
    assert repr(sig) == "scale_add(x: float16|float32, y: float16|float32, alpha=1.0, n=4) -> (out)"
    assert sig.attr_values({}) == [("alpha", "float64", 1.0), ("n", "int64", 4)]
    assert [type(a.default) for a in sig.attrs] == [float, int]


def test_like_inputs_take_their_models_dtypes_in_declaration_order():
    """An input declared like input k (k before it) accepts what k accepts, through a chain of likes too: the
    dtypes a sample of it uses come from there."""
    sig = op(
        {
            "inputs": [
                {"name": "x", "dtypes": ["float16", "float32"]},
                {"name": "idx", "dtypes": ["int8", "int32"]},
                {"name": "idx2", "like": 1},
                {"name": "y", "like": 0},
                {"name": "z", "like": 3},
            ]
        }
    )
    assert (
        repr(sig)
        == "f(x: float16|float32, idx: int8|int32, idx2: int8|int32, y: float16|float32, z: float16|float32) -> ()"
    )
    assert sig.sample_dtype(2) is I8 and sig.sample_dtype(4) is F32


@pytest.mark.parametrize("like", [1, 2, -1, 9], ids=["itself", "forward", "negative", "past"])
def test_a_like_that_points_at_itself_forward_or_nowhere_refuses_the_table(like):
    """Dtypes and shapes are only taken from an input declared before (the C check refuses any other like:
    "not before it"): a table pointing at itself, forward, past the end or at a negative index (never "the last
    input", as a Python index would be) is refused when it is read, naming the op and the input."""
    with pytest.raises(
        ValueError, match=rf"^op 'f': malformed signature \(input b \(like\) names input {like}; the op has 3"
    ):
        op({"inputs": [{"name": "a", "dtypes": ["float32"]}, {"name": "b", "like": like}, {"name": "c", "like": 0}]})


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({"inputs": [], "outputs": [{"name": "o"}]}, "output o's dtype names input 0; the op has 0 input(s)"),
        ({"outputs": [{"name": "o", "dtype": {"like": 2}}]}, "output o's dtype names input 2; the op has 1 input(s)"),
        ({"outputs": [{"name": "o", "dtype": {"accum_of": -1}}]}, "output o's dtype names input -1"),
        ({"outputs": [{"name": "o", "dtype": {"fixed": "float7"}}]}, "output o has the dtype 'float7', which this"),
        ({"outputs": [{"name": "o", "shape": {"like": 1}}]}, "output o's shape names input 1; the op has 1 input"),
        (
            {
                "outputs": [{"name": "o", "shape": {"blocks_of": 5, "attr": "n"}}],
                "attrs": [{"name": "n", "kind": "int64"}],
            },
            "output o's shape names input 5",
        ),
        (
            {"outputs": [{"name": "o", "shape": {"blocks_of": 0}}]},
            "output o's shape counts blocks of input 0 but names",
        ),
        (
            {"outputs": [{"name": "o", "shape": {"attr": "bins"}}]},
            "output o's shape is sized by attribute 'bins', which",
        ),
        ({"size_rules": [{"input": 3, "min": 1}]}, "a size rule names input 3; the op has 1 input(s)"),
        ({"size_rules": [{"input": 0, "min": -2}]}, "a size rule of input 0 has a negative bound"),
        ({"attrs": [{"name": "a"}, {"name": "a"}]}, "attribute names repeat: ['a', 'a']"),
        ({"attrs": [{"name": "a", "default": "nan"}]}, "attribute a has the default nan, not a finite number"),
        ({"inputs": [{"name": "x", "dtypes": ["float32"], "shape": {"like": 4}}]}, "input x's shape names input 4"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_table_pointing_at_what_is_not_there_is_refused_when_read(spec, why):
    """An op table whose rules name inputs, attributes or dtypes that do not exist fails once, when the ping is
    read (the loader rejects that backend with the reason), never at every call with an IndexError/KeyError."""
    full = {"inputs": [{"name": "x", "dtypes": ["float32"]}], "outputs": [{"name": "out"}], **spec}
    with pytest.raises(ValueError, match=r"^op 'f': malformed signature \(" + re.escape(why)):
        op(full)


def test_dtypes_this_loader_does_not_know_are_ignored():
    """A newer backend may list a dtype this loader lacks: the op still loads, the input takes the dtypes the
    loader knows, and one that lists only unknown dtypes takes none."""
    sig = op({"inputs": [{"name": "x", "dtypes": ["float8_e4m3fn", "float32"]}, {"name": "s", "dtypes": ["float4"]}]})
    assert sig.inputs[0].dtypes == (F32,) and sig.inputs[1].dtypes == ()
    with refused("f: s (input 1) is float32; it takes no dtype this cuplug knows"):
        sig.check_inputs([(F32, (2,)), (F32, (2,))])


def test_attribute_kinds_and_defaults():
    """An attribute without a kind is float64, without a default 0; an int64 default is kept exactly (beyond
    2**53, where a double would round it) and a float64 default keeps its fraction."""
    sig = op(
        {
            "attrs": [
                {"name": "eps"},
                {"name": "n", "kind": "int64"},
                {"name": "big", "kind": "int64", "default": 2**53 + 1},
                {"name": "half", "kind": "float64", "default": 0.5},
            ]
        }
    )
    assert [(a.kind, a.default) for a in sig.attrs] == [
        ("float64", 0.0),
        ("int64", 0),
        ("int64", 2**53 + 1),
        ("float64", 0.5),
    ]
    assert sig.attr_values({}) == [
        ("eps", "float64", 0.0),
        ("n", "int64", 0),
        ("big", "int64", 9007199254740993),
        ("half", "float64", 0.5),
    ]


def test_an_op_says_whether_it_is_elementwise_and_how_large_its_samples_are():
    """Not elementwise unless declared; samples of 1024 elements unless the op names its own count (the
    framework's default in cuplug_op_sample_n)."""
    plain = op({"inputs": [{"name": "x", "dtypes": ["float32"]}]})
    assert plain.elementwise is False and plain.sample_n == 1024
    assert op({"sample_n": None}).sample_n == 1024 and op({"sample_n": 0}).sample_n == 1024
    declared = op({"elementwise": True, "sample_n": 4096})
    assert declared.elementwise is True and declared.sample_n == 4096


def test_a_sample_uses_float32_where_allowed_else_the_first_dtype():
    """Probes and warm-ups (runtime.samples) call every op with float32 where it can, so their results compare."""
    sig = op(
        {
            "inputs": [
                {"name": "a", "dtypes": ["float16", "float32", "float64"]},
                {"name": "b", "dtypes": ["int8", "int32", "int64"]},
                {"name": "c", "dtypes": ["float16", "float64"]},
            ]
        }
    )
    assert [sig.sample_dtype(i) for i in range(3)] == [F32, I8, F16]


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([], "'ops' must be an object, got list"),
        ({"f": [1]}, "op 'f': malformed signature"),
        ({"f": {"inputs": "x"}}, "op 'f': malformed signature"),
        ({"f": {"attrs": [{"kind": "int64"}]}}, r"op 'f': malformed signature \('name'\)"),
        ({"f": {"sample_n": [1]}}, r"op 'f': malformed signature \(int\(\) argument must be .*'list'\)"),
        ({"f": {"sample_n": "many"}}, r"op 'f': malformed signature \(invalid literal for int\(\).*'many'\)"),
    ],
)
def test_a_malformed_declaration_is_a_valueerror_naming_the_op(ops, message):
    """The loader turns a ValueError into the backend's reason for not loading; any other exception would
    escape load() as a crash."""
    with pytest.raises(ValueError, match=f"^{message}$"):
        signature.parse(ops)


def test_importing_the_signatures_imports_nothing_for_annotations():
    """signature is on load()'s path (the API imports it): its annotation-only imports (typing) must not run,
    or every application pays for them."""
    code = (
        "import sys; before = set(sys.modules); import cuplug.runtime.signature; "
        "print(sorted(m for m in set(sys.modules) - before if m == 'typing'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


# ---- inputs: count, dtypes, like


ADD = {
    "inputs": [{"name": "x", "dtypes": ["float16", "float32"]}, {"name": "y", "like": 0}],
    "outputs": [{"name": "out", "dtype": {"like": 0}, "shape": {"like": 0}}],
}


@pytest.mark.parametrize("count", [0, 1, 3])
def test_a_call_with_the_wrong_number_of_inputs_names_what_the_op_takes(count):
    """Refused before C, naming the inputs the op takes: too few, too many, none."""
    with refused(f"add takes 2 input(s) (x, y), got {count}"):
        op(ADD, "add").check_inputs([(F32, (2,))] * count)


def test_an_op_of_many_inputs_takes_exactly_that_many():
    """Counts are compared by value, for any count a backend declares."""
    sig = op({"inputs": [{"name": f"x{i}", "dtypes": ["float32"]} for i in range(300)]})
    sig.check_inputs([(F32, (1,))] * 300)
    with refused("f: x299 (input 299) is int8; it takes float32"):
        sig.check_inputs([(F32, (1,))] * 299 + [(I8, (1,))])


def test_an_input_of_a_dtype_it_does_not_take_is_refused_listing_those_it_takes():
    """The caller reads which operand is wrong and what it may be instead."""
    with refused("add: x (input 0) is int8; it takes float16, float32"):
        op(ADD, "add").check_inputs([(I8, (2,)), (I8, (2,))])


@pytest.mark.parametrize(
    ("y", "x", "what"),
    [
        ((F32, (3,)), (F32, (4,)), "lengths differ"),
        ((F32, (5,)), (F32, (4,)), "lengths differ"),
        ((F32, (3, 2)), (F32, (2, 3)), "dtypes or shapes differ"),
        ((F16, (300,)), (F32, (300,)), "dtypes or shapes differ"),
    ],
)
def test_a_like_input_must_match_its_model_and_the_message_says_how_it_differs(y, x, what):
    """Shorter, longer, reshaped or of another dtype: refused naming both operands, saying whether the lengths differ."""
    (ydt, yshape), (xdt, xshape) = y, x
    with refused(
        f"add: y must match x in dtype and shape ({what}): y is {ydt.name}{list(yshape)}, x is {xdt.name}{list(xshape)}"
    ):
        op(ADD, "add").check_inputs([x, y])
    op(ADD, "add").check_inputs([x, x])


def test_an_input_like_a_later_model_than_the_first_is_checked_against_it():
    """A like names its own model (here input 1), not always input 0."""
    sig = op(
        {"inputs": [{"name": "x", "dtypes": ["float32"]}, {"name": "i", "dtypes": ["int32"]}, {"name": "j", "like": 1}]}
    )
    sig.check_inputs([(F32, (4,)), (I32, (7,)), (I32, (7,))])
    with refused("f: j must match i in dtype and shape (lengths differ): j is int32[4], i is int32[7]"):
        sig.check_inputs([(F32, (4,)), (I32, (7,)), (I32, (4,))])


# ---- size rules: multiple_of / min / max on an input's element count (0: no such bound)


def rule(**bounds: Any) -> signature.OpSignature:
    return op(
        {"inputs": [{"name": "x", "dtypes": ["float32"]}, {"name": "y", "dtypes": ["int32"]}], "size_rules": [bounds]}
    )


def call(sig: signature.OpSignature, nx: int, ny: int = 1) -> None:
    sig.check_inputs([(F32, (nx,)), (I32, (ny,))])


def test_multiple_of_takes_exact_multiples_and_nothing_else():
    """Zero elements is a multiple too (a zero-element tensor is valid everywhere)."""
    sig = rule(input=0, multiple_of=4)
    for n in (0, 4, 8, 12):
        call(sig, n)
    for n in (1, 3, 6, 9):
        with refused(f"f: x has {n} elements; it must have a multiple of 4"):
            call(sig, n)


def test_min_is_inclusive():
    """min is the smallest count allowed (empty included in the refusal), as the C check has it."""
    sig = rule(input=0, min=4)
    call(sig, 4)
    call(sig, 5)
    for n in (0, 3):
        with refused(f"f: x has {n} elements; it must have at least 4"):
            call(sig, n)


def test_max_is_inclusive():
    """max is the largest count allowed, as the C check has it (test_a_size_rules_max_is_inclusive)."""
    sig = rule(input=0, max=100, min=None, multiple_of=None)
    for n in (0, 99, 100):
        call(sig, n)
    for n in (101, 1000):
        with refused(f"f: x has {n} elements; it must have at most 100"):
            call(sig, n)


def test_one_message_names_every_bound_of_the_rule():
    """Whichever bound fails, the caller reads the whole rule once."""
    sig = rule(input=0, multiple_of=4, min=8, max=64)
    call(sig, 8)
    call(sig, 64)
    for n in (4, 10, 68):
        with refused(f"f: x has {n} elements; it must have a multiple of 4 and at least 8 and at most 64"):
            call(sig, n)


def test_a_rule_without_an_input_is_on_input_0():
    """A size rule that names no input bounds input 0, as C's zero-initialized rule does."""
    sig = rule(min=4)
    call(sig, 4, 1)
    with refused("f: x has 2 elements; it must have at least 4"):
        call(sig, 2, 8)


def test_a_rule_on_a_later_input_checks_that_input():
    """The rule's input is the one counted and named, not input 0."""
    sig = rule(input=1, max=3)
    call(sig, 100, 3)
    with refused("f: y has 4 elements; it must have at most 3"):
        call(sig, 1, 4)


def test_a_size_rule_on_an_input_the_op_lacks_refuses_the_table():
    """A rule naming input 2 of 2 (or 9, or -1) could never be checked: the table is refused when it is read,
    naming the rule, instead of every call skipping it (or a Python index meaning the last input)."""
    for bad in (2, 9, -1):
        spec = {
            "inputs": [{"name": "x", "dtypes": ["float32"]}, {"name": "y", "dtypes": ["int32"]}],
            "size_rules": [{"input": 0, "min": 4}, {"input": bad, "min": 1}],
        }
        with pytest.raises(ValueError, match=rf"a size rule names input {bad}; the op has 2 input\(s\)"):
            op(spec)


# ---- shapes that follow from other inputs and attributes


DEQUANTIZE = {
    "inputs": [
        {"name": "q", "dtypes": ["int8"]},
        {"name": "absmax", "dtypes": ["float32"], "shape": {"blocks_of": 0, "attr": "blocksize"}},
    ],
    "outputs": [{"name": "out", "dtype": {"fixed": "float32"}, "shape": {"like": 0}}],
    "attrs": [{"name": "blocksize", "kind": "int64", "default": 256}],
}


def test_per_block_scales_must_have_exactly_one_entry_per_block():
    """ceil(300 / 256) = 2 scales, 1-D: fewer, more or another shape would read or leave memory wrongly."""
    sig = op(DEQUANTIZE, "dequantize")
    sig.check_inputs([(I8, (300,)), (F32, (2,))])
    for bad in ((1,), (3,), (2, 1), ()):
        with refused(f"dequantize: absmax has shape {list(bad)}; it must be [2]"):
            sig.check_inputs([(I8, (300,)), (F32, bad)])


def test_a_block_size_must_be_positive():
    """A block of 1 is one scale per element; 0 or negative is refused naming the attribute and its value."""
    sig = op(DEQUANTIZE, "dequantize")
    sig.check_inputs([(I8, (300,)), (F32, (300,))], sig.attr_values({"blocksize": 1}))
    for bad in (0, -2):
        with refused(f"dequantize: attribute blocksize must be > 0, got {bad}"):
            sig.check_inputs([(I8, (300,)), (F32, (1,))], sig.attr_values({"blocksize": bad}))


def test_a_block_rule_naming_an_attribute_the_op_lacks_refuses_the_table():
    """No block size to divide by: the backend's declaration is wrong, and the table is refused when it is
    read (the loader rejects that backend with this reason), never a division by zero at a call."""
    with pytest.raises(ValueError, match="input absmax's shape is sized by attribute 'blocksize', which the op"):
        op({**DEQUANTIZE, "attrs": []}, "dequantize")


def test_an_input_shape_rule_that_names_nothing_is_like_input_0():
    """An input's shape rule that names nothing falls back to like input 0, as every shape rule does (an
    output's too): a rule present is never read as no rule."""
    sig = op({"inputs": [{"name": "x", "dtypes": ["float32"]}, {"name": "m", "dtypes": ["int8"], "shape": {}}]})
    sig.check_inputs([(F32, (2, 3)), (I8, (2, 3))])
    with refused("f: m has shape [6]; it must be [2, 3]"):
        sig.check_inputs([(F32, (2, 3)), (I8, (6,))])


# ---- outputs: allocated from the rules, never guessed


TWO_INPUTS = [{"name": "x", "dtypes": ["float16", "float32"]}, {"name": "idx", "dtypes": ["int32", "int64"]}]
SPECS = [(F16, (2, 3)), (I32, (5,))]


@pytest.mark.parametrize(
    "out",
    [
        {"name": "out"},
        {"name": "out", "dtype": {}, "shape": {}},
        {"name": "out", "dtype": {"from_a_newer_backend": 1}, "shape": {"from_a_newer_backend": 1}},
    ],
)
def test_an_output_whose_rules_name_nothing_is_like_input_0(out):
    """No rule, an empty one, or one whose keys this loader does not know: dtype and shape of input 0 (what a
    zero-initialized C rule gives), never of another input."""
    sig = op({"inputs": TWO_INPUTS, "outputs": [out]})
    assert sig.output_specs(SPECS, []) == [(F16, (2, 3))]


def test_output_rules_give_each_outputs_dtype_and_shape():
    """Outputs are allocated from these: like k, accum_of k (integers sum in int64), fixed, ceil(numel / block), n."""
    sig = op(
        {
            "inputs": TWO_INPUTS,
            "outputs": [
                {"name": "a", "dtype": {"like": 1}, "shape": {"like": 1}},
                {"name": "s", "dtype": {"accum_of": 1}, "shape": {"scalar": True}},
                {"name": "t", "dtype": {"accum_of": 0}, "shape": {"scalar": True}},
                {"name": "q", "dtype": {"fixed": "int8"}, "shape": {"blocks_of": 0, "attr": "block"}},
                {"name": "r", "dtype": {"fixed": "float64"}, "shape": {"attr": "n"}},
            ],
            "attrs": [{"name": "block", "kind": "int64", "default": 4}, {"name": "n", "kind": "int64", "default": 3}],
        }
    )
    assert sig.output_specs(SPECS, sig.attr_values({})) == [
        (I32, (5,)),
        (I64, ()),
        (F16, ()),
        (I8, (2,)),
        (F64, (3,)),
    ]
    assert sig.output_specs(SPECS, sig.attr_values({"block": 6, "n": 0}))[3:] == [(I8, (1,)), (F64, (0,))]


def test_an_output_sized_by_an_attribute_the_op_lacks_refuses_the_table():
    """The backend's declaration is wrong: refused when read, never an output of a made-up size."""
    with pytest.raises(ValueError, match="output out's shape is sized by attribute 'n', which the op does not"):
        op({"inputs": [], "outputs": [{"name": "out", "dtype": {"fixed": "int64"}, "shape": {"attr": "n"}}]})


def test_an_output_sized_by_a_negative_attribute_is_refused():
    """n = -1 or -3 elements is refused naming the attribute (as the C check does), never NumPy's own error or an
    output of shape (-3,); 0 elements is an empty output."""
    spec = {
        "inputs": [],
        "outputs": [{"name": "out", "dtype": {"fixed": "int64"}, "shape": {"attr": "n"}}],
        "attrs": [{"name": "n", "kind": "int64", "default": 4}],
    }
    sig = op(spec)
    assert sig.output_specs([], sig.attr_values({"n": 0})) == [(I64, (0,))]
    for bad in (-1, -3):
        with refused(f"f: attribute n must be >= 0, got {bad}"):
            sig.output_specs([], sig.attr_values({"n": bad}))


# ---- attributes


def test_unknown_attributes_are_refused_listing_those_the_op_takes():
    """A misspelt attribute is an error naming what the op takes (sorted), never silently ignored."""
    sig = op({"attrs": [{"name": "beta"}, {"name": "alpha"}]})
    with refused("f: unknown attribute(s) gamma, zeta; it takes alpha, beta"):
        sig.attr_values({"zeta": 1, "gamma": 2})
    with refused("f: unknown attribute(s) alpha; it takes none"):
        op({}).attr_values({"alpha": 1})


INT_ATTR = {"attrs": [{"name": "n", "kind": "int64", "default": 0}]}


@pytest.mark.parametrize("value", [INT64_MIN, -1000, -1, 0, 255, 257, INT64_MAX])
def test_an_int64_attribute_takes_every_int64(value):
    """The whole int64 range reaches the backend unchanged, both ends included."""
    assert op(INT_ATTR).attr_values({"n": value}) == [("n", "int64", value)]


@pytest.mark.parametrize("value", [INT64_MIN - 1, 1 << 63, 1 << 64])
def test_an_int64_attribute_refuses_what_int64_cannot_hold(value):
    """Out of range by one on either side is refused here, not wrapped by ctypes."""
    with refused(f"f: attribute n={value} does not fit in int64"):
        op(INT_ATTR).attr_values({"n": value})


@pytest.mark.parametrize("written", ["9.2233720368547758e+18", "9223372036854775808"])
def test_an_int64_max_default_written_as_a_double_is_int64_max(written):
    """A C backend keeps defaults as doubles, where INT64_MAX rounds up to 2**63: the declared default still
    means INT64_MAX (e.g. "no limit"), exactly, as an int."""
    sig = from_ping('{"f": {"attrs": [{"name": "limit", "kind": "int64", "default": ' + written + "}]}}")["f"]
    values = sig.attr_values({})
    assert values == [("limit", "int64", 9223372036854775807)] and type(values[0][2]) is int
    sig.check_inputs([], values)


def test_only_the_declared_default_reads_as_int64_max():
    """2**63 given by the caller is out of range whatever its type, and so is a default beyond it."""
    sig = from_ping('{"f": {"attrs": [{"name": "limit", "kind": "int64", "default": 9.2233720368547758e+18}]}}')["f"]
    for given in (1 << 63, float(1 << 63)):
        with refused("f: attribute limit=9223372036854775808 does not fit in int64"):
            sig.attr_values({"limit": given})
    beyond = from_ping('{"f": {"attrs": [{"name": "limit", "kind": "int64", "default": 1e19}]}}')["f"]
    with refused("f: attribute limit=10000000000000000000 does not fit in int64"):
        beyond.attr_values({})


def test_attribute_values_convert_to_the_declared_kind():
    """A float64 attribute given an int is a float; an int64 one given an integral float is an int, a fraction
    or a bool is refused."""
    sig = op({"attrs": [{"name": "alpha", "kind": "float64"}, {"name": "n", "kind": "int64"}]})
    got = sig.attr_values({"alpha": 2, "n": 3.0})
    assert got == [("alpha", "float64", 2.0), ("n", "int64", 3)] and [type(v) for _, _, v in got] == [float, int]
    with refused("f: attribute n is an integer, got 2.5"):
        sig.attr_values({"n": 2.5})
    with refused("f: attribute alpha must be a number, got True"):
        sig.attr_values({"alpha": True})
