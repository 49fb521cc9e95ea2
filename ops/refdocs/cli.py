"""docs/reference/cli.md: every command and sub-command of the typer app `streamjoin.cli:app`, with
its help and every option and argument, read from the click command typer builds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from refdocs.text import GENERATED, md, number, paragraphs, slug, value_text


@dataclass(frozen=True)
class Param:
    """One option or argument: how it is written, its type, default and help."""

    names: str  # `--job`, `--dry-run`, or an argument's metavar (`WORKER_ID`)
    argument: bool
    type: str
    default: str
    help: str


@dataclass(frozen=True)
class Command:
    """A command or a group, by its full path (`streamjoin topics check`)."""

    path: str
    help: str
    usage: str
    params: tuple[Param, ...]
    group: bool


def _bare_type(p: Any) -> str:
    """The parameter's value type: from typer's type descriptor, or from click's parameter type."""
    desc = getattr(p, "type_descriptor", None)
    if desc is not None:
        if getattr(desc, "is_choice", False) and desc.choices:
            return " | ".join(str(getattr(c, "value", c)) for c in desc.choices)
        ann = desc.annotation
        if isinstance(ann, type) and issubclass(ann, Path):
            return "path"
        return ann.__name__ if isinstance(ann, type) else str(ann)
    kind = getattr(p.type, "name", str(p.type)).lower()
    choices = getattr(p.type, "choices", None)
    return " | ".join(map(str, choices)) if choices else {"integer": "int", "text": "str", "boolean": "bool",
                                                         "integer range": "int", "float range": "float"}.get(kind, kind)


def _param_type(p: Any) -> str:
    if getattr(p, "is_flag", False):
        return "flag"
    text = _bare_type(p)
    bounds = [(getattr(p, "min", None), "≥"), (getattr(p, "max", None), "≤")]
    if hasattr(p, "type"):  # click's own parameters (typer before its type descriptors): IntRange, FloatRange
        bounds += [(getattr(p.type, "min", None), "≥"), (getattr(p.type, "max", None), "≤")]
    extra = [f"{sign} {number(v)}" for v, sign in dict.fromkeys(bounds) if v is not None]
    return text + (f" ({', '.join(extra)})" if extra else "")


def _default(p: Any) -> str:
    if p.required:
        return "required"
    v = p.default
    if callable(v) or v is None or v == ():
        return "-"
    if getattr(p, "is_flag", False):
        return "on" if v else "off"
    return f"`{value_text(v).strip(chr(34))}`" if not isinstance(v, (int, float)) else f"`{number(v)}`"


def _names(p: Any) -> str:
    if p.param_type_name == "argument":
        return (p.metavar or p.name).upper()
    return " / ".join(list(p.opts) + list(p.secondary_opts))


def _param(p: Any) -> Param:
    help_text = getattr(p, "help", None) or ""
    if getattr(p, "envvar", None):
        help_text += f" (environment: `{p.envvar}`)"
    return Param(_names(p), p.param_type_name == "argument", _param_type(p), _default(p), help_text)


def commands(root: Any = None, path: str = "streamjoin") -> list[Command]:
    """The root command and everything under it, sorted by path; hidden ones left out."""
    if root is None:
        from typer.main import get_command

        from streamjoin.cli import app
        root = get_command(app)
    params = tuple(_param(p) for p in root.params if not getattr(p, "hidden", False))
    args = " ".join(x.names if x.default == "required" else f"[{x.names}]" for x in params if x.argument)
    group = hasattr(root, "commands")
    usage = f"{path} {'COMMAND' if group else '[OPTIONS]'}{' ' + args if args else ''}"
    out = [Command(path, root.help or "", usage, params, group)]
    for name in sorted(getattr(root, "commands", {})):
        sub = root.commands[name]
        if not getattr(sub, "hidden", False):
            out += commands(sub, f"{path} {name}")
    return out


def _summary(help_text: str) -> str:
    return paragraphs(help_text).split("\n\n")[0].rstrip(".")


CLI_INTRO = """\
# Command line

`streamjoin` is one command for every service and job: it starts the services (broker, worker,
coordinator, merger, query service), runs one-off jobs (topics, sources, verify, the demo, the
benchmarks) and talks to a running job (status, moves, ring and SplitJoin changes, queries).
`streamjoin COMMAND --help` prints what this page lists.

Every command reads the same settings: the [job file](job-file.md) given with `--job` (default:
the equi-join demo job), overlaid by `STREAMJOIN_*` environment variables, overlaid by the
command's flags. Bad settings or flags exit with code 2 and a message naming the field; commands
that check something (`topics check`, `verify`) exit with code 1 when the check fails.

## Commands

| Command | What it does |
|---|---|
"""


def cli_page(cmds: list[Command] | None = None) -> str:
    """docs/reference/cli.md."""
    cmds = commands() if cmds is None else cmds
    lines = [GENERATED, "", CLI_INTRO.rstrip()]
    lines += [f"| [`{c.path}`](#{slug(c.path)}) | {_summary(c.help)} |" for c in cmds[1:]]
    for c in cmds[1:]:
        lines += ["", f"## `{c.path}` {{#{slug(c.path)}}}", "", paragraphs(c.help), "", "```text", c.usage, "```"]
        if c.group:
            subs = [s for s in cmds if s.path.startswith(c.path + " ") and s.path.count(" ") == c.path.count(" ") + 1]
            lines += ["", "Sub-commands: " + ", ".join(f"[`{s.path}`](#{slug(s.path)})" for s in subs) + "."]
        if c.params:
            lines += ["", "| Option | Type | Default | Description |", "|---|---|---|---|"]
            lines += [f"| `{p.names}` | {md(p.type)} | {p.default} | {md(p.help)} |" for p in c.params]
    return "\n".join(lines).rstrip() + "\n"


def absent_commands(page: str, cmds: list[Command]) -> list[str]:
    """The commands, and options of a command, whose entry `page` lacks."""
    missing = []
    sections = {part.split("`", 1)[0]: part for part in page.split("\n## `")[1:]}
    for c in cmds[1:]:
        section = sections.get(c.path)
        if section is None:
            missing.append(c.path)
            continue
        missing += [f"{c.path} {p.names}" for p in c.params if f"\n| `{p.names}` |" not in section]
    return missing
