"""The `vlmdata` command line (`vlmdata --help`); one module per subcommand."""
from vlmdata._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "build_parser": "entry", "main": "entry",
    "parse_storage_options": "options", "parse_size": "tune", "parse_targets": "dashboard",
})
