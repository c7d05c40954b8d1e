"""Subcommands of the `dabench-ir` CLI; each module exposes `register(subparsers)`."""
