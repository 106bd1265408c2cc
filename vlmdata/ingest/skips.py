"""How much of a run was skipped, and whether that is too much: what `--max-skip-fraction` checks.

`vlmdata shard`, `vlmdata index` and `vlmdata retokenize` count every skipped row or sample by
reason, with the first example of each (`merge_skips`). `SkipSummary` reads those counts back
from a run's stats; `check_skips` then logs a warning from `WARN_FRACTION` skipped and raises
`TooManySkipsError` (after the run wrote everything it could) above the caller's
`max_skip_fraction`. Rows skipped because they are already in a `--dedup-against` dataset were
asked to be left out: they are reported but never count towards the fraction.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from vlmdata.errors import ConfigError, Skip, TooManySkipsError

__all__ = ["DEFAULT_MAX_SKIP_FRACTION", "WARN_FRACTION", "SkipSummary", "check_skip_fraction", "check_skips"]

log = logging.getLogger(__name__)

DEFAULT_MAX_SKIP_FRACTION = 0.5     # the command line's default; the Python API's is 1.0 (never raise)
WARN_FRACTION = 0.01                # a warning from 1 % skipped
TOP_REASONS = 3                     # reasons named in the summary line
DETAIL_CHARS = 160                  # of each example's detail in the summary line
ASKED_FOR = frozenset({Skip.DUPLICATE_IN_DATASET})   # skips the caller asked for (--dedup-against)


def check_skip_fraction(value: float) -> float:
    """`value` if it is a fraction in [0, 1]; ConfigError otherwise."""
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"--max-skip-fraction must be between 0 and 1 (1 disables the check), got {value}")
    return float(value)


def describe_example(example: dict) -> str:
    """One skip example (shard time: id, row; index time: shard, id; retokenize: shard, key) as text."""
    parts = []
    name = example.get("id", example.get("key"))
    if name is not None:
        parts.append(repr(str(name)))
    if "row" in example:
        parts.append(f"row {example['row']}")
    if "shard" in example:
        parts.append(f"in {example['shard']}")
    detail = str(example.get("detail", ""))
    if len(detail) > DETAIL_CHARS:
        detail = detail[:DETAIL_CHARS] + "..."
    return f"{' '.join(parts) or '?'}: {detail}"


@dataclass(frozen=True)
class SkipSummary:
    """What a run skipped: `rows` looked at, counts by reason and one example of each."""

    rows: int
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, dict] = field(default_factory=dict)
    unit: str = "input rows"

    @classmethod
    def from_stats(cls, stats: dict, unit: str = "input rows") -> SkipSummary:
        """From a manifest's stats (`input_rows`, `skipped`, `examples`) or any dict of that shape."""
        return cls(int(stats.get("input_rows", 0)), dict(stats.get("skipped", {})), dict(stats.get("examples", {})),
                   unit)

    @property
    def counted(self) -> int:
        """Skips that count towards the fraction (all but those asked for, see ASKED_FOR)."""
        return sum(n for reason, n in self.skipped.items() if reason not in ASKED_FOR)

    @property
    def fraction(self) -> float:
        """Counted skips over the rows looked at (0 for an empty run; at most 1)."""
        return self.counted / max(self.rows, self.counted) if self.counted else 0.0

    def top(self, n: int = TOP_REASONS) -> list[tuple[str, int]]:
        """The `n` most frequent reasons (ties by name)."""
        return sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def describe(self) -> str:
        """'20 of 21 input rows skipped (95.2 %): missing_file=20 (e.g. 'id' row 3: detail), ...'."""
        reasons = []
        for reason, count in self.top():
            ex = self.examples.get(reason)
            reasons.append(f"{reason}={count}" + (f" (e.g. {describe_example(ex)})" if ex else ""))
        more = len(self.skipped) - len(reasons)
        tail = f"; {more} more reason{'s' * (more > 1)} in manifest.json" if more > 0 else ""
        return (f"{self.counted} of {self.rows} {self.unit} skipped ({100 * self.fraction:.1f} %): "
                f"{'; '.join(reasons)}{tail}")


def check_skips(summary: SkipSummary, max_skip_fraction: float, result: object) -> None:
    """Raise TooManySkipsError (carrying `result`) above `max_skip_fraction`; else log a warning from
    WARN_FRACTION skipped. Called once the run's output is written."""
    limit = check_skip_fraction(max_skip_fraction)
    if summary.fraction > limit:
        raise TooManySkipsError(f"{summary.describe()}; more than --max-skip-fraction {limit:g} (the good rows "
                                "are written; fix the inputs or raise the limit)", summary, result)
    if summary.fraction >= WARN_FRACTION:
        log.warning("%s", summary.describe())
