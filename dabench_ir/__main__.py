"""`python -m dabench_ir` is the `dabench-ir` command."""

import sys

from dabench_ir.cli import main

sys.exit(main())
