"""docs/getting-started/tutorial.md, run exactly as written: its fenced blocks in page order,
in one bash process in an empty folder, against an embedded broker (the tutorial reads the
broker's address from $KAFKA). Then the outcome it promises: every command succeeds, each
output it shows is what the command printed, the results topic holds exactly the results it
lists, nothing is dead-lettered, and its last block leaves no process running.

How the page's blocks are read (`blocks`, `tutorial_script`):
- a block with `title="NAME"` is a file: written to NAME where it appears;
- an untitled ```bash block is a command block: run, in order, in the same shell;
- an untitled ```text block right after a command block is that block's output: compared
  exactly (trailing spaces aside), or with every number masked when the line before the
  fence is `<!-- tutorial: output with numbers that vary -->`;
- an untitled ```json block is an example record, checked against a real result;
- `<!-- tutorial: not run (why) -->` on the line before a fence: not run (the embedded broker
  the reader may start; the test starts its own). At most MAX_NOT_RUN such blocks.
Any other block fails the test, so no block is skipped without saying so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamjoin.settings import load
from tests.integration.kafka_harness import read_all

pytestmark = pytest.mark.integration

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started" / "tutorial.md"
MAX_NOT_RUN = 1
NOT_RUN = re.compile(r"<!-- tutorial: not run \(.+\) -->")
VARYING = "<!-- tutorial: output with numbers that vary -->"
FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)\s*(.*)$")
COMMAND_LANGS = ("bash", "sh", "shell")
BLOCK_MARK = "@@tutorial-block {}@@"
TIMEOUT_S = 150  # the script's own waits (the consumer's 60 s) end well before


@dataclass
class Block:
    index: int
    line: int  # 1-based line of the opening fence
    lang: str
    title: str | None
    marker: str  # the HTML comment on the line before the fence, or ""
    text: str  # the block's content, ending with a newline


def blocks(markdown: str) -> list[Block]:
    """Every fenced block of the page, in order. A fence inside a list or an admonition
    (indented) is refused: it would be easy to miss here."""
    lines = markdown.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang, attrs = m.groups()
        assert not indent, f"tutorial.md:{i + 1}: indented fence; the test runs top-level blocks only"
        title = re.search(r'title="([^"]+)"', attrs)
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = before if before.startswith("<!-- tutorial:") else ""
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks), None)
        assert end is not None, f"tutorial.md:{i + 1}: unclosed fence"
        found.append(Block(len(found), i + 1, lang, title.group(1) if title else None, marker,
                           "".join(line + "\n" for line in lines[i + 1:end])))
        i = end + 1
    return found


@dataclass
class Plan:
    script: str
    commands: list[Block]  # run, in order
    outputs: dict[int, Block]  # command block index -> the output block shown after it
    examples: list[Block]  # json example records
    not_run: list[Block]
    files: list[Block]


def tutorial_script(page: list[Block]) -> Plan:
    """The bash script that does what a reader does: files written where the page shows them,
    command blocks run in order in one shell, each announced by a marker line on stdout."""
    plan = Plan("", [], {}, [], [], [])
    parts = ["set -eo pipefail"]
    previous: Block | None = None
    for b in page:
        where = f"tutorial.md:{b.line}"
        if NOT_RUN.fullmatch(b.marker):
            plan.not_run.append(b)
        elif b.title is not None:
            assert "/" not in b.title and b.title.strip() == b.title, f"{where}: title must be a plain file name"
            delimiter = f"TUTORIAL_FILE_{b.index}"
            assert delimiter not in b.text
            parts.append(f"cat > {shlex.quote(b.title)} <<'{delimiter}'\n{b.text}{delimiter}")
            plan.files.append(b)
        elif b.lang in COMMAND_LANGS:
            parts.append(f"printf '\\n{BLOCK_MARK.format(b.index)}\\n'\n{b.text}")
            plan.commands.append(b)
        elif b.lang == "text":
            assert previous is not None and previous in plan.commands, \
                f"{where}: a text block shows the output of the command block right before it"
            plan.outputs[previous.index] = b
        elif b.lang == "json":
            plan.examples.append(b)
        else:
            raise AssertionError(f"{where}: a ```{b.lang} block without a title: the test does not know what to do "
                                 "with it (give it a title to write it as a file, or mark it not run)")
        assert not b.marker or NOT_RUN.fullmatch(b.marker) or (b.marker == VARYING and b.lang == "text"), \
            f"{where}: unknown marker {b.marker}"
        previous = b
    parts.append(f"printf '\\n{BLOCK_MARK.format('end')}\\n'")
    plan.script = "\n".join(parts) + "\n"
    return plan


def outputs_by_block(stdout: str) -> dict[str, str]:
    """The script's output cut at the block markers: block index (or "end") -> what it printed."""
    pieces = re.split(r"^@@tutorial-block (\w+)@@$", stdout, flags=re.MULTILINE)
    return {pieces[k]: pieces[k + 1] for k in range(1, len(pieces), 2)}


