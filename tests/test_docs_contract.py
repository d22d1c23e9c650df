"""The documents are contracts, held to the code: the metrics keys a run writes, what a resume compares, and every
`gnn-dist` command line quoted in README.md, docs/ and the code's own docstrings and messages."""
from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest

from gnn_dist.comm.simulated_ranks import run_fake_ranks
from gnn_dist.config import ModelConfig, SampledConfig, TrainConfig
from gnn_dist.context import RankContext
from gnn_dist.training import train

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = sorted(p for folder in ("gnn_dist", "partition", "kernels", "benchmarks") for p in (ROOT / folder).rglob("*.py"))


def documented_keys(section: str) -> set[str]:
    """The keys in the first column of the table under `## {section}` in docs/metrics.md."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    keys = set()
    for line in body.splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


@pytest.fixture(scope="module")
def records(partitioned, tmp_path_factory):
    """Every record of a run of each task in each mode (full-batch node classification with a lossy schedule, so
    the guard watches)."""
    from gnn_dist.partition.datasets import load_dataset
    from gnn_dist.partition.partitioner import partition_graph

    out = tmp_path_factory.mktemp("metrics")
    link_parts = out / "link-parts"
    partition_graph(load_dataset("synthetic:tiny"), 2, link_parts, task="link", mrr_negatives=5)
    found = {}
    for task, mode, schedule in (("node", "full", "stale:2"), ("node", "sampled", "exact"), ("link", "full", "exact"),
                                 ("link", "sampled", "exact")):
        directory = partitioned("synthetic:tiny", 2) if task == "node" else link_parts
        config = TrainConfig(parts=str(directory), task=task, mode=mode, schedule=schedule, epochs=2, progress=False,
                             timeout=0, metrics_out=str(out / f"{task}-{mode}.jsonl"), model=ModelConfig(num_layers=2),
                             sampled=SampledConfig(fanouts=(3, 3)))
        run_fake_ranks(2, lambda comm, config=config: train(RankContext(comm), config))
        found[task, mode] = [json.loads(line) for line in (out / f"{task}-{mode}.jsonl").read_text().splitlines()]
    return found


def test_metrics_md_lists_exactly_the_keys_a_run_writes(records):
    every_epoch = documented_keys("Every epoch")
    sampled = documented_keys("Every epoch of sampled training (`--mode sampled`), besides")
    final = documented_keys("The final record (`\"final\": true`)")
    per_task = {task: (documented_keys(f"Every epoch of {name}{suffix}, besides"),
                       documented_keys(f"The final record of {name}, besides"))
                for task, name, suffix in (("node", "node classification", " (`--task node`, the default)"),
                                           ("link", "link prediction", " (`--task link`)"))}
    assert every_epoch and sampled and final and all(a and b for a, b in per_task.values())
    for (task, mode), found in records.items():
        task_epoch, task_final = per_task[task]
        for record in found[:-1]:
            assert set(record) == every_epoch | task_epoch | (sampled if mode == "sampled" else set()), (task, mode)
        assert set(found[-1]) == final | task_final, (task, mode)


def test_checkpoints_md_lists_what_a_resume_compares():
    from gnn_dist.resilience.checkpoint import RESUME_MUST_MATCH

    text = (ROOT / "docs" / "checkpoints.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `--model`"))
    documented = set(re.findall(r"`(--[\w-]+)`", row.split("|")[1]))
    compared = set()
    for key in RESUME_MUST_MATCH:
        names = {"model": [f.name for f in dataclasses.fields(ModelConfig)],
                 "task": ["task", "embedding_dim", "decoder"]}.get(key, [key])
        compared.update("--" + name.replace("_", "-") for name in names)
    assert documented == compared
    assert "refused" in row.split("|")[2]


def _command_lines() -> list[tuple[str, list[str]]]:
    """Every `gnn-dist` invocation quoted in the docs (code blocks and inline code): (where, its words)."""
    found = []
    for doc in DOCS + CODE:
        text = re.sub(r"\\\n\s*", " ", doc.read_text())  # shell line continuations
        quoted = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S) + re.findall(r"`([^`\n]+)`", text)
        if doc.suffix == ".py":  # docstrings show commands as indented lines
            quoted += re.findall(r"\n\s+((?:mpiexec|mpirun)?[^\n]*gnn-dist [a-z]+ --[^\n]*)", text)
        for block in quoted:
            for line in block.splitlines():
                line = line.split(" #", 1)[0].strip()
                at = line.find("gnn-dist ")
                if at < 0 or line.startswith("#"):
                    continue
                command = line[at:].replace("[", " ").replace("]", " ")
                try:
                    words = shlex.split(command)
                except ValueError:  # a command inside a Python string literal: its quotes are the string's
                    words = [w.strip("\"'(),:;") for w in command.split()]
                if len(words) > 1 and words[1] in {"partition", "convert", "train", "inspect", "bench", "supervise",
                                                   "embed", "export"}:
                    found.append((f"{doc.name}: {line[at:]}", words[1:]))
    return found


def _is_placeholder(word: str) -> bool:
    """DIR, P, SPEC, FILE.jsonl, MODE, a|b alternatives, {an f-string's field}, ... : words a reader replaces."""
    return word == "..." or "|" in word or "{" in word or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*(\.[a-z]+)?", word))


def _parsers():
    from gnn_dist.benchmarks.harness import build_parser as bench_parser
    from gnn_dist.cli import build_parser
    from gnn_dist.resilience.supervise import build_parser as supervise_parser

    main = build_parser()
    subparsers = next(a for a in main._actions if a.dest == "command").choices
    parsers = {name: [parser] for name, parser in subparsers.items() if name not in ("bench", "supervise")}
    parsers["bench"] = [bench_parser(), subparsers["train"]]  # bench passes train's options to every run
    parsers["supervise"] = [supervise_parser()]
    return parsers


def _check_words(command: str, words: list[str], parsers: dict, where: str) -> None:
    assert command in parsers, f"{where}: no command gnn-dist {command}"
    if command == "supervise" and "--" in words:
        launch = words[words.index("--") + 1:]
        words = words[:words.index("--")]
        if "gnn-dist" in launch:
            inner = launch[launch.index("gnn-dist") + 1:]
            _check_words(inner[0], inner[1:], parsers, where)
    options = {}
    for parser in parsers[command]:
        options.update(parser._option_string_actions)
    for k, word in enumerate(words):
        if not word.startswith("--"):
            continue
        flag = word.split("=", 1)[0]
        assert flag in options, f"{where}: gnn-dist {command} has no option {flag}"
        action = options[flag]
        value = words[k + 1] if k + 1 < len(words) else None
        if action.choices and value is not None and not value.startswith("--") and not _is_placeholder(value):
            assert value in action.choices, f"{where}: {flag} {value} is not one of {sorted(action.choices)}"


def test_every_command_line_in_the_docs_parses_with_the_real_parser(gin_in_this_process):
    # gin_in_this_process: docs/extending.md shows the GIN plugin with --model gin
    lines = _command_lines()
    assert len(lines) > 20  # the docs quote many; the extraction found them
    parsers = _parsers()
    for where, words in lines:
        _check_words(words[0], words[1:], parsers, where)


def test_a_misquoted_option_would_be_caught():
    parsers = _parsers()
    with pytest.raises(AssertionError, match="has no option --memory"):
        _check_words("inspect", ["DIR", "--memory"], parsers, "x")
    with pytest.raises(AssertionError, match="not one of"):
        _check_words("train", ["--halo-memory", "lazy"], parsers, "x")


def test_docs_environment_md_names_every_variable_the_code_reads():
    """Every GNN_DIST_* variable in the runtime, the partitioner, the kernels, the benchmarks, the scripts and the
    tests is a row of docs/environment.md, and every row is one the code reads."""
    sources = CODE + sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "scripts").glob("*"))
    read = {name for path in sources if path.is_file() for name in re.findall(r"GNN_DIST_[A-Z_]+", path.read_text())}
    table = (ROOT / "docs" / "environment.md").read_text()
    documented = {name for line in table.splitlines() if line.startswith("| `GNN_DIST_")
                  for name in re.findall(r"`(GNN_DIST_[A-Z_]+)`", line.split("|")[1])}
    assert read == documented, (sorted(read - documented), sorted(documented - read))
