"""docs/reference/job-file.md: every field of `JobSettings` and of the models it holds, with its type,
default, constraints, environment variable and description, read from the pydantic models."""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from refdocs.text import GENERATED, human, md, number, sentence, slug, value_text


@dataclass(frozen=True)
class Setting:
    """One job-file field: its dotted path (`join.type`, `streams[].name`, `topics.<role>.retention_ms`)
    and what its entry says."""

    path: str
    type: str
    default: str | None  # None: required
    constraints: str
    env: str
    description: str
    aliases: tuple[str, ...] = ()
    model: bool = False  # a section or nested model: its fields follow


def strip_optional(tp: Any) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, UnionType) and NoneType in args:
        rest = [a for a in args if a is not NoneType]
        return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
    return tp


def model_of(tp: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds, and whether it holds a list of them."""
    tp = strip_optional(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp, False
    if typing.get_origin(tp) is list:
        inner = typing.get_args(tp)[0]
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner, True
    return None, False


def type_text(tp: Any) -> str:
    """A type as a reader of the job file sees it: `int`, `float | None`, `"inner" | "left"`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is NoneType:
        return "None"
    if tp is Any:
        return "any"
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, UnionType):
        return " | ".join(type_text(a) for a in sorted(args, key=lambda a: a is NoneType))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_text(a) for a in args)}]"
    if isinstance(tp, type) and issubclass(tp, SecretStr):
        return "secret"
    if isinstance(tp, type) and issubclass(tp, Path):
        return "path"
    return tp.__name__ if isinstance(tp, type) else str(tp)


_BOUNDS = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))


def constraints_text(metadata: Iterable[Any], tp: Any = None) -> str:
    """The constraints pydantic declares (bounds, lengths, patterns), on the field or inside its type."""
    out = []
    for m in metadata:
        out += [f"{sign} {number(getattr(m, attr))}" for attr, sign in _BOUNDS if getattr(m, attr, None) is not None]
        if getattr(m, "min_length", None) is not None:
            out.append(f"at least {m.min_length} items")
        if getattr(m, "max_length", None) is not None:
            out.append(f"at most {m.max_length} items")
        if getattr(m, "pattern", None) is not None:
            out.append(f"matches `{m.pattern}`")
    for arg in typing.get_args(tp) if tp is not None else ():
        if typing.get_origin(arg) is typing.Annotated:
            inner = [x for a in typing.get_args(arg)[1:] for x in (a.metadata if isinstance(a, FieldInfo) else [a])]
            if (text := constraints_text(inner)):
                out.append(f"{type_text(arg)} {text}")
    return ", ".join(out)


def _shape(tp: Any) -> tuple[str, int]:
    """scalar, list, dict (with its nesting depth) or model."""
    tp = strip_optional(tp)
    origin = typing.get_origin(tp)
    if origin is dict:
        inner = _shape(typing.get_args(tp)[1])
        return "dict", 1 + (inner[1] if inner[0] == "dict" else 0)
    if origin is list:
        return "list", 0
    return ("model", 0) if model_of(tp)[0] else ("scalar", 0)


def env_text(parts: list[str], tp: Any) -> str:
    """The environment variable that sets the field at `parts`, as settings/loading.py reads them:
    `STREAMJOIN_<SECTION>__<FIELD>`, nested with `__`; the kafka section by settings/kafka.py."""
    from streamjoin.settings import kafka
    from streamjoin.settings.loading import _EnvOnly

    if parts[0] == "kafka":
        return f"`{kafka.ENV_PREFIX}<PROPERTY>`, `_` standing for `.`"
    if parts[0] not in _EnvOnly.model_fields:
        return "none: set in the job file only"
    if any(p.endswith("[]") for p in parts):
        return "none: inside a list, set in the job file only"
    shape, depth = _shape(tp)
    if shape == "list":
        return "none: lists are set in the job file only"
    name = "STREAMJOIN_" + "__".join(p.upper() for p in parts)
    if shape == "model":
        return f"`{name}__<FIELD>`"
    if shape == "dict":
        return f"`{name}{'__<KEY>' * depth}` (keys are read lower-case)"
    return f"`{name}`"


