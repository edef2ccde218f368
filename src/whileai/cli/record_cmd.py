"""`wai record --upstream URL`: record OpenAI-API traffic as training traces; `wai record reward` scores one;
`wai record export` writes the rows `wai train --rows` reads. docs/record.md."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from whileai.cli.options import add_address, add_body_limit, add_token, check_port, positive, serving_token
from whileai.errors import ConfigError, WhileaiError
from whileai.record.requests import Limits

DEFAULT_PORT = 8400
DEFAULT_DATA = Path("wai-record")


def register(subparsers: Any) -> None:
    record = subparsers.add_parser(
        "record", help="record OpenAI-API traffic as traces; score them late; export rows to train on",
        description="An OpenAI-compatible proxy in front of --upstream: it asks the upstream for token ids and "
                    "log-probabilities, records each exchange in SQLite under --data-dir, answers the client as the "
                    "upstream would, and returns the trace id in the x-whileai-trace-id header. Subcommands: reward, "
                    "export.")
    record.add_argument("--upstream", default=None, help="the OpenAI-compatible server to forward to, e.g. "
                                                         "http://127.0.0.1:8300 (required to record)")
    add_address(record, DEFAULT_PORT)
    record.add_argument("--data-dir", type=Path, default=DEFAULT_DATA,
                        help=f"folder for record.db, the traces (default ./{DEFAULT_DATA})")
    record.add_argument("--upstream-logprobs", choices=("processed_logprobs", "raw_logprobs"), default=None,
                        help="what the upstream's log-probabilities are when it does not say so in a header: "
                             "processed_logprobs or raw_logprobs (default: raw_logprobs, vLLM's default)")
    add_token(record, "record")
    record.add_argument("--upstream-key", default=None, metavar="K",
                        help="the bearer token sent to --upstream (default: the recorder's own token; with "
                             "--no-token, the client's Authorization header as it came)")
    add_body_limit(record, Limits.max_body_mb)
    record.set_defaults(func=cmd_record)
    sub = record.add_subparsers(dest="record_command", metavar="SUBCOMMAND",
                                help="reward (score a trace) or export (write rows); none: record")
    reward = sub.add_parser("reward", help="attach a late score to a trace",
                            description="Score a recorded trace, through a running recorder (--url) or straight "
                                        "into its data folder (--data-dir).")
    reward.add_argument("trace_id", metavar="TRACE_ID", help="the id from the x-whileai-trace-id header")
    reward.add_argument("reward", metavar="REWARD", type=float, help="the score, a finite number")
    reward.add_argument("--url", default=None, help="a running recorder, e.g. http://127.0.0.1:8400")
    reward.add_argument("--data-dir", type=Path, default=None, dest="reward_data",
                        help="the recorder's data folder (when it is not running)")
    reward.add_argument("--replace", action="store_true", help="replace a score the trace already has")
    reward.add_argument("--token", default=None, dest="reward_token", metavar="T",
                        help="with --url: the recorder's token (default $WAI_TOKEN)")
    reward.set_defaults(func=cmd_reward)
    export = sub.add_parser("export", help="write the scored traces as rows for `wai train --rows`",
                            description="Write every scored, trainable trace as one line of the library's rows; "
                                        "unscored traces are left out and counted, untrainable ones refused with "
                                        "the reason.")
    export.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    export.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, dest="export_data",
                        help=f"the recorder's data folder (default ./{DEFAULT_DATA})")
    export.add_argument("--since", default=None, help="only traces begun at or after this time (ISO 8601, "
                                                      "e.g. 2026-12-01T16:00)")
    export.add_argument("--model", default=None, help="only traces of this model (as the upstream named it)")
    export.set_defaults(func=cmd_export)


def _data(path: Path) -> Path:
    if not (path / "record.db").is_file():
        raise ConfigError(f"{path}: no recorder data here (no record.db). Fix: give the --data-dir `wai record` "
                          "was started with")
    return path


def cmd_record(args: argparse.Namespace) -> int:
    import uvicorn

    from whileai.cli.serve_cmd import _check_free
    from whileai.record.proxy import RecordConfig, create_record_app

    if not args.upstream or not args.upstream.startswith(("http://", "https://")):
        raise ConfigError(f"--upstream {args.upstream!r}: give the OpenAI-compatible server's URL, e.g. "
                          "--upstream http://127.0.0.1:8300 (`wai policy MODEL` starts one)")
    check_port(args.port)
    positive(max_body_mb=args.max_body_mb)
    token = serving_token(args, "record")
    _check_free(args.host, args.port)
    config = RecordConfig(upstream=args.upstream, data_dir=args.data_dir, logprobs_mode=args.upstream_logprobs,
                          token=token, upstream_key=args.upstream_key or token,
                          limits=Limits(max_body_mb=args.max_body_mb))
    app = create_record_app(config)
    print(f"wai record: http://{args.host}:{args.port}/v1 -> {args.upstream}, traces in "
          f"{args.data_dir / 'record.db'}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def cmd_reward(args: argparse.Namespace) -> int:
    from whileai.record.rewards import check_reward, score
    from whileai.record.store import AlreadyScored, RecordStore, UnknownTrace

    if (args.url is None) == (args.reward_data is None):
        raise ConfigError("give one of --url (a running recorder) or --data-dir (its data folder)")
    checked = check_reward({"trace_id": args.trace_id, "reward": args.reward, "replace": args.replace},
                           fix="Fix the command's arguments and run it again")
    if isinstance(checked, str):
        raise ConfigError(checked)
    if args.url is not None:
        try:
            print(score(args.url, args.trace_id, args.reward, args.replace, token=args.reward_token))
        except WhileaiError as err:  # the recorder's wire words, said as this command's flags
            raise ConfigError(str(err).replace('send "replace": true', "add --replace")) from None
        return 0
    store = RecordStore(_data(args.reward_data))
    try:
        replaced = store.score(*checked)
    except UnknownTrace:
        raise ConfigError(f"no trace {args.trace_id!r} in {args.reward_data}") from None
    except AlreadyScored as err:
        raise ConfigError(f"trace {args.trace_id!r} is already scored ({err.reward:g}); add --replace") from None
    finally:
        store.close()
    print(f"scored {args.trace_id}: {args.reward:g}" + (f" (replaced {replaced:g})" if replaced is not None else ""))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from whileai.record.export import export

    since = None
    if args.since is not None:
        try:
            since = datetime.fromisoformat(args.since).timestamp()
        except ValueError:
            raise ConfigError(f"--since {args.since!r} is not a time: write ISO 8601, e.g. 2026-12-01T16:00") from None
    print(export(_data(args.export_data), args.out, since, args.model))
    return 0


if __name__ == "__main__":
    from whileai.cli import main

    sys.exit(main(["record", *sys.argv[1:]]))
