"""``ax validate`` and ``ax graph``, run in-process through ``axengine.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from axengine.cli import main
from axengine.dag import load_dag, to_dot, to_mermaid

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
EXAMPLES = sorted(DAGS.glob("*.yaml"))
FINANCIAL = DAGS / "financial_risk_assessment.yaml"
VIDEO = DAGS / "video_generation.yaml"
BAD = ROOT / "tests" / "data" / "bad_dags"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_example_dags_validate(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", *map(str, EXAMPLES))

    assert {p.stem for p in EXAMPLES} >= {
        "financial_risk_assessment", "content_rereview", "video_generation",
    }
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == len(EXAMPLES)
    for path, line in zip(EXAMPLES, lines, strict=True):
        dag = load_dag(path)
        assert line == f"OK {path} ({len(dag.nodes)} nodes, hash {dag.hash[:12]})"


def test_a_directory_expands_to_its_yaml_files(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", str(DAGS))

    assert code == 0
    assert [line.split()[1] for line in out.splitlines()] == [str(p) for p in EXAMPLES]


def test_example_inputs_exist_for_every_example() -> None:
    for path in EXAMPLES:
        data = json.loads((DAGS / "inputs" / f"{path.stem}.json").read_text())
        assert isinstance(data, dict) and data


def test_one_bad_file_fails_the_whole_run(capsys: pytest.CaptureFixture[str]) -> None:
    bad = BAD / "unknown_tool.yaml"

    code, out, _ = run(capsys, "validate", str(FINANCIAL), str(bad))

    assert code == 1
    assert out.splitlines()[0].startswith(f"OK {FINANCIAL} ")
    assert f"{bad}:6: node 'parse': unknown tool 'pdf_parsr'" in out


def test_json_format_lists_problems(capsys: pytest.CaptureFixture[str]) -> None:
    bad = BAD / "unknown_target.yaml"

    code, out, _ = run(capsys, "validate", "--format", "json", str(bad), str(FINANCIAL))

    assert code == 1
    problems = json.loads(out)
    assert problems == [{
        "file": str(bad), "line": 8, "node": "parse", "field": "next[0].target",
        "code": "unknown-target",
        "message": "next[0].target names 'extract_metric', which is not a node of this DAG",
        "hint": "did you mean 'extract_metrics'?",
    }]


def test_json_format_of_valid_files_is_an_empty_list(
    capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "validate", "--format", "json", str(FINANCIAL))

    assert (code, json.loads(out)) == (0, [])


def test_missing_path_and_empty_directory_fail(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "validate", str(tmp_path / "nope.yaml"), str(tmp_path))

    assert code == 1
    assert f"{tmp_path / 'nope.yaml'}: cannot read the file" in out
    assert f"{tmp_path}: no *.yaml or *.yml files in this directory" in out


def test_graph_mermaid_has_shapes_and_edge_labels(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "graph", str(FINANCIAL))

    assert code == 0
    assert out == to_mermaid(load_dag(FINANCIAL))
    lines = out.splitlines()
    assert lines[0] == "flowchart TD"
    assert '    n_parse_pdf[["parse_pdf<br/>tool_call: pdf_parser"]]' in lines
    assert '    n_extract_metrics("extract_metrics<br/>llm_call: gpt-4-turbo")' in lines
    assert '    n_assess_risk{"assess_risk<br/>condition"}' in lines
    assert '    n_send_high_risk_email{{"send_high_risk_email<br/>human_gateway"}}' in lines
    assert "    n_parse_pdf -->|\".output.status == 'success'\"| n_extract_metrics" in lines
    assert '    n_assess_risk -->|"high_risk"| n_send_high_risk_email' in lines
    assert "    n_send_alert --> n_log_completion" in lines


def test_graph_dot_has_shapes_and_edge_labels(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "graph", "--format", "dot", str(FINANCIAL))

    assert code == 0
    assert out == to_dot(load_dag(FINANCIAL))
    lines = out.splitlines()
    assert lines[0] == 'digraph "financial_risk_assessment" {'
    assert lines[-1] == "}"
    assert '    "assess_risk" [shape=diamond, label="assess_risk\\ncondition"];' in lines
    assert '    "send_high_risk_email" [shape=hexagon, ' \
        'label="send_high_risk_email\\nhuman_gateway"];' in lines
    assert '    "assess_risk" -> "send_low_risk_email" [label="low_risk"];' in lines
    assert "    \"parse_pdf\" -> \"send_alert\" [label=\".output.status == 'failed'\"];" in lines


def test_graph_marks_failure_routes(capsys: pytest.CaptureFixture[str]) -> None:
    _, mermaid, _ = run(capsys, "graph", str(VIDEO))
    _, dot, _ = run(capsys, "graph", "--format", "dot", str(VIDEO))

    assert '    n_render_video -.->|"on_failure"| n_discard' in mermaid.splitlines()
    assert '    "render_video" -> "discard" [label="on_failure", style=dashed, color=red];' \
        in dot.splitlines()


def test_graph_escapes_quotes(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(
        'name: q\nnodes:\n  a:\n    type: tool_call\n    tool: echo\n    next:\n'
        '      - target: b\n        condition: "{{ .output.s == \\"x\\" }}"\n'
        "  b: {type: tool_call, tool: echo}\n"
    )
    dag = load_dag(path)

    assert '    n_a -->|".output.s == #quot;x#quot;"| n_b' in to_mermaid(dag).splitlines()
    assert '    "a" -> "b" [label=".output.s == \\"x\\""];' in to_dot(dag).splitlines()


def test_graph_of_an_invalid_dag_prints_problems(capsys: pytest.CaptureFixture[str]) -> None:
    bad = BAD / "cycle.yaml"

    code, out, err = run(capsys, "graph", str(bad))

    assert (code, out) == (1, "")
    assert f"{bad}:19: node 'd': cycle: b -> c -> d -> b" in err
