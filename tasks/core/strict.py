"""The base of every typed parameter section (its own module so trainer/config.py can use it
without importing the pipeline's config, which imports the trainer's section)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # strict: "600" is not an int and `true` is not a number; YAML gives real types, so a quoted
    # number in params.yaml is a mistake worth a message, not a silent coercion.
    # no inf (nor NaN) in any float: a blend weight of .inf passed, to fail mid-stage after its last completion went
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
