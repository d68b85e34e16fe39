"""The base of every typed parameter section (its own module so trainer/config.py can use it
without importing the pipeline's config, which imports the trainer's section)."""
from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class Strict(BaseModel):
    # strict: "600" is not an int and `true` is not a number; YAML gives real types, so a quoted
    # number in params.yaml is a mistake worth a message, not a silent coercion.
    # no inf (nor NaN) in any float: a blend weight of .inf passed, to fail mid-stage after its last completion went
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _expanded(v: str) -> str:
    """`~` and `$VAR` as a shell would read them: taken literally, `data_dir: ~/data` wrote into a folder
    named `~` inside the project, and a tokenizer under `$HOME` was "not found". `$$` is a literal `$`; so is
    one in a path that exists as written (`price$list.jsonl`)."""
    if not v:
        return v
    parts = [os.path.expandvars(part) for part in os.path.expanduser(v).split("$$")]
    out = "$".join(parts)
    unset = [m[1] for part in parts for m in re.finditer(r"\$\{?(\w+)", part)]
    if unset and not os.path.lexists(v.replace("$$", "$")):
        raise ValueError(f"names ${unset[0]}, which is not set in this environment (a literal $ is written $$)")
    return v.replace("$$", "$") if unset else out


# a file or folder: `~` and environment variables expanded as the shell would
PathText = Annotated[str, AfterValidator(_expanded)]
