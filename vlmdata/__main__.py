"""`python -m vlmdata ...`: the command line."""
import sys

from vlmdata.cli.entry import main

sys.exit(main())
