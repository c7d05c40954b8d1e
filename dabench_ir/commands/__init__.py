"""Subcommands of the `dabench-ir` CLI. Each module exposes ``HELP`` (its line in the command list),
``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args) -> exit code``; `dabench_ir.cli` makes its
parser, named after the module (`flags` is no subcommand: the flags several of them declare alike)."""