def _placeholder(parent: type[BaseModel], sub: type[BaseModel]) -> str | None:
    """`<role>` when several fields of `parent` hold the same model (the topic roles): documented once."""
    holders = [n for n, f in parent.model_fields.items() if model_of(f.annotation) == (sub, False)]
    return "<role>" if len(holders) > 1 else None


def settings(model: type[BaseModel] | None = None, prefix: str = "", parts: list[str] | None = None) -> list[Setting]:
    """Every field of `model` (default: JobSettings) and of the models it holds, in declaration order."""
    if model is None:
        from streamjoin.settings import JobSettings
        model = JobSettings
    out: list[Setting] = []
    shared: dict[type[BaseModel], str] = {}  # documented once, after the fields that hold them
    for name, f in model.model_fields.items():
        path, here = prefix + name, (parts or []) + [name]
        sub, many = model_of(f.annotation)
        aliases = tuple(a for a in getattr(f.validation_alias, "choices", ()) if a != name)
        if f.is_required():
            default = None
        elif sub is not None and not many:
            default = ""
        else:
            v = f.get_default(call_default_factory=True)
            default = value_text(v) + human(name, v)
        out.append(Setting(path, type_text(f.annotation), default, constraints_text(f.metadata, f.annotation),
                           env_text(here, f.annotation), f.description or "", aliases, model=sub is not None))
        if sub is None:
            continue
        key = _placeholder(model, sub)
        if key is not None:
            shared[sub] = key
        else:
            out += settings(sub, path + ("[]." if many else "."), here[:-1] + [name + ("[]" if many else "")])
    for sub, key in shared.items():
        out += settings(sub, f"{prefix}{key}.", (parts or []) + [key])
    return out


EXAMPLE_JOB = """\
job: orders-payments            # names the job's internal topics and its consumer group
bootstrap: kafka:9092
streams:
  - name: orders
    topic: shop.orders
    fields: {order_id: int, ts: int, amount: float}
    time_field: ts               # event time, epoch milliseconds
    key_fields: [order_id]
    window: {range_ms: 60000}    # a payment joins an order up to a minute apart
  - name: payments
    topic: shop.payments
    fields: {order_id: int, ts: int, method: str}
    time_field: ts
    key_fields: [order_id]
    window: {range_ms: 60000}
join:
  allowed_lateness_ms: 2000
coordinator:
  expected_workers: 2
"""

JOB_FILE_INTRO = """\
# Job file

A job file is a YAML file that describes one join job: the streams it reads, how it joins them,
and how its services run. Every command takes it with `--job FILE`; without one, commands use the
equi-join demo job (`streamjoin/jobs/equijoin.yaml`). A job file is checked as a whole when a
command loads it: an unknown key, a wrong type or an inconsistent combination (say an outer join in
ring mode) stops the command with exit code 2 and a message naming the field.

## A minimal job file

Two streams joined on `order_id` within a minute of each other, in hash mode (the default). Every
section left out takes the defaults listed below.

```yaml
{example}```

## Where settings come from

Each setting is read from, in increasing precedence:

1. the job file;
2. the environment: `STREAMJOIN_<FIELD>` for a top-level field, `STREAMJOIN_<SECTION>__<FIELD>` for
   a field of a section, one more `__` per level below that (`STREAMJOIN_WORKER__SPILL__MODE`), and
   a key of a mapping as one more level (`STREAMJOIN_JOIN__UDFS__<NAME>`, read lower-case). Lists,
   the `streams` and null values are set in the job file only. The `kafka` section has variables
   of its own: `STREAMJOIN_KAFKA__<PROPERTY>`, with `_` standing for `.`
   (`STREAMJOIN_KAFKA__SASL_PASSWORD` sets `sasl.password`);
3. the command's flags (`--bootstrap`, and the few others listed in the
   [command-line reference](cli.md)).

## Sections

| Section | What it holds |
|---|---|
{sections}
"""


