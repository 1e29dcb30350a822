"""The `metalgen` command: one subcommand per module in this package.

This package is the only place that writes to the terminal. User errors (MetalgenError) print
one line and exit 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ..errors import MetalgenError
from . import bench as bench_cmd
from . import chat as chat_cmd
from . import generate as generate_cmd
from . import omni as omni_cmd
from . import serve as serve_cmd
from . import tts as tts_cmd

SUBCOMMANDS = {"generate": generate_cmd, "chat": chat_cmd, "serve": serve_cmd, "bench": bench_cmd, "tts": tts_cmd,
               "omni": omni_cmd}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metalgen",
        description="Run Qwen-family decoders on MLX (Metal, CUDA or CPU).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in SUBCOMMANDS.items():
        module.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return SUBCOMMANDS[args.command].run(args) or 0
    except MetalgenError as e:
        print(f"metalgen: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as Unix tools do.
        sys.stderr.close()
        return 1
