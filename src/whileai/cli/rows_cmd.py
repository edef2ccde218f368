"""`wai report`, `wai route`, `wai select`, `wai compare`: graded rows from the command line.

Each reads a JSONL (or Parquet) file of graded rows, streaming and keeping only the fields it
needs, prints a table a person reads at a glance, or JSON with ``--json``. ``wai select --out``
writes the kept rows to a temporary file beside the target and renames it into place only once
the whole file is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from whileai.errors import WhileaiError
from whileai.routing import PRIVILEGED, route
from whileai.rows.io import THRESHOLD, atomic_write, check_output_path, load_graded, plural, write_selected
from whileai.rows.select import MODES, select_indices, selection_report
from whileai.rows.stats import compare, pass_at

_ROWS_HELP = ("graded rows: a JSONL file, one object per line with task_id and reward (truncated, model "
              "optional), or a .parquet file with those columns")


def register(subparsers: Any) -> None:
    _register_report(subparsers)
    _register_route(subparsers)
    _register_select(subparsers)
    _register_compare(subparsers)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threshold", type=float, default=None,
                        help=f"a row passes when reward >= THRESHOLD; may be left out only when every reward is 0 "
                             f"or 1 (then {THRESHOLD:g}); needed for any other grader (a 0-10 grade, partial credit)")
    parser.add_argument("--json", action="store_true", help="print JSON for machines instead of a table")


def _on_rows(subparsers: Any, name: str, func: Any, help: str, description: str) -> argparse.ArgumentParser:
    """A subcommand over one file of graded rows (its first argument); the caller adds its own flags, then
    ``_common``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=description)
    parser.add_argument("rows", type=Path, help=_ROWS_HELP)
    parser.set_defaults(func=func)
    return parser


def _register_report(subparsers: Any) -> None:
    parser = _on_rows(subparsers, "report", cmd_report, "pass rates, band, split share, truncation and selection",
                      "How good is the model, and which tasks teach anything.")
    parser.add_argument("--k", type=int, default=None,
                        help="also report pass@k (unbiased estimator; k <= rollouts of every task)")
    _common(parser)


def _register_route(subparsers: Any) -> None:
    parser = _on_rows(subparsers, "route", cmd_route, "pick the training method from graded rows",
                      "Ask the rows the pick-a-method questions in order.")
    parser.add_argument("--model", required=True, help="the model you will train (compared with each row's model)")
    parser.add_argument("--teacher-rows", type=Path, default=None,
                        help="a candidate teacher's graded rows on the same held-out tasks, at the student's max_tokens")
    parser.add_argument("--teacher-url", default=None,
                        help="base URL of the teacher's OpenAI-compatible server, for the OPD config")
    parser.add_argument("--privileged", choices=PRIVILEGED, default="reference",
                        help="context OPSD shows its self-teacher when every task fails (default: reference)")
    _common(parser)


def _register_select(subparsers: Any) -> None:
    parser = _on_rows(subparsers, "select", cmd_select, "keep the rows that teach a training mode",
                      "rl: drop unanimous groups; sft: keep passes; dpo: length-matched pairs.")
    parser.add_argument("--mode", choices=MODES, required=True,
                        help="rl: drop all-pass/all-fail tasks; sft: keep untruncated passes; dpo: pass/fail pairs")
    parser.add_argument("--out", type=Path, required=True,
                        help="where to write the kept rows as JSONL (written whole or not at all)")
    _common(parser)


def _register_compare(subparsers: Any) -> None:
    parser = subparsers.add_parser("compare", help="paired per-task delta of pass@1, with a verdict",
                                   description="Treatment against baseline on the tasks both were scored on.")
    parser.add_argument("baseline", type=Path, help="the baseline arm's graded rows (JSONL or .parquet)")
    parser.add_argument("treatment", type=Path, help="the treatment arm's graded rows (JSONL or .parquet)")
    parser.add_argument("--name", default="compare", help="the row's name in the table (e.g. the recipe)")
    parser.add_argument("--baseline-name", default="baseline", help="label of the baseline arm")
    parser.add_argument("--treatment-name", default="treatment", help="label of the treatment arm")
    parser.add_argument("--seeds", type=int, default=None,
                        help="training seeds pooled in each arm (default: count the rows' 'seed' values, 1 if none)")
    _common(parser)
    parser.set_defaults(func=cmd_compare)


# --------------------------------------------------------------------------- commands
def cmd_report(args: argparse.Namespace) -> int:
    graded = load_graded(args.rows)
    report = selection_report(graded, args.threshold)
    extra = pass_at(graded, args.k, args.threshold) if args.k is not None else None
    if args.json:
        out = report.to_dict()
        if extra is not None:
            out[f"pass_at_{args.k}"] = {"value": extra.value, "ci95": list(extra.ci95),
                                        "ci95_fixed": list(extra.ci95_fixed)}
        return _print_json(out)
    print(f"{args.rows}")
    print(report)
    if extra is not None:
        print(f"\n{extra}")
    return 0


def cmd_route(args: argparse.Namespace) -> int:
    graded = load_graded(args.rows)
    teacher = load_graded(args.teacher_rows) if args.teacher_rows else None
    answer = route(graded, args.model, teacher, teacher=args.teacher_url, privileged=args.privileged,
                   threshold=args.threshold)
    return _print_json(answer.to_dict()) if args.json else _print(answer)


def cmd_select(args: argparse.Namespace) -> int:
    check_output_path(args.out)
    graded = load_graded(args.rows, lengths=args.mode == "dpo", lines=True)
    kept, pairs, notes = select_indices(graded, args.mode, args.threshold)
    assert graded.line_R is not None  # load_graded(lines=True) always fills it
    lines = graded.line_R[kept]
    extra: dict[int, dict[str, Any]] = {}
    for n, (chosen, rejected) in enumerate(pairs):
        extra[int(graded.line_R[chosen])] = {"pair": n, "chosen": True}
        extra[int(graded.line_R[rejected])] = {"pair": n, "chosen": False}
    with atomic_write(args.out) as handle:
        written = write_selected(args.rows, lines, handle, extra)
    summary = {"mode": args.mode, "rows": graded.n_rows, "tasks": graded.n_tasks, "written": written,
               "pairs": len(pairs), "out": str(args.out), "notes": notes}
    if args.json:
        return _print_json(summary)
    what = (f"{plural(len(pairs), 'pair')} ({plural(written, 'row')})" if args.mode == "dpo"
            else f"{written} of {plural(graded.n_rows, 'row')}")
    print(f"select --mode {args.mode}: wrote {what} to {args.out}")
    for note in notes:
        print(f"  {note}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    result = compare(args.baseline, args.treatment, threshold=args.threshold, seeds=args.seeds, name=args.name,
                     baseline_name=args.baseline_name, treatment_name=args.treatment_name)
    if args.json:
        return _print_json(result.to_dict())
    print(result)
    print(f"{result.n_tasks} shared tasks; left out: {result.only_baseline} only in the baseline, "
          f"{result.only_treatment} only in the treatment; seeds {result.baseline_seeds} vs {result.treatment_seeds}")
    return 0


def _print(obj: Any) -> int:
    print(obj)
    return 0


def _print_json(obj: Any) -> int:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """These four subcommands alone, as ``wai`` runs them (the full command line is ``whileai.cli.main``)."""
    parser = argparse.ArgumentParser(prog="wai", description="graded rows: report, route, select, compare")
    register(parser.add_subparsers(dest="command", metavar="COMMAND"))
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except WhileaiError as err:
        print(f"wai {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        from whileai.cli import describe_os_error

        print(f"wai {args.command}: {describe_os_error(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