def shown(text: str, mask: bool) -> list[str]:
    """Lines as compared: trailing spaces and blank edge lines dropped; if `mask`, numbers
    masked and leading spaces dropped too (a centred title moves with its numbers' widths)."""
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    return [re.sub(r"\d+(\.\d+)?", "#", line).lstrip() for line in lines] if mask else lines


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(pgid: int) -> None:
    """SIGTERM, then SIGKILL, to whatever the tutorial's shell left in its process group."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if not group_alive(pgid):
            return
        os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)


def check_example(example: Block, results: list[dict]) -> None:
    """The example record has exactly a real result's fields, and the values it shows are that
    result's (`…` stands for a value that changes from run to run)."""
    shape = json.loads(re.sub(r'(?<!")…(?!")', "null", example.text))

    def same(want: object, got: object, path: str) -> None:
        if isinstance(want, dict):
            assert isinstance(got, dict) and set(want) == set(got), f"{path}: {sorted(want)} vs {got}"
            for k in want:
                same(want[k], got[k], f"{path}.{k}")
        elif want is not None and not (isinstance(want, str) and "…" in want):
            assert want == got, f"{path}: the page shows {want!r}, the result holds {got!r}"

    key = {s: shape[s]["order_id"] for s in ("orders", "payments")}
    match = [r for r in results if all(r[s]["order_id"] == v for s, v in key.items())]
    assert match, f"no result for the example's keys {key}"
    same(shape, match[0], "result")


def test_tutorial_runs_as_written(broker, tmp_path: Path) -> None:
    page = blocks(PAGE.read_text())
    plan = tutorial_script(page)
    assert len(plan.not_run) <= MAX_NOT_RUN, [f"line {b.line}" for b in plan.not_run]
    assert plan.commands and plan.files and plan.outputs

    folder = tmp_path / "tutorial"
    folder.mkdir()
    (folder.parent / "tutorial.sh").write_text(plan.script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMJOIN_") or k == "STREAMJOIN_PORT_CLAIMS"}
    # A terminal wide enough for `streamjoin status`'s table, and the usual temporary folder
    # (where Spark's log goes, which the page shows).
    env |= {"KAFKA": broker.bootstrap, "COLUMNS": "160", "TMPDIR": "/tmp",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    started = time.monotonic()
    shell = subprocess.Popen(["bash", str(folder.parent / "tutorial.sh")], cwd=folder, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            stdout, _ = shell.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_group(shell.pid)
            stdout, _ = shell.communicate()
            pytest.fail(f"the tutorial ran past {TIMEOUT_S} s:\n{stdout[-3000:]}\n{logs(folder)}")
        elapsed = time.monotonic() - started
        # The last block stops the services; whatever is still running after a moment it left behind.
        deadline = time.monotonic() + 5
        while group_alive(shell.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left_running = group_alive(shell.pid)
    finally:
        stop_group(shell.pid)

    printed = outputs_by_block(stdout)
    ran = [b for b in plan.commands if str(b.index) in printed]
    failed = ran[-1] if ran and "end" not in printed else None
    assert shell.returncode == 0 and "end" in printed, (
        f"tutorial block at line {failed.line if failed else '?'} failed (exit {shell.returncode}):\n"
        f"{failed.text if failed else ''}---\n{stdout[-3000:]}\n{logs(folder)}")
    assert not left_running, "the tutorial's last block left processes running"
    print(f"tutorial ran in {elapsed:.1f} s")

    for index, output in plan.outputs.items():
        mask = output.marker == VARYING
        assert shown(printed[str(index)], mask) == shown(output.text, mask), (
            f"tutorial.md:{output.line}: the page shows\n{output.text}but the command printed\n{printed[str(index)]}")

    job = load(folder / next(b.title for b in plan.files if b.lang == "yaml"))
    records = read_all(broker.bootstrap, job.results_topic, job.partitions, "tutorial-check")
    results = [json.loads(m.value()) for m in records]
    listed = next(o for i, o in plan.outputs.items() if "read_results.py" in page[i].text)
    assert len(results) == len(shown(listed.text, False)), "the results topic holds other results than the page lists"
    assert len({r["result_id"] for r in results}) == len(results)
    assert read_all(broker.bootstrap, job.dead_letter_topic, job.partitions, "tutorial-dead") == []
    assert plan.examples
    for example in plan.examples:
        check_example(example, results)


def logs(folder: Path) -> str:
    """The tail of every log the tutorial's services wrote, for a failure's message."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(folder.glob("*.log")))
