"""Run by vLLM's own interpreter (`otel-rl serve --vllm-arg`): parse a server's arguments as vLLM's API
server does, and run its checks made before anything loads; nothing starts. Prints the parallel sizes as
JSON; on a rejected flag, exits 2 with vLLM's message (which names it) on stderr."""

import json
import sys

from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = make_arg_parser(FlexibleArgumentParser(prog="vllm"))
args = parser.parse_args(sys.argv[1:])  # exits 2, "vllm: error: ..." for an unknown flag or a bad value
try:
    validate_parsed_serve_args(args)
except (TypeError, ValueError) as error:
    sys.exit(f"vllm: error: {error}")
sizes = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
print(json.dumps({size: getattr(args, size, 1) for size in sizes}))
