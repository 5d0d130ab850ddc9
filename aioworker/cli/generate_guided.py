"""`aioworker generate`'s guided-decoding options: what every output must match, and the
GuidedParams they make. A schema or grammar is given inline or as @FILE."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from aioworker.core.guided import GuidedParams


def add_guided_arguments(parser: argparse.ArgumentParser) -> None:
    guided = parser.add_argument_group(
        "guided decoding (at most one of the first five): every output matches it"
    )
    add = guided.add_argument
    add("--json-schema", metavar="JSON|@FILE",
        help="a JSON schema the output follows: inline, or @schema.json")  # fmt: skip
    add("--json-object", action="store_true", help="the output is a JSON object")
    add("--regex", metavar="REGEX", help="a regular expression the whole output matches")
    add("--grammar", metavar="EBNF|@FILE",
        help='an EBNF (GBNF) grammar rooted at "root ::= ...": inline, or @grammar.ebnf')  # fmt: skip
    add("--choice", action="append", metavar="TEXT",
        help="the output is exactly one of these (repeatable)")  # fmt: skip
    add("--compact-json", action="store_true",
        help="JSON without optional whitespace (shorter outputs)")  # fmt: skip


def guided_params(args: argparse.Namespace) -> GuidedParams | None:
    """None where no guidance was asked for; raises ValueError naming the option to fix."""
    given = {
        "--json-schema": args.json_schema,
        "--json-object": args.json_object or None,
        "--regex": args.regex,
        "--grammar": args.grammar,
        "--choice": args.choice,
    }
    chosen = [option for option, value in given.items() if value is not None]
    if not chosen:
        if args.compact_json:
            raise ValueError("--compact-json applies to --json-schema or --json-object; add one")
        return None
    if len(chosen) > 1:
        raise ValueError(f"give one of {', '.join(chosen)}, not {len(chosen)}")
    schema = None
    if args.json_schema is not None:
        text = _inline_or_file("--json-schema", args.json_schema)
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--json-schema is not valid JSON ({exc})") from None
    grammar = None if args.grammar is None else _inline_or_file("--grammar", args.grammar)
    return GuidedParams(
        json_schema=schema,
        json_object=args.json_object,
        regex=args.regex,
        grammar=grammar,
        choice=None if args.choice is None else tuple(args.choice),
        compact_json=args.compact_json,
    )


def _inline_or_file(option: str, value: str) -> str:
    if not value.startswith("@"):
        return value
    path = Path(value[1:])
    try:
        return path.read_text()
    except OSError as exc:
        raise ValueError(f"{option} names {path}, which cannot be read: {exc.strerror}") from None
