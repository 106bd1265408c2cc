"""`python -m vlmdata ...`: the command line."""
import sys

from vlmdata.cli import main

sys.exit(main())
