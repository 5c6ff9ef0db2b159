"""The value types the config's sections share: ranges, and the safe characters of anything that
reaches an sbatch script (orchestrator/plan/config/schema.py and its section modules use them)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from orchestrator.contract.values import SLURM_NODE_NAME

# Values that end up on #SBATCH lines or in `export` lines of a shell script. They are also
# quoted when rendered; the pattern makes a hostile value an error before any rendering.
SAFE_WORD = r"^[A-Za-z0-9][A-Za-z0-9_.+\-]*$"
SAFE_PATH = r"^[A-Za-z0-9_./+\-~][A-Za-z0-9_./+\-=:@]*$"

SafeWord = Annotated[str, StringConstraints(pattern=SAFE_WORD, max_length=128)]
SafePath = Annotated[str, StringConstraints(pattern=SAFE_PATH, max_length=1024)]
NodeName = Annotated[str, StringConstraints(pattern=SLURM_NODE_NAME, max_length=128)]
PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Probability = Annotated[float, Field(ge=0, lt=1)]
# numpy's RandomState/SeedSequence take seeds in [0, 2**32-1]: anything else crashes the trainer
# after submission instead of failing here.
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
# Polling and beating faster than this only loads the login node and the scheduler (poll_seconds
# runs `squeue --json` over the whole cluster).
Seconds = Annotated[float, Field(ge=0.1)]
TimeoutSeconds = Annotated[float, Field(ge=1.0)]


# One word of a command line (no control characters: no newline can end it early).
ArgvItem = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$")]


def program_absolute_or_on_path(command: list[str] | None) -> list[str] | None:
    """A command's program is found the same way on every node: by its absolute path, or on PATH
    (a relative path would depend on the folder the job starts in)."""
    if command and "/" in command[0] and not command[0].startswith("/"):
        raise ValueError(f"command[0] = {command[0]!r}: give an absolute path or a bare name found on PATH")
    return command
