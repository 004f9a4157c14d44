"""`polydl db`: list, show, export, import and merge the performance database."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from polydl.errors import PolyDLError
from polydl.schedules.schedule import Schedule
from polydl.tuning.database import PerfDatabase, Summary
from polydl.tuning.records import STATUSES, Trial


def add_db_command(sub: argparse._SubParsersAction) -> None:
    """Register `db` and its subcommands on the command line's subparsers."""
    db = sub.add_parser("db", help="list, show, export, import or merge the tuning database")
    actions = db.add_subparsers(dest="action", required=True)

    def action(name: str, help: str, reads_system: bool) -> argparse.ArgumentParser:
        c = actions.add_parser(name, help=help)
        c.add_argument("--db", metavar="FILE", help="the user's database (default: "
                       "POLYDL_TUNING_DB, else tuning.sqlite in the cache)")
        if reads_system:
            c.add_argument("--system", metavar="FILE", help="the read-only system database "
                           "(default: POLYDL_SYSTEM_DB, else the one shipped with polydl)")
        return c

    c = action("list", "one line per problem and target: trials, best time", True)
    c.set_defaults(func=cmd_list)
    c = action("show", "every trial of one problem, fastest first", True)
    c.add_argument("key", help="the problem's key, or enough of its start to name one")
    c.set_defaults(func=cmd_show)
    c = action("export", "the trials as JSON lines", True)
    c.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    c.add_argument("--include-system", action="store_true",
                   help="the system database's trials too")
    c.set_defaults(func=cmd_export)
    c = action("import", "add the trials of a JSON-lines file ('-': stdin)", False)
    c.add_argument("file", help="a JSON-lines file of trials, as `polydl db export` writes ('-': stdin)")
    c.set_defaults(func=cmd_import)
    c = action("merge", "add the trials of another database file", False)
    c.add_argument("other", metavar="OTHER.sqlite", help="the database whose trials to add")
    c.set_defaults(func=cmd_merge)


def _open(args: argparse.Namespace) -> PerfDatabase:
    system = getattr(args, "system", None)
    return PerfDatabase(args.db, system=system if system else True)


def cmd_list(args: argparse.Namespace) -> int:
    db = _open(args)
    entries = db.summary()
    if not entries:
        print(f"no trials in {db.path}" + (f" or {db.system}" if db.system else ""))
        return 0
    for e in entries:
        counts = ", ".join(f"{n} {status}" for status, n in e.counts)
        print(f"{e.problem.key[:12]}  {e.problem.describe():40s} {target_label(e.target_key):18s} "
              f"{counts:34s} {_best(e)}")
    return 0


def _best(entry: Summary) -> str:
    best = entry.best
    if best is None or best.seconds is None:
        return "best -"
    text = f"best {best.seconds * 1e3:.3f} ms"
    flops = best.features.get("flops")
    if flops:
        text += f" {flops / best.seconds / 1e9:.1f} GFLOP/s"
    return f"{text} ({best.origin})"


def cmd_show(args: argparse.Namespace) -> int:
    db = _open(args)
    keys = sorted({e.problem.key: e.problem for e in db.summary()}.items())
    matches = [(key, problem) for key, problem in keys if key.startswith(args.key)]
    if len(matches) != 1:
        where = f"{db.path}" + (f" and {db.system}" if db.system else "")
        if not matches:
            raise PolyDLError(f"no problem key starts with '{args.key}' in {where} "
                              f"({len(keys)} problems; `polydl db list` shows them)")
        raise PolyDLError(f"'{args.key}' starts {len(matches)} problem keys in {where}; "
                          "give more of the key")
    key, problem = matches[0]
    print(f"problem  {problem.describe()}  {key}")
    trials = sorted(db.trials(problem_key=key),
                    key=lambda t: (t.seconds is None, t.relative or math.inf, t.seconds or 0.0,
                                   STATUSES.index(t.status)))
    for t in trials:
        ms = f"{t.seconds * 1e3:10.3f} ms" if t.seconds is not None else f"{'-':>10s}   "
        # the time against the reference schedule timed beside it
        ratio = f"{t.relative:6.3f}x ref" if t.relative is not None else f"{'':10s}"
        line = (f"{t.status:14s} {ms} {ratio} x{len(t.samples):<3d} {target_label(t.target_key)} "
                f"[{t.origin}]  {_schedule_text(t)}")
        print(line + (f"  -- {t.message}" if t.message else ""))
    return 0


def _schedule_text(trial: Trial) -> str:
    try:
        return Schedule.from_dict(dict(trial.schedule)).describe()
    except (KeyError, TypeError, ValueError):  # written by another polydl version
        return json.dumps(dict(trial.schedule), sort_keys=True)


def target_label(target_key: str) -> str:
    """A short name for a target key: its ISA and cores."""
    try:
        data = json.loads(target_key)
        return f"{data['isa']} {data['cores']} cores"
    except (ValueError, TypeError, KeyError):
        return target_key[:18]


def cmd_export(args: argparse.Namespace) -> int:
    db = _open(args)
    if args.output is None:
        db.export(sys.stdout, include_system=args.include_system)
        return 0
    with open(args.output, "w") as stream:
        count = db.export(stream, include_system=args.include_system)
    print(f"exported {count} trials to {args.output}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    db = PerfDatabase(args.db, system=False)
    if args.file == "-":
        lines = sys.stdin.readlines()
    else:
        lines = Path(args.file).read_text().splitlines()
    given = sum(1 for line in lines if line.strip())
    added = db.import_lines(lines, source=args.file)
    skipped = f" ({given - added} were there already)" if added < given else ""
    print(f"added {added} of {given} trials to {db.path}{skipped}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    db = PerfDatabase(args.db, system=False)
    added = db.merge(args.other)
    print(f"added {added} trials from {args.other} to {db.path}")
    return 0
