# Generated from notebooks/13a_structured_server.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import asyncio
import re
from dataclasses import dataclass, field

from fastapi import Request

from rosellm_edu.entrypoints.openai.errors import OpenAIError
from rosellm_edu.entrypoints.openai.serving_engine import add_requests
from rosellm_edu.sampling_params import SamplingParams, StructuredOutputsParams


# notebooks/13a_structured_server.ipynb, cell 11
@dataclass
class Constraint:
    """What a request asks its answer to follow (chapter 13's StructuredOutputsParams), and the field that asked."""
    params: StructuredOutputsParams
    field: str                           # named in a 400: "response_format.json_schema.schema"
    parts: list[tuple[str, StructuredOutputsParams]] = field(default_factory=list)   # to blame one tool of several


# notebooks/13a_structured_server.ipynb, cell 11
def constraint(name: str, kwargs: dict) -> Constraint:
    """One field's constraint; what StructuredOutputsParams refuses is a 400 naming the field."""
    unknown = sorted(set(kwargs) - set(StructuredOutputsParams.__dataclass_fields__))
    if unknown:
        raise OpenAIError(400, f"{name}.{unknown[0]}: not supported by this server", f"{name}.{unknown[0]}")
    try:
        params = StructuredOutputsParams(**kwargs)
    except ValueError as e:
        raise OpenAIError(400, f"{name}: {e}", name) from None
    return Constraint(params, f"{name}.{params.kind}" if name == "structured_outputs" else name)


# notebooks/13a_structured_server.ipynb, cell 11
def request_constraint(body, more: list[Constraint] = ()) -> Constraint | None:
    """The request's one constraint (from its fields, and `more`: the tools'), or None; two are a 400."""
    found = [constraint(name, kwargs) for name, kwargs in body.constraint_fields()] + list(more)
    if len(found) > 1:
        raise OpenAIError(400, f"{found[1].field}: a request takes one constraint on its output, and "
                          f"{found[0].field} gives one already", found[1].field)
    return found[0] if found else None


# notebooks/13a_structured_server.ipynb, cell 14
ENGINE_REFUSAL = re.compile(r"SamplingParams\.structured_outputs\.\w+(?P<why>(?:: | is ).*)", re.S)   # chapter 13's


# notebooks/13a_structured_server.ipynb, cell 14
def constrained(params: SamplingParams, constraint: Constraint | None) -> SamplingParams:
    params.structured_outputs = None if constraint is None else constraint.params
    return params


# notebooks/13a_structured_server.ipynb, cell 14
async def add_constrained(raw: Request, request_id: str, prompts, params: list[SamplingParams], priority: int,
                          constraint: Constraint | None):
    """add_requests (chapter 07), with the engine's refusal of a grammar said in the words of the request."""
    if constraint is not None:   # the grammar library loads once, here, not on the engine's thread (seconds)
        await asyncio.to_thread(lambda: raw.app.state.engine.engine.structured.backend)
    try:
        return await add_requests(raw, request_id, prompts, params, priority)
    except OpenAIError as e:
        refusal = ENGINE_REFUSAL.match(str(e))
        if constraint is None or refusal is None:
            raise
        name = blame(raw.app.state.engine.engine, constraint)
        raise OpenAIError(400, name + refusal["why"], name) from None


# notebooks/13a_structured_server.ipynb, cell 14
def blame(engine, constraint: Constraint) -> str:
    """The field to name: the first part the backend refuses on its own (one tool's schema), else the whole."""
    for name, part in constraint.parts:
        try:
            engine.structured.backend.parse(part)     # parsing only: quick, and the backend is loaded by now
        except ValueError:
            return name
    return constraint.field
