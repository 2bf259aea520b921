"""``leaderboard compare --variants``: the groups of one method that differ in method parameters,
each against the method's group run with none (its defaults), paired by seed within one protocol,
labelled by the differing parameters, Holm over the table; ``--against`` adds another method's row.
Through the real CLI on small copies of a real record (``test_paired_stats``' helpers)."""

from __future__ import annotations

import json

import pytest
from test_paired_stats import real, runs, write  # noqa: F401 - real is a fixture used by name

from helpers import invoke_cli


def with_params(records: list[dict], **params) -> list[dict]:
    """The records as runs with these method parameters: another config, so another group."""
    tag = "-".join(f"{k}-{v}" for k, v in sorted(params.items()))
    for r in records:
        r["config"]["method_params"] = dict(params)
        r["config_hash"] += f"-{tag}"
        r["record_id"] += f"-{tag}"
    return records


@pytest.fixture
def folder(real, tmp_path):  # noqa: F811
    return write(tmp_path / "runs", *runs(real, "crad", [60.0, 61.0, 62.0]),
                 *with_params(runs(real, "crad", [58.0, 58.5, 59.5]), aggregator="crad-stage1"),
                 *with_params(runs(real, "crad", [61.0, 62.0, 63.0]), aggregator="crad-support"),
                 *runs(real, "uniform-kd", [55.0, 56.0, 56.0]))


def variants_json(folder, *args: str) -> list[dict]:
    result, out, err = invoke_cli("leaderboard", "compare", str(folder), *args, "--json")
    assert result.exit_code == 0, out + err
    [table] = json.loads(out)["tables"]
    assert table["reference"] == "crad" and "default parameters" in table["notes"][0]
    return table["comparisons"]


def test_each_variant_against_the_default_group_labelled_by_its_parameters(folder):
    stage1, support = variants_json(folder, "--variants", "crad")
    assert (stage1["a"], stage1["b"], stage1["n"]) == ("crad [aggregator=crad-stage1]", "crad", 3)
    assert stage1["mean_difference"] == pytest.approx(-7 / 3, abs=1e-4)  # -2, -2.5, -2.5
    # the interval excludes zero, but no outcome of three seeds reaches 5% (the smallest p is 2/8)
    assert stage1["ci95"][1] < 0 and not stage1["resolved"] and stage1["verdict"] == "n=3 cannot resolve at 5%"
    assert (support["a"], support["mean_difference"], support["ci95"]) == ("crad [aggregator=crad-support]", 1.0,
                                                                          [1.0, 1.0])
    # Holm over the two rows: each exact sign-flip p is 2/8, the smaller doubled, the larger kept at least as big
    assert [c["p_sign_flip"] for c in (stage1, support)] == pytest.approx([0.25, 0.25])
    assert [c["p_holm"] for c in (stage1, support)] == pytest.approx([0.5, 0.5])


def test_against_adds_another_method_as_a_row_of_the_same_family(folder):
    rows = variants_json(folder, "--variants", "crad", "--against", "uniform-kd")
    assert [c["a"] for c in rows] == ["crad [aggregator=crad-stage1]", "crad [aggregator=crad-support]", "uniform-kd"]
    assert rows[2]["mean_difference"] == pytest.approx(-16 / 3, abs=1e-4)  # -5, -5, -6
    assert [c["p_holm"] for c in rows] == pytest.approx([0.75, 0.75, 0.75])  # three rows of p = 0.25


def test_markdown_and_plain_lines_say_the_variant(folder):
    _, md, _ = invoke_cli("leaderboard", "compare", str(folder), "--variants", "crad", "-f", "markdown")
    assert "| crad \\[aggregator=crad-stage1\\] | crad | 3 | -2.33 \\[" in md
    _, plain, _ = invoke_cli("leaderboard", "compare", str(folder), "--variants", "crad")
    assert "| crad [aggregator=crad-support] - crad | +1.00 [1.00, 1.00] | n=3 |" in plain


@pytest.mark.parametrize("args, message", [
    ((), "no records of local, the default reference; name another with --against METHOD"),  # --against local
    (("--variants", "krad"), "--variants: unknown method 'krad'. Did you mean 'crad'?"),
    (("--variants", "crad", "-m", "uniform-kd"), "with --variants every variant is compared"),
    (("--variants", "uniform-kd"), "no protocol holds both uniform-kd's group with no method parameters"),
])
def test_bad_variants_input_is_one_line_exit_2(folder, args, message):
    result, out, err = invoke_cli("leaderboard", "compare", str(folder), *args)
    text = (err or out).strip()
    assert result.exit_code == 2, text
    assert message in text and len(text.splitlines()) == 1, text


def test_plain_against_labels_a_methods_variants(folder):
    """Without --variants, a method that ran several groups in one protocol (its variants) is a row
    per group, each named by its parameters (they were indistinguishable rows before)."""
    result, out, err = invoke_cli("leaderboard", "compare", str(folder), "--against", "uniform-kd", "--json")
    assert result.exit_code == 0, out + err
    [table] = json.loads(out)["tables"]
    assert sorted(c["a"] for c in table["comparisons"]) == ["crad", "crad [aggregator=crad-stage1]",
                                                            "crad [aggregator=crad-support]"]
    assert table["reference"] == "uniform-kd"