def _entry(s: Setting, level: str) -> list[str]:
    lines = [f"{level} `{s.path}` {{#{slug(s.path)}}}", "", sentence(md(s.description), s.type), ""]
    facts = [f"- **Type:** `{s.type}`"]
    if s.default is None:
        facts.append("- **Default:** none, required")
    elif s.default:
        facts.append(f"- **Default:** `{s.default}`")
    if s.constraints:
        facts.append(f"- **Constraints:** {s.constraints}")
    if s.aliases:
        facts.append("- **Also accepted as:** " + ", ".join(f"`{a}`" for a in s.aliases))
    facts.append(f"- **Environment:** {s.env}")
    return lines + facts + [""]


def _topic_roles() -> list[str]:
    """The topic roles' defaults as created (settings/topics.py ROLE_DEFAULTS), one table row each."""
    from streamjoin.settings.topics import ROLES, TopicsSpec

    rows = ["| Role | cleanup.policy | retention.ms | other configs |", "|---|---|---|---|"]
    spec = TopicsSpec()
    for role in ROLES:
        config = dict(spec.for_role(role).config)
        policy, retention = config.pop("cleanup.policy"), config.pop("retention.ms", None)
        retention_text = f"{number(int(retention))}{human('_ms', int(retention))}" if retention else "the cluster's"
        if "delete" not in policy:
            retention_text = "n/a (compacted)"
        other = ", ".join(f"{k} {number(int(v)) if v.isdigit() else v}" for k, v in sorted(config.items())) or "-"
        rows.append(f"| `{role}` | {policy} | {retention_text} | {other} |")
    return rows


def job_file_page(entries: list[Setting] | None = None) -> str:
    """docs/reference/job-file.md."""
    from streamjoin.settings import JobSettings

    entries = settings() if entries is None else entries
    JobSettings(**yaml.safe_load(EXAMPLE_JOB))  # the example stays a valid job
    top = [e for e in entries if "." not in e.path and not e.model]
    sections = [e for e in entries if "." not in e.path and e.model]
    rows = ["| [Top level](#top-level) | " + ", ".join(f"`{e.path}`" for e in top) + " |"]
    rows += [f"| [`{e.path}`](#{slug(e.path)}) | {md(e.description)} |" for e in sections]
    lines = [GENERATED, "", JOB_FILE_INTRO.format(example=EXAMPLE_JOB, sections="\n".join(rows)).rstrip(), ""]
    lines += ["## Top level {#top-level}", "", "The fields that are not sections.", ""]
    for e in top:
        lines += _entry(e, "###")
    for section in sections:
        lines += [f"## `{section.path}{'[]' if section.type.startswith('list[') else ''}` {{#{slug(section.path)}}}",
                  "", sentence(md(section.description), section.type), ""]
        facts = [f"- **Type:** `{section.type}`"]
        if section.constraints:
            facts.append(f"- **Constraints:** {section.constraints}")
        if section.default is None:
            facts.append("- **Required.**")
        lines += facts + [f"- **Environment:** {section.env}", ""]
        if section.path == "topics":
            lines += ["Each role's topics are created with these settings unless the job sets its own:", ""]
            lines += _topic_roles() + [""]
        lines += [x for e in entries if e.path.startswith((section.path + ".", section.path + "[]."))
                  for x in _entry(e, "###")]
    return "\n".join(lines).rstrip() + "\n"


def absent_settings(page: str, entries: list[Setting]) -> list[str]:
    """The settings whose entry `page` lacks."""
    return [e.path for e in entries
            if f"### `{e.path}` " not in page and f"## `{e.path}` " not in page and f"## `{e.path}[]` " not in page]

